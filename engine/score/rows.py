"""What a row of a classify or score call must be, checked before anything is tokenized:
a bad row becomes that row's error, never an exception. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

Row = str | tuple[str, str] | list[dict]      # a text, a (text, text_pair) pair, or chat messages


@dataclass(frozen=True)
class RowError:
    """A row refused before it is tokenized."""

    error: str      # why ("row is null", ...)


def pair_error(query: object, document: object) -> str | None:
    """Why a (query, document) row cannot be scored, or None when it can."""
    for name, value in (("query", query), ("document", document)):
        if value is None:
            return f"{name} is null"
        if not isinstance(value, str):
            return f"{name} is not a string (got {type(value).__name__})"
    return None


def as_row(value: object) -> Row | RowError:
    """A classify row as the tokenizer takes it, or why it is not one."""
    if isinstance(value, str):
        return value
    if value is None:
        return RowError("row is null")
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(part, str) for part in value):
        return (value[0], value[1])
    if isinstance(value, (list, tuple)) and value and all(isinstance(message, dict) for message in value):
        if all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
            return list(value)
        return RowError("chat messages must each be {'role': str, 'content': str}")
    return RowError(f"row is not a text, a pair of texts or chat messages (got {type(value).__name__})")
