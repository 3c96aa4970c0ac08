"""Config validation (SPEC §2), rendering/splitting (T6), addressing (T2), exported names."""

from __future__ import annotations

import dataclasses

import pytest

import diskqueue
import eve_client
from bridge.config import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_EVE_GRACE,
    DEFAULT_SEND_RATE,
    ConfigError,
    Env,
    EveConfig,
    PeopleConfig,
    Settings,
    TelegramConfig,
    VoiceConfig,
    read_voice,
)
from bridge.telegram.render import render
from bridge.telegram.texts import pick_lang

GOOD = {
    "IVA_TELEGRAM_TOKEN": "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "IVA_EVE_URL": "http://127.0.0.1:3000",
    "IVA_OWNER_IDS": "1, 2",
}


def test_good_config_reads_defaults():
    s = Settings.from_env(GOOD)
    assert s.people.owner_ids == {1, 2} and s.chat.turn_policy == "queue" and s.lang == "ru"
    assert (s.compaction.percent, s.compaction.ceiling, s.compaction.manual_min) == (60, 110_000, 30_000)
    assert (s.compaction.ack_seconds, s.chat.busy_timeout) == (5.0, 900.0)
    assert "ABCDEFG" not in repr(s)  # the token never shows


def test_every_bad_value_gets_its_own_message():
    env = {**GOOD, "IVA_TELEGRAM_TOKEN": "nope", "IVA_TURN_POLICY": "eventually", "IVA_COMPACT_PERCENT": "150",
           "IVA_OWNER_IDS": "1,bob", "IVA_EVE_URL": "ftp://x", "IVA_BUSY_TIMEOUT": "soon"}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    text = "\n".join(caught.value.problems)
    for name in ("IVA_TELEGRAM_TOKEN", "IVA_TURN_POLICY", "IVA_COMPACT_PERCENT", "IVA_OWNER_IDS", "IVA_EVE_URL",
                 "IVA_BUSY_TIMEOUT"):
        assert name in text
    assert len(caught.value.problems) == 6


def test_missing_required_values():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({})
    assert len(caught.value.problems) == 2  # the token and eve's URL; owners pair (issue 24)
    assert not any("IVA_OWNER_IDS" in p for p in caught.value.problems)


def test_state_dir_falls_back_to_systemd_state_directory():
    assert str(Settings.from_env({**GOOD, "STATE_DIRECTORY": "/var/lib/iva"}).state_dir) == "/var/lib/iva"
    assert str(Settings.from_env({**GOOD, "IVA_STATE_DIR": "/x", "STATE_DIRECTORY": "/y"}).state_dir) == "/x"


def test_language_follows_the_user_else_the_operator():
    assert pick_lang("en-GB", "ru") == "en"
    assert pick_lang("de", "ru") == "ru"
    assert pick_lang(None, "en") == "en"


def test_split_prefers_paragraphs_and_keeps_entities_within_parts():
    text = "**Title**\n\n" + ("para " * 500 + "\n\n") * 4
    parts = render(text)
    assert len(parts) > 1
    for part in parts:
        assert len(part.text.encode("utf-16-le")) // 2 <= 4096
        for e in part.entities:
            assert e.offset + e.length <= len(part.text.encode("utf-16-le")) // 2
    assert parts[0].entities[0].type == "bold"


def test_emoji_offsets_are_utf16():
    [part] = render("😀 **x**")
    assert part.entities[0].offset == 3  # the emoji is two UTF-16 units


@pytest.mark.parametrize("module", [eve_client, diskqueue])
def test_all_is_complete_and_sorted(module):
    public = {n for n in dir(module) if (not n.startswith("_") and n[0].isupper()) or n == "parse_event"}
    public &= {n for n in dir(module) if not n.startswith("_")}
    assert sorted(module.__all__) == list(module.__all__)
    assert public <= set(module.__all__)


def test_iva_tz_is_an_iana_zone_utc_by_default():
    """W7: the zone a reminder's cron reads in when it names none."""
    assert Settings.from_env(GOOD).tz == "UTC"
    assert Settings.from_env({**GOOD, "IVA_TZ": "Europe/Berlin"}).tz == "Europe/Berlin"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**GOOD, "IVA_TZ": "Mars/Olympus_Mons"})
    assert caught.value.problems == ["IVA_TZ='Mars/Olympus_Mons' is not an IANA time zone, e.g. Europe/Berlin or UTC"]


@pytest.mark.parametrize("zone", ["Europe", "a" * 300])
def test_iva_tz_naming_a_zone_directory_or_too_long_is_a_problem_not_a_crash(zone):
    """zoneinfo reads the name as a path: "Europe" is a directory (IsADirectoryError), a long
    name too long a file name (OSError); both are a bad IVA_TZ like any unknown name."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**GOOD, "IVA_TZ": zone})
    assert caught.value.problems == [f"IVA_TZ={zone!r} is not an IANA time zone, e.g. Europe/Berlin or UTC"]


def test_settings_compose_one_frozen_value_object_per_concern_with_its_defaults_beside_it():
    """Issue 35: what the readers give an environment naming only the required values is each
    concern's own defaults; the objects are frozen."""
    s = Settings.from_env(GOOD)
    assert s == Settings(telegram=TelegramConfig(GOOD["IVA_TELEGRAM_TOKEN"]), eve=EveConfig("http://127.0.0.1:3000"),
                         people=PeopleConfig(owner_ids=frozenset({1, 2})))
    assert (s.chat.busy_timeout, s.eve.grace, s.pacing.rate) == (DEFAULT_BUSY_TIMEOUT, DEFAULT_EVE_GRACE,
                                                                 DEFAULT_SEND_RATE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.chat.busy_timeout = 1.0  # type: ignore[misc]


def test_a_concern_is_read_by_its_own_reader_which_says_what_is_wrong():
    """A reader reads its variables alone, gives the default for a bad one and says why."""
    env = Env({"IVA_VOICE": "command", "IVA_TRANSCRIBE_TIMEOUT": "soon", "IVA_BUSY_TIMEOUT": "soon"})
    assert read_voice(env) == VoiceConfig(mode="command")
    assert env.problems == [
        "IVA_VOICE=command needs IVA_TRANSCRIBE_CMD: the command that prints a transcript (the audio file's "
        "path is appended as its last argument)",
        "IVA_TRANSCRIBE_TIMEOUT='soon' is not a number of seconds"]
