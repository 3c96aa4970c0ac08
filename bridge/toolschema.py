"""The shape of one MCP tool as the notebook's ``/mcp`` lists it (the notes' tools and the
reminders'): an object schema with no extra properties, the hints, and Iva's quiet mark."""

from __future__ import annotations

from typing import Any

__all__ = ["tool"]


def tool(name: str, description: str, properties: dict[str, Any], required: list[str], *,
         read_only: bool = False, destructive: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties, "required": required,
                        "additionalProperties": False},
        "annotations": {"readOnlyHint": read_only, "destructiveHint": destructive, "openWorldHint": False},
        "_meta": {"iva/quiet": True},
    }
