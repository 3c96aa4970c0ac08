"""The models a chat may answer on (D1) and the one the notebook's rebuild runs on (D4)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._env import ConfigError, Env

__all__ = ["MODELS_EXAMPLE", "Model", "Models", "models_of", "read_models"]

_MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_MODEL_ID = re.compile(r"[^\s,=]+")
MODELS_EXAMPLE = "fast=openai/gpt-5-mini:400000,strong=anthropic/claude-sonnet-4.5:200000"


@dataclass(frozen=True, slots=True)
class Model:
    """One model the operator allows (D1): its short name in /model, eve's id for it, its window."""

    name: str
    id: str
    window: int


@dataclass(frozen=True, slots=True)
class Models:
    """IVA_MODELS, the operator's allow-list (D1): the first is every chat's default; and
    IVA_NOTES_MODEL, the one the notebook's rebuild runs on (D4; None: the chat's own)."""

    entries: tuple[Model, ...] = ()
    notes: Model | None = None

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def default(self) -> Model | None:
        return self.entries[0] if self.entries else None

    def get(self, name: str | None) -> Model | None:
        return next((m for m in self.entries if m.name == name), None) if name else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.entries)


def read_models(raw: str | None, notes: str | None = None) -> Models:
    """IVA_MODELS (``name=eve model id:window``, comma-separated; a model id may hold ``:``
    itself, the window is after the last) and IVA_NOTES_MODEL (one of its names). Raises
    :class:`ConfigError` naming every bad entry."""
    problems: list[str] = []
    entries: list[Model] = []
    for part in (raw or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, rest = part.partition("=")
        model_id, colon, window = rest.rpartition(":")
        name, model_id = name.strip(), model_id.strip()
        if not eq or not colon:
            problems.append(f"IVA_MODELS: {part!r} is not name=model:window (e.g. {MODELS_EXAMPLE})")
            continue
        if not _MODEL_NAME.fullmatch(name):
            problems.append(f"IVA_MODELS: the name {name!r} must be 1-32 of a-z 0-9 _ - (starting with a letter "
                            "or digit): it is what people type after /model")
            continue
        if not _MODEL_ID.fullmatch(model_id):
            problems.append(f"IVA_MODELS: {name}'s model {model_id!r} must be eve's model id "
                            "(no spaces, commas or '='), e.g. anthropic/claude-sonnet-4.5")
            continue
        try:
            tokens = int(window.strip().replace("_", ""))
        except ValueError:
            problems.append(f"IVA_MODELS: {name}'s window {window.strip()!r} is not a whole number of tokens")
            continue
        if tokens < 1000:
            problems.append(f"IVA_MODELS: {name}'s window {tokens} must be at least 1000 tokens")
            continue
        if any(m.name == name for m in entries):
            problems.append(f"IVA_MODELS: the name {name!r} is given twice")
            continue
        entries.append(Model(name, model_id, tokens))
    models = Models(tuple(entries))
    chosen = None
    if notes is not None:
        chosen = models.get(notes.strip().lower())
        if chosen is None:
            problems.append(f"IVA_NOTES_MODEL={notes!r} must be one of IVA_MODELS' names "
                            f"({', '.join(models.names) or 'IVA_MODELS is empty'})")
    if problems:
        raise ConfigError(problems)
    return Models(models.entries, chosen)


def models_of(env: Env) -> Models:
    """IVA_MODELS and IVA_NOTES_MODEL from the environment, their problems joined to the others'."""
    return env.collect(lambda: read_models(env.get("IVA_MODELS"), env.get("IVA_NOTES_MODEL")), Models())
