"""V5, "better still": the recent exchange of a session an eve upgrade stranded, carried into the
new session with its first message.

eve 1.x takes prior ``history`` (user and assistant entries) only from the agent's own channel code,
never from a request body (eve's docs: ``channels/eve.mdx``, "Start from prior history"). So Iva
reads the stranded session's recorded stream (``follow=false`` works on a stranded session, and a
0.80 session is served converted to version 27: PROTOCOL-27.md §11), keeps the last exchanges, and
sends them in the first message's ``clientContext`` as ``{"ivaHistory": [...], "context": ...}``.
The template's eve channel (``examples/eve-agent/channels/eve.ts``), having checked that the
caller is Iva, returns them as that message's ``history``: the model sees them as real turns. An
agent whose channel does not do that shows the model the object as client context — the exchange
still reaches it, as context rather than as turns.
"""

from __future__ import annotations

from typing import Any

import eve_client as eve

from .. import log

__all__ = ["MAX_CHARS", "MAX_ENTRIES", "transcript", "with_history"]

logger = log.get(__name__)

MAX_ENTRIES = 20  # the last ten exchanges or so
MAX_CHARS = 12_000  # of text in all: a recent exchange, not the whole conversation


async def transcript(client: eve.EveClient, session: str) -> list[dict[str, str]]:
    """The last exchanges of ``session`` as eve's history entries (``role``, ``text``), oldest
    first; [] when the session cannot be read (ended, gone: eve deletes an ended one's history)."""
    try:
        page = await client.read(session)
    except eve.EveError as exc:
        logger.info("carry_unreadable", session=session, error=str(exc))
        return []
    entries: list[dict[str, str]] = []
    for event in page.events:
        if isinstance(event, eve.InputTaken) and event.text.strip():
            entries.append({"role": "user", "text": event.text})
        elif isinstance(event, eve.TextDone) and event.phase is eve.Phase.REPLY and not event.interrupted \
                and event.text.strip():
            if entries and entries[-1]["role"] == "assistant":
                entries[-1] = {"role": "assistant", "text": entries[-1]["text"] + "\n\n" + event.text}
            else:
                entries.append({"role": "assistant", "text": event.text})
    kept: list[dict[str, str]] = []
    size = 0
    for entry in reversed(entries[-MAX_ENTRIES:]):
        size += len(entry["text"])
        if size > MAX_CHARS:
            break
        kept.append(entry)
    kept.reverse()
    while kept and kept[0]["role"] != "user":  # a history starts with what the person said
        kept.pop(0)
    logger.info("carry_read", session=session, entries=len(kept), of=len(entries))
    return kept


def with_history(context: str | None, history: list[dict[str, str]]) -> str | dict[str, Any] | None:
    """The first message's clientContext: the history beside the usual context."""
    if not history:
        return context
    return {"ivaHistory": history, **({"context": context} if context else {})}
