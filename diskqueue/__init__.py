"""diskqueue: a durable per-address message queue on SQLite. Nothing about Telegram or eve."""

from ._db import Database, DatabaseError
from ._queue import DiskQueue, Message, State

__all__ = ["Database", "DatabaseError", "DiskQueue", "Message", "State"]
