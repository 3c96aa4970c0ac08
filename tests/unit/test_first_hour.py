"""Issue 15, the first hour: the README's own example passes the checks it documents, a bad
token says which part is wrong, and the package metadata builds without a warning."""

from __future__ import annotations

import re
import tomllib

import pytest

from bridge.config import ConfigError, Settings, token_problem
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
EXAMPLE_TOKEN = "123456789:AAEhBOweik6ad9r_QXMENQjcrGbqCr4K-bs"


def test_the_readme_example_passes_the_configuration_check():
    """The two-commands example is copied as is by a new user: its values must be valid."""
    line = next(x for x in README.splitlines() if x.startswith("IVA_TELEGRAM_TOKEN="))
    token = re.match(r"IVA_TELEGRAM_TOKEN=(\S+)", line)
    assert token is not None and token.group(1) == EXAMPLE_TOKEN
    assert token_problem(token.group(1)) is None
    s = Settings.from_env({"IVA_TELEGRAM_TOKEN": token.group(1), "IVA_EVE_URL": "http://127.0.0.1:3000",
                           "IVA_OWNER_IDS": "1"})
    assert s.telegram.token == EXAMPLE_TOKEN


@pytest.mark.parametrize(("token", "says"), [
    ("123456:your-bot-token", "must be at least 20 characters (it has 14; @BotFather's have 35)"),
    ("mybot:AAEhBOweik6ad9r_QXMENQjcrGbqCr4K-bs", "the part before ':' must be the bot's numeric id"),
    ("AAEhBOweik6ad9r_QXMENQjcrGbqCr4K-bs", "has no ':'"),
    ("123456789:AAEhBOweik6ad9r QXMENQjcrGbqCr4K-bs", "letters, digits, '-' and '_' only (it contains a space)"),
    ("123456789:", "(it is empty)"),
    ("12:x", "numeric id (3 or more digits); the part after ':' must be at least 20 characters"),
])
def test_a_bad_token_says_which_part_is_wrong(token: str, says: str):
    problem = token_problem(token)
    assert problem is not None and problem.startswith("IVA_TELEGRAM_TOKEN does not look like a bot token")
    assert says in problem, problem
    secret = token.partition(":")[2]
    assert not secret or len(secret) < 4 or secret not in problem  # the secret is never echoed


def test_the_config_error_carries_the_token_problem():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"IVA_TELEGRAM_TOKEN": "123456:your-bot-token", "IVA_EVE_URL": "http://x:1",
                           "IVA_OWNER_IDS": "1"})
    assert any("the part after ':' must be at least 20 characters" in p for p in caught.value.problems)


def test_the_license_is_an_spdx_string_for_a_setuptools_that_takes_one():
    """setuptools ≥ 77 warns (three times per install) about ``license = {text = …}``; an SPDX
    string is what it wants, and older setuptools would refuse one, hence the floor."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT"
    floor = next(r for r in meta["build-system"]["requires"] if r.startswith("setuptools"))
    assert tuple(int(x) for x in floor.partition(">=")[2].split(".")) >= (77,)


def test_the_readme_lists_every_prerequisite_with_its_install_command():
    start = README.index("**Prerequisites**")
    block = README[start:README.index("Run the tests", start)]
    for needed in ("python3-venv", "nodejs npm", "git", "Node 20+", "3.11"):
        assert needed in block, needed
