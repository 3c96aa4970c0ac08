"""Who may talk to the bot, beyond the environment's ids (P1, P2).

Two kinds of people: owners and allowed people. ``IVA_OWNER_IDS`` and ``IVA_ALLOWED_USER_IDS``
name some; the state database names the others — the person who paired (the first to open the
one-time link printed at start while the bot has no owner) and the people an owner invited
(``/invite``). The environment always wins: its people are never removed here, and while it
names an owner no pairing link is made.

A code is 128 random bits (``secrets.token_urlsafe(16)``), good once and for a limited time
(an hour for pairing, ``IVA_INVITE_HOURS`` for an invitation). Only its SHA-256 is stored; a code
someone sends is hashed and compared with every live code in constant time. One person's wrong
codes are answered five times, then ignored for an hour (a right code too, meanwhile): guessing
128 bits is hopeless, and the lock keeps a bot from being a free oracle for it.

Redeeming a code, its dedupe mark and its answer commit in one transaction (the caller's): a
crash after the commit sends the answer from the outbox at the restart, and the redelivered
update is a duplicate — a code is never used twice, and nobody is left without an answer.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import log
from .config import Settings
from .storage.people import Misses, mint_pairing_code, people_meta
from .storage.store import Store

__all__ = ["CODE_BYTES", "MISSES_ALLOWED", "PAIRING_SECONDS", "People", "Person", "Redeemed", "Role", "digest",
           "link", "mint_outside", "pairing_note"]

logger = log.get(__name__)

CODE_BYTES = 16  # 128 bits
PAIRING_SECONDS = 3600.0  # a pairing link lives an hour; the next start makes a new one
MISSES_ALLOWED = 5  # wrong codes from one person that are answered
LOCK_SECONDS = 3600.0  # then that person's codes are ignored this long
_CODE_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what a deep link's start parameter may be


class Role(enum.StrEnum):
    OWNER = "owner"
    ALLOWED = "allowed"


class Redeemed(enum.StrEnum):
    """What a code someone sent did."""

    OWNER = "owner"  # they paired: the bot's owner now
    ALLOWED = "allowed"  # an invitation: they may talk now
    ALREADY = "already"  # they could already; the code is left for someone else
    INVALID = "invalid"  # unknown, used, expired or not for this bot's state (a miss)
    LOCKED = "locked"  # too many misses: ignored, unanswered


@dataclass(frozen=True, slots=True)
class Person:
    user_id: int
    role: Role
    name: str
    from_env: bool  # named by IVA_OWNER_IDS / IVA_ALLOWED_USER_IDS: listed, never removed here


def digest(code: str) -> str:
    """What is stored of a code: its SHA-256, hex."""
    return hashlib.sha256(code.encode()).hexdigest()


def link(username: str | None, code: str) -> str:
    """The one-time link: Telegram opens the bot and sends ``/start <code>`` when pressed."""
    return f"https://t.me/{username}?start={code}" if username else f"/start {code}"


class People:
    """The people of the state database beside the settings' ones; every read asks the database
    (a primary-key lookup), so a change is seen at once and a rolled-back one never."""

    def __init__(self, store: Store, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    # -- who ---------------------------------------------------------------------------------

    async def role(self, user_id: int) -> Role | None:
        s = self.settings
        if user_id in s.people.owner_ids:
            return Role.OWNER
        row = await self.store.person(user_id)
        if row is not None and row.role == Role.OWNER:
            return Role.OWNER
        if user_id in s.people.allowed_user_ids or row is not None:
            return Role.ALLOWED
        return None

    async def is_owner(self, user_id: int) -> bool:
        return await self.role(user_id) is Role.OWNER

    async def may_talk(self, user_id: int) -> bool:
        return await self.role(user_id) is not None

    async def has_owner(self) -> bool:
        return bool(self.settings.people.owner_ids) or bool(await self.store.people(str(Role.OWNER)))

    async def owners(self) -> list[int]:
        """Every owner, the environment's and the paired one."""
        rows = await self.store.people(str(Role.OWNER))
        return sorted(self.settings.people.owner_ids | {r.user_id for r in rows})

    async def everyone(self) -> list[Person]:
        """Owners first, then allowed people; the environment's before the database's."""
        s = self.settings
        rows = await self.store.people()
        out = [Person(u, Role.OWNER, "", True) for u in sorted(s.people.owner_ids)]
        out += [Person(r.user_id, Role(r.role), r.name, False) for r in rows
                if r.role == Role.OWNER and r.user_id not in s.people.owner_ids]
        out += [Person(u, Role.ALLOWED, "", True) for u in sorted(s.people.allowed_user_ids - s.people.owner_ids)]
        listed = {p.user_id for p in out}
        out += [Person(r.user_id, Role(r.role), r.name, False) for r in rows
                if r.role == Role.ALLOWED and r.user_id not in listed]
        return out

    async def remove(self, user_id: int) -> bool:
        """Take a person of the database away (in the caller's transaction); the environment's
        cannot be removed here. False when there was nobody to remove."""
        if user_id in self.settings.people.owner_ids or user_id in self.settings.people.allowed_user_ids:
            return False
        return bool(await self.store.remove_person(user_id))

    # -- codes -------------------------------------------------------------------------------

    async def mint(self, kind: Role, *, created_by: int | None, seconds: float) -> str:
        """A new code (in the caller's transaction); only its digest is stored."""
        code = secrets.token_urlsafe(CODE_BYTES)
        now = self.clock()
        await self.store.add_code(digest(code), str(kind), created_by, now, now + seconds)
        return code

    async def start_pairing(self, username: str | None) -> str | None:
        """At start: remember the bot's username and whether the environment names an owner (for
        ``iva status``); with no owner at all, the pairing codes of earlier starts are void and a
        new one is made. Returns that code, or None when the bot has an owner."""
        async with self.store.db.transaction():
            await self.store.set_people_meta("bot_username", username or "")
            await self.store.set_people_meta("env_owners", "1" if self.settings.people.owner_ids else "0")
            await self.store.drop_unused_codes(str(Role.OWNER))
            if await self.has_owner():
                return None
            return await self.mint(Role.OWNER, created_by=None, seconds=PAIRING_SECONDS)

    async def locked(self, user_id: int) -> bool:
        """Whether this person's codes are ignored now (too many wrong ones): a read only, so the
        caller can drop a locked person's code before writing anything for it."""
        return self._locked(await self.store.pairing_misses(user_id), self.clock())

    @staticmethod
    def _locked(miss: Misses | None, now: float) -> bool:
        return miss is not None and miss.locked_until is not None and miss.locked_until > now

    async def redeem(self, user_id: int, name: str, code: str) -> Redeemed:
        """The code ``user_id`` sent (in the caller's transaction, with its dedupe mark and answer)."""
        now = self.clock()
        miss = await self.store.pairing_misses(user_id)
        if self._locked(miss, now):
            return Redeemed.LOCKED
        found = None
        if _CODE_SHAPE.fullmatch(code):
            wanted = digest(code)
            for row in await self.store.live_codes(now):  # every live code compared, in constant time each
                if hmac.compare_digest(row.digest, wanted):
                    found = row
        if found is None or (found.kind == Role.OWNER and await self.has_owner()):
            await self._missed(user_id, miss, now)
            return Redeemed.INVALID
        role = Role(found.kind)
        current = await self.role(user_id)
        if current is Role.OWNER or (current is not None and role is Role.ALLOWED):
            return Redeemed.ALREADY
        await self.store.use_code(found.digest, user_id, now)
        added_by = found.created_by
        await self.store.add_person(user_id, str(role), name[:200], added_by, now)
        await self.store.clear_misses(user_id)
        if role is Role.OWNER:  # paired: no other pairing code may make a second owner
            await self.store.drop_unused_codes(str(Role.OWNER))
        logger.info("person_added", user_id=user_id, role=str(role))
        return Redeemed.OWNER if role is Role.OWNER else Redeemed.ALLOWED

    async def _missed(self, user_id: int, miss: Misses | None, now: float) -> None:
        fresh = miss is None or now - miss.first_at > LOCK_SECONDS
        misses = 1 if fresh or miss is None else miss.misses + 1
        first = now if fresh or miss is None else miss.first_at
        locked = now + LOCK_SECONDS if misses >= MISSES_ALLOWED else None
        await self.store.record_misses(user_id, misses, first, locked)
        logger.warning("pairing_code_wrong", user_id=user_id, misses=misses, locked=locked is not None)


def pairing_note(path: Path, environ: Mapping[str, str], *, username: str | None = None) -> str | None:
    """What ``iva check`` and ``iva status`` say of pairing: None when the bot has an owner, else
    a line with a fresh link (:func:`mint_outside`) or what to do to get one."""
    if (environ.get("IVA_OWNER_IDS") or "").strip():
        return None
    if not path.exists():
        return "pairing: no owner yet; `iva run` prints a one-time pairing link at start (pairing_link in its log)"
    try:
        minted = mint_outside(path, username=username)
    except sqlite3.Error as exc:
        return f"pairing: no link made ({exc}); the daemon's log has one from its start (pairing_link)"
    if minted is None or isinstance(minted, str):
        return minted
    code, url = minted
    return (f"pairing: no owner yet; open {url} in Telegram — whoever opens it first becomes the owner "
            f"(code {code}, good for an hour, once)")


def mint_outside(path: Path, *, username: str | None = None,
                 now: float | None = None) -> tuple[str, str] | str | None:
    """For ``iva check`` and ``iva status``, beside a running daemon: a new pairing code (code,
    link) written into the state database at ``path`` when the bot has no owner; None when it
    has one; a line saying why no code was made otherwise.

    The one write these commands make, and only into a database that exists already, at this
    Iva's schema, and belongs to the user running them: a ``sudo iva status`` must never leave a
    root-owned file the service cannot open, nor create a database the daemon did not."""
    foreign = ("pairing: no owner yet; the state database is another user's: run this as the service's user "
               "for a link, or read pairing_link in the daemon's log")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists() and part.stat().st_uid != os.geteuid():
            return foreign  # the service's files: never touched
    code = secrets.token_urlsafe(CODE_BYTES)
    outcome = mint_pairing_code(path, digest(code), now=time.time() if now is None else now,
                                seconds=PAIRING_SECONDS)
    if outcome == "schema":
        return "pairing: the state database is not at this Iva's schema yet: start `iva run` once"
    if outcome != "minted":
        return None
    return code, link(username or people_meta(path).get("bot_username") or None, code)
