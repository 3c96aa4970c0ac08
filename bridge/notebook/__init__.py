"""The notebook: notes the assistant keeps for itself, per chat (seed 000, SPEC §7)."""

from .rebuild import Rebuilder
from .rules import INDEX, INLINE, LIMITS, Limits, Note, NoteError, PressureTexts
from .service import DEFAULT_VIEWER, Notebook, NotebookConfig

__all__ = [
    "DEFAULT_VIEWER", "INDEX", "INLINE", "LIMITS", "Limits", "Note", "NoteError", "Notebook", "NotebookConfig",
    "PressureTexts", "Rebuilder",
]
