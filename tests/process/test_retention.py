"""F7 (issue 11): the real daemon prunes at start (and hourly after), keeping what is young."""

from __future__ import annotations

import pytest

from tests.conftest import OWNER

pytestmark = pytest.mark.process  # every test here runs the bridge as a process

DAY = 86_400.0


def _counts(d) -> tuple[int, int]:
    with d.db() as conn:
        queue = conn.execute("SELECT count(*) FROM diskqueue_messages").fetchone()[0]
        outbox = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
    conn.close()
    return queue, outbox


async def test_the_daemon_prunes_old_finished_rows_at_start(tg, fake_eve, daemon_factory):
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_RETENTION_DAYS="1")
    await d.start()
    await tg.message("an old question", user_id=OWNER)
    await tg.message("/help", user_id=OWNER)  # a dedupe mark of an update handled on the spot
    await tg.wait_texts(2)
    await d.settled()
    await d.terminate()
    assert _counts(d) == (2, 2)
    with d.db() as conn:  # two days pass
        conn.execute("UPDATE diskqueue_messages SET enqueued_at = enqueued_at - ?, finished_at = finished_at - ?",
                     (2 * DAY, 2 * DAY))
        conn.execute("UPDATE outbox SET created_at = created_at - ?, sent_at = sent_at - ?", (2 * DAY, 2 * DAY))
    conn.close()

    await d.start()
    await tg.wait_for(lambda: _counts(d) == (0, 0), 15, "the old rows pruned at start")
    # the log line follows the prune's commit: wait for it rather than racing the process's output
    await tg.wait_for(lambda: "retention_pruned" in d.logs(), 15, "the prune logged")
    await tg.message("a new question", user_id=OWNER)
    await tg.wait_texts(3)
    await d.settled()
    assert tg.texts()[2] == "echo: a new question"
    assert _counts(d) == (1, 1)  # young: kept
