"""Pydantic's validation errors, said as one readable line per bad field.

A user who passes ``lock_timeout=-1`` wants to read the field, the value and what is
allowed, not a multi-line dump with error codes and a documentation link.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

from pydantic import BaseModel, ValidationError

_BOUNDS = {
    "greater_than": "> {gt}",
    "greater_than_equal": ">= {ge}",
    "less_than": "< {lt}",
    "less_than_equal": "<= {le}",
}


def _value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _BOUNDS:
        return "must be " + _BOUNDS[kind].format(**ctx)
    message: str = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    subject, should, rest = message.partition(" should ")
    return f"must {rest}" if should and subject in {"Input", "String", "Value"} else message


def explain(exc: ValidationError, what: str, model: type[BaseModel] | None = None) -> str:
    """``invalid WHAT: FIELD=VALUE: ALLOWED; ...``, naming the closest field of ``model``
    (by name or alias) for an unknown one."""
    names: list[str] = []
    for name, info in (model.model_fields if model is not None else {}).items():
        names += [name] if info.alias is None else [name, info.alias]
    parts: list[str] = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            near = get_close_matches(field, names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            parts.append(f"{field}: no such field{hint}")
        elif error["type"] == "missing":
            parts.append(f"{field}: required")
        elif not field:
            parts.append(_allowed(error))
        else:
            parts.append(f"{field}={_value(error['input'])}: {_allowed(error)}")
    return f"invalid {what}: " + "; ".join(parts)
