"""End to end over loopback HTTP: aiogram ↔ fake Bot API, eve_client ↔ fake eve (T1–T4, T6, T7)."""

from __future__ import annotations

import pytest

from tests.conftest import OWNER

pytestmark = pytest.mark.process  # every test here runs the bridge as a process


async def test_owner_private_message_is_answered(tg, fake_eve, bridge):
    """T1/T6: an owner's private message reaches eve and eve's reply comes back."""
    await tg.message("hello there", user_id=OWNER)
    texts = await tg.wait_texts(1)
    assert texts == ["echo: hello there"]
