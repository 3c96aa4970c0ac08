"""aiogram's answer models, kept for the bot's life (bridge/telegram/responses.py): aiogram parses
each answer as ``Response[<the method's type>]``, which pydantic caches only weakly, so without
a holder every full garbage collection frees it and the next call builds it again."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
from aiogram.methods import GetMe, Response

from bridge.app import make_bot
from bridge.config import Settings
from tests.fakes.telegram import TOKEN, FakeTelegram
from tests.harness import close_bot


def _settings(tg: FakeTelegram) -> Settings:
    return Settings.from_env({"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_EVE_URL": "http://127.0.0.1:1",
                              "IVA_OWNER_IDS": "1", "IVA_TELEGRAM_API_URL": tg.url})


def _collect() -> None:
    """A full collection. It runs the finalizers of whatever earlier tests in this worker left for
    the collector (a subprocess transport's ``__del__`` complaining it was not closed): theirs,
    not this test's, so they are written to stderr instead of failing it."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: print(f"an earlier test's leftover: {u.exc_value!r} in {u.object!r}",
                                         file=sys.stderr)
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _answer_model() -> weakref.ref[type]:
    return weakref.ref(Response[GetMe.__returning__])  # type: ignore[name-defined]


async def test_a_calls_answer_model_outlives_a_full_collection(tg: FakeTelegram):
    _collect()  # what earlier tests left, first
    unheld = _answer_model()
    _collect()
    # pydantic alone lets it go (what the holder is for) — unless something else in this worker
    # holds it already: a bot an earlier test left for the collector (the worker's order decides;
    # one fresh-clone CI run in six met it). Then the premise cannot be shown here, and the test
    # says so instead of failing on what another test left.
    if unheld() is not None:
        pytest.skip("Response[User] is held before this test's bot exists (an earlier test's leftover)")
    bot = make_bot(_settings(tg))
    try:
        await bot.get_me()
        held = _answer_model()
        _collect()
        assert held() is not None
    finally:
        await close_bot(bot)
