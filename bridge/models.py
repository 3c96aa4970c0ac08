"""Per chat (SPEC §19): which model answers a chat (D1), and what Iva tells the agent's eve channel
with each request (D2).

**The model.** The operator allows models in ``IVA_MODELS`` (:class:`~bridge.config.Models`); a
chat's owner picks one with ``/model``, kept in ``chat_models`` (:mod:`bridge.storage.models`).
A chat without a choice answers on the first of the list. A choice the operator has since taken
out of the list answers on that first one too, and says so (/status; logged once per process).
Without ``IVA_MODELS`` there is nothing to choose: the agent's own model answers, and its window is
the one eve's ``/info`` or ``IVA_CONTEXT_WINDOW`` gave.

**The caller.** eve 1.x's session routes take no unknown body field, so what the agent should
know of a request rides in headers (:data:`HEADERS`): the chat's model (eve's id for it), the
chat's address, the person speaking (a Telegram user id), their role and what the turn is. The
agent's channel reads them only after it checked Iva's bearer (``examples/eve-agent/``), so
nobody without Iva's token can set them (docs/security.md).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from diskqueue import Database

from . import log
from .config import Model, Models
from .storage.models import ModelStore

__all__ = ["HEADERS", "Answering", "Caller", "ChatModels", "Role", "TurnKind"]

logger = log.get(__name__)

HEADERS = ("x-iva-model", "x-iva-chat", "x-iva-speaker", "x-iva-role", "x-iva-turn")


class TurnKind(enum.StrEnum):
    """What a request to eve is for (``x-iva-turn``)."""

    PERSON = "person"  # people's messages (or a person's answer to a question)
    PUSHED = "pushed"  # a pushed turn from the owner API (W1)
    REMINDER = "reminder"  # a reminder falling due (W6)
    REBUILD = "rebuild"  # the notebook's rebuild, a throwaway session (N7, D4): offered no tools


class Role(enum.StrEnum):
    """Who is speaking (``x-iva-role``): an owner; an allowed person in their own private chat;
    a member of a group or forum (an allowed person where others read along, or anyone Iva
    answers there without knowing them)."""

    OWNER = "owner"
    ALLOWED = "allowed"
    MEMBER = "member"


@dataclass(frozen=True, slots=True)
class Answering:
    """The model that answers a chat: ``model`` (None without ``IVA_MODELS``: the agent's own)
    and the chat's stored choice, which may name a model the operator took away (``fallback``)."""

    model: Model | None
    chosen: str | None = None

    @property
    def fallback(self) -> bool:
        return self.chosen is not None and (self.model is None or self.model.name != self.chosen)


class ChatModels:
    """The chats' models: the operator's list, each chat's choice."""

    def __init__(self, db: Database, models: Models) -> None:
        self.sql = ModelStore(db)
        self.models = models
        self._told: set[tuple[str, str]] = set()  # (address, gone name) logged once per process

    @property
    def enabled(self) -> bool:
        return bool(self.models)

    async def of(self, address: str) -> Answering:
        if not self.models:
            return Answering(None)
        choice = await self.sql.choice(address)
        chosen = choice.name if choice is not None else None
        model = self.models.get(chosen) or self.models.default
        answering = Answering(model, chosen)
        if answering.fallback and (address, chosen or "") not in self._told:
            self._told.add((address, chosen or ""))
            logger.warning("chat_model_gone_default_used", address=address, chosen=chosen,
                           default=model.name if model else None)
        return answering

    async def choose(self, address: str, name: str, *, set_by: int | None) -> Model | None:
        """The chat answers on ``name`` from its next turn (in the caller's transaction); None when
        the operator does not allow it (nothing written)."""
        model = self.models.get(name)
        if model is None:
            return None
        await self.sql.choose(address, model.name, set_by=set_by, now=time.time())
        self._told.discard((address, model.name))
        logger.info("chat_model_chosen", address=address, model=model.name, by=set_by)
        return model

    async def notes_model(self, address: str) -> Model | None:
        """D4: the rebuild's model: ``IVA_NOTES_MODEL``, else the chat's own."""
        return self.models.notes or (await self.of(address)).model

    async def rebuild_headers(self, address: str) -> dict[str, str]:
        """D2, D4: the notebook rebuild's request: its model, and the turn kind that tells the
        template to offer no tools at all."""
        return Caller(address, TurnKind.REBUILD, await self.notes_model(address)).headers()


@dataclass(frozen=True, slots=True)
class Caller:
    """What Iva tells the agent's channel with one request (D2), as headers."""

    chat: str
    turn: TurnKind
    model: Model | None = None
    speaker: int | None = None
    role: Role | None = None

    def headers(self) -> dict[str, str]:
        out = {"x-iva-chat": self.chat, "x-iva-turn": str(self.turn)}
        if self.model is not None:
            out["x-iva-model"] = self.model.id
        if self.speaker is not None:
            out["x-iva-speaker"] = str(self.speaker)
        if self.role is not None:
            out["x-iva-role"] = str(self.role)
        return out
