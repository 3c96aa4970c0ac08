"""N7: the notebook's rebuild, after a turn, never in front of the reply.

A one-shot call of the chat's own model through eve: a throwaway session (our MCP server does
not know it, so it gets no tools), reset afterwards. Its input is every note plus the freshest
read-only context the bridge holds: eve 0.80.1 exposes no compaction summary over HTTP
(PROTOCOL.md §13), so it is the chat's recent messages and replies from our own tables. The
answer must pass every check of :func:`rules.validate_rebuild`; a failure is retried once with
a target twice as strict, then the old notebook stays and a warning is logged. A failed
rebuild is not tried again until the notebook changes, so it cannot loop.
"""

from __future__ import annotations

import asyncio
import json
import time

import eve_client as eve

from .. import log
from ..store import Store
from .rules import needs_rebuild, rebuild_prompt, totals, validate_rebuild
from .service import Notebook

__all__ = ["Rebuilder"]

logger = log.get("bridge.notebook.rebuild")

REBUILD_TIMEOUT = 300.0
CONTEXT_CHARS = 6_000


class Rebuilder:
    def __init__(self, notebook: Notebook, store: Store, client: eve.EveClient) -> None:
        self.notebook = notebook
        self.store = store
        self.eve = client
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
        if not needs_rebuild(notes, self.notebook.limits) or chat.notes_rebuild_failed == version:
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
        """One turn in a throwaway session; its usage is the chat's spend under ``notes``."""
        session = await self.eve.create_session(prompt)
        text = ""
        calls = tokens_in = tokens_out = cached = 0
        try:
            async with asyncio.timeout(REBUILD_TIMEOUT):
                ended = False
                async for event in self.eve.stream(session, 0):
                    match event:
                        case eve.MessageCompleted() if event.message.strip():
                            text = event.message
                        case eve.StepCompleted() if event.usage is not None:
                            calls += 1
                            tokens_in += event.usage.input_tokens or 0
                            tokens_out += event.usage.output_tokens or 0
                            cached += event.usage.cache_read_tokens or 0
                    if event.terminal:
                        ended = True
                    if isinstance(event, eve.SessionWaiting) and ended:
                        break
                    if isinstance(event, eve.SessionCompleted | eve.SessionFailed):
                        break
        finally:
            async with self.store.db.transaction():
                await self.store.add_spend(address, "notes", calls=calls, input_tokens=tokens_in,
                                           output_tokens=tokens_out, cache_read_tokens=cached)
            try:
                await self.eve.reset(session, reason="notebook rebuild done")
            except eve.EveError as exc:
                logger.info("notes_rebuild_reset_failed", error=str(exc))
        return text

    async def _context(self, address: str) -> str:
        """The chat's latest messages and replies, newest kept, within CONTEXT_CHARS."""
        rows = await self.store.recent_exchange(address, limit=40)
        lines: list[str] = []
        used = 0
        for row in rows:
            text = row["text"]
            if row["who"] == "user":
                try:
                    text = json.loads(text).get("text") or ""
                except (ValueError, AttributeError):
                    text = ""
            text = " ".join(str(text).split())[:1500]
            if not text:
                continue
            line = f"{row['who']}: {text}"
            if used + len(line) > CONTEXT_CHARS:
                break
            lines.append(line)
            used += len(line)
        return "\n".join(reversed(lines))

