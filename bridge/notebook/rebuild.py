"""N7: the notebook's rebuild, after a turn, never in front of the reply.

A one-shot call of the chat's own model through eve: a throwaway session, reset afterwards. Its
input is every note plus the freshest read-only context the bridge holds: eve 0.80.1 exposes no
compaction summary over HTTP (PROTOCOL.md §13), so it is the chat's recent exchange from our own
tables — owner-authored only (S5): the owner's messages and the replies to turns that were the
owner's alone, never anyone else's words. The answer must pass every check of
:func:`rules.validate_rebuild`; a failure is retried once with a target twice as strict, then the
old notebook stays and a warning is logged. A failed rebuild is not tried again until the notebook
changes, so it cannot loop.

No tools (S5). eve 0.80.1 has no per-session way to withhold an agent's tools (a session create or
send takes ``message``, ``clientContext``, ``turnPolicy``, ``outputSchema``, ``callback`` and
``operationId``; the tool set is the agent's, fixed at build), so the rebuild: tells the model the
task has no tools; is unknown to our MCP server, which refuses it every notebook tool; and watches
its stream — the first sign of a tool call (an ``action.*`` or ``actions.requested`` event, an
``input.requested`` approval, a step that ended in ``tool-calls``) stops reading, resets the
session at once (which cancels the turn) and voids the answer. A voided rebuild is not retried
with this notebook: whatever provoked the call is still in it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import eve_client as eve

from .. import log
from ..errors import BridgeError
from ..storage.store import Store
from .rules import needs_rebuild, rebuild_prompt, totals, validate_rebuild
from .service import Notebook

__all__ = ["Rebuilder", "ToolUsed", "tool_call"]

logger = log.get(__name__)

REBUILD_TIMEOUT = 300.0
CONTEXT_CHARS = 6_000


class Rebuilder:
    def __init__(self, notebook: Notebook, store: Store, client: eve.EveClient, *,
                 headers: Callable[[str], Awaitable[Mapping[str, str]]] | None = None) -> None:
        self.notebook = notebook
        self.store = store
        self.eve = client
        # D2, D4: what the agent's channel is told of the rebuild's session (bridge.models): the
        # model it runs on and the turn kind for which the template offers no tools.
        self.headers = headers
        self._running: set[str] = set()

    def wanted(self, address: str) -> bool:
        return self.notebook.enabled and address not in self._running

    async def maybe_run(self, address: str) -> str:
        """Rebuild when the notebook is over its limits; returns what happened (for logs and tests)."""
        if not self.wanted(address):
            return "skipped"
        self._running.add(address)
        try:
            return await self._run(address)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("notes_rebuild_crashed", address=address)
            return "error"
        finally:
            self._running.discard(address)

    async def _run(self, address: str) -> str:
        chat = await self.store.chat(address)
        if chat is None:
            return "skipped"
        notes = await self.notebook.notes(address)
        version = chat.notes_version
        # Given up on this version (a failed rebuild), or held by a restore of it (its negative).
        if not needs_rebuild(notes, self.notebook.limits) or chat.notes_rebuild_failed in (version, -version):
            return "not_needed"
        limits = self.notebook.limits
        context = await self._context(address)
        chars, count = totals(notes)
        logger.info("notes_rebuild_started", address=address, chars=chars, notes=count)
        reason = ""
        for attempt, divisor in ((1, 1), (2, 2)):
            prompt = rebuild_prompt(notes, context, target_chars=limits.target_chars // divisor,
                                    target_notes=max(1, limits.target_notes // divisor), strict=attempt > 1)
            try:
                answer = await self._ask(address, prompt)
            except ToolUsed as exc:
                logger.warning("notes_rebuild_voided_tool_call", address=address, attempt=attempt,
                               tools=exc.tools, sign=exc.event)
                await self.notebook.rebuild_failed(address, version)
                logger.warning("notes_rebuild_gave_up_old_notebook_kept", address=address,
                               reason="the model called a tool")
                return "tool_used"
            except (eve.EveError, TimeoutError) as exc:
                logger.warning("notes_rebuild_call_failed", address=address, attempt=attempt, error=str(exc))
                return "eve_failed"  # not the answer's fault: the next turn may try again
            result = validate_rebuild(notes, answer, now=time.time(), limits=limits)
            if result.fixes:
                logger.info("notes_rebuild_fixed", address=address, fixes=result.fixes)
            if result.ok:
                if not await self.notebook.swap(address, result.notes, version=version):
                    logger.info("notes_rebuild_discarded_changed_meanwhile", address=address)
                    return "changed"
                new_chars, new_count = totals(result.notes)
                logger.info("notes_rebuilt", address=address, attempt=attempt, chars_before=chars,
                            chars_after=new_chars, notes_before=count, notes_after=new_count,
                            pinned_restored=result.restored)
                return "rebuilt"
            reason = result.reason
            logger.warning("notes_rebuild_rejected", address=address, attempt=attempt, reason=reason)
        await self.notebook.rebuild_failed(address, version)
        logger.warning("notes_rebuild_gave_up_old_notebook_kept", address=address, reason=reason)
        return "rejected"

    async def _ask(self, address: str, prompt: str) -> str:
        """One turn in a throwaway session; its usage is the chat's spend under ``notes``. Raises
        :class:`ToolUsed` at the first sign of a tool call."""
        headers = await self.headers(address) if self.headers is not None else None
        session = await self.eve.create_session(prompt, headers=headers)
        text = ""
        calls = tokens_in = tokens_out = cached = 0
        try:
            async with asyncio.timeout(REBUILD_TIMEOUT):
                ended = False
                async for event in self.eve.stream(session):
                    match event:
                        case eve.TextDone(phase=eve.Phase.REPLY) if event.text.strip():
                            text = event.text
                        case eve.UsageRecorded():
                            calls += 1
                            tokens_in += event.usage.input_tokens or 0
                            tokens_out += event.usage.output_tokens or 0
                            cached += event.usage.cache_read_tokens or 0
                    tools = tool_call(event)
                    if tools is not None:
                        raise ToolUsed(event.what, tools)
                    if isinstance(event, eve.TurnEnded):
                        ended = True
                    if (isinstance(event, eve.Idle) and ended) or isinstance(event, eve.SessionEnded):
                        break
        finally:
            async with self.store.db.transaction():
                await self.store.add_spend(address, "notes", calls=calls, input_tokens=tokens_in,
                                           output_tokens=tokens_out, cache_read_tokens=cached)
            try:
                await self.eve.end(session, reason="notebook rebuild done")
            except eve.EveError as exc:
                logger.info("notes_rebuild_reset_failed", error=str(exc))
        return text

    async def _context(self, address: str) -> str:
        """The chat's latest owner-authored exchange (S5), newest kept, within CONTEXT_CHARS, one
        line per message (so no line of it can pass for a heading or a section of the prompt)."""
        rows = await self.store.recent_exchange(address, limit=40)
        lines: list[str] = []
        used = 0
        for row in rows:
            text = " ".join(str(row.text or "").split())[:1500]
            if not text:
                continue
            line = f"{'owner' if row.who == 'owner' else 'you'}: {text}"
            if used + len(line) > CONTEXT_CHARS:
                break
            lines.append(line)
            used += len(line)
        return "\n".join(reversed(lines))


class ToolUsed(BridgeError):
    """The rebuild's model called (or tried to call) a tool: the answer is void (S5)."""

    def __init__(self, event: str, tools: list[str]) -> None:
        super().__init__(f"{event}: {', '.join(tools) or 'a tool'}")
        self.event = event
        self.tools = tools


def tool_call(event: eve.Event) -> list[str] | None:
    """The tools an event shows being called or asked for (names, possibly empty), or None when it
    shows no tool call."""
    if isinstance(event, eve.ToolCalled):
        return list(event.names)
    if isinstance(event, eve.ToolSettled):
        return [event.name or ""]
    if isinstance(event, eve.QuestionOpened):  # a tool approval or a question: nobody answers here
        return [q.kind for q in event.questions]
    if isinstance(event, eve.RunEnded) and event.finish_reason == "tool-calls":
        return []  # eve refused the call (no such tool) but the model made one
    return None
