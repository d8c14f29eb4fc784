"""How long finished documents stay: per collection and phase, e.g.
``orch.retain("reports", {"Done": "30d", "Failed": "90d"})``.

The write that enters a retained phase stores the date the server should delete the
document (``EXPIRY_FIELD``: the phase's entry time by the server's clock plus the
retention), in that same write; a write that takes it out of the phase unsets it. A TTL
index on that field (``RETENTION_INDEX``, ``expireAfterSeconds: 0``) has the server
delete it: no extra command, no sweeper. MongoDB's TTL monitor runs about once a minute
(``replicas.TTL_MONITOR_PERIOD``), so a document may outlive its date by that much.

Everything here is pure: the durations, their checks, and how they are shown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.resource import EXPIRY_FIELD

Retention = Mapping[str, float]
"""One collection's retention: seconds a document stays in each retained phase."""

NO_RETENTION: Retention = MappingProxyType({})

RETENTION_INDEX: list[tuple[str, int]] = [(EXPIRY_FIELD, 1)]
RETENTION_INDEX_EXPIRY = 0
"""The server deletes a document once the date in ``EXPIRY_FIELD`` is past."""

MAX_RETENTION = 100 * 365 * 86400.0
"""A century: any longer is a mistake (and the date would soon leave BSON's range)."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*")

DURATION_FORMS = (
    '"30d", "12h", "90m", "45s", a number of seconds or a timedelta, more than 0 and at'
    " most 100 years"
)
"""What a retention accepts, as its refusal says it."""


def duration(value: Any) -> float:
    """Seconds of a retention given as ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, a
    number of seconds or a ``timedelta``; ``ValueError`` saying what is accepted."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (found := _DURATION.fullmatch(value.lower())):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    else:
        raise ValueError(f"must be {DURATION_FORMS}, not {value!r}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_RETENTION:
        raise ValueError(f"must be {DURATION_FORMS}, not {value!r}")
    return seconds


def check(collection: str, phases: Any) -> dict[str, float]:
    """``phases`` (phase name to duration) checked at declaration, as seconds; a one-line
    ``ConfigError`` naming the collection and the phase otherwise."""
    if not isinstance(phases, Mapping) or not phases:
        raise ConfigError(
            f"retain({collection!r}, ...) needs a mapping of phase to duration, e.g."
            f' {{"Done": "30d"}}, not {phases!r}'
        )
    checked: dict[str, float] = {}
    for phase, given in phases.items():
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"retain({collection!r}, ...): {phase!r} is not a phase name")
        try:
            checked[phase] = duration(given)
        except ValueError as exc:
            raise ConfigError(f"retain({collection!r}, ...): {phase!r} {exc}") from exc
    return checked


def merged(collection: str, known: Retention, added: Retention) -> dict[str, float]:
    """A second declaration for one collection adds phases; one that gives a phase
    another duration is refused (which one holds would depend on import order)."""
    for phase, seconds in added.items():
        before = known.get(phase)
        if before is not None and before != seconds:
            raise ConfigError(
                f"retain({collection!r}, ...): {phase!r} is already retained for"
                f" {shown(before)}, not {shown(seconds)}"
            )
    return {**known, **added}


def expiry(now: datetime, seconds: float) -> datetime:
    """When a document entering a phase retained ``seconds`` at ``now`` is deleted."""
    return now + timedelta(seconds=seconds)


def shown(seconds: float) -> str:
    """A duration in the largest unit that says it exactly: ``30d``, ``36h``, ``90m``."""
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def describe(retention: Retention) -> str:
    """``Done 30d, Failed 90d`` (phases in order); ``none`` for no retention."""
    if not retention:
        return "none"
    return ", ".join(f"{phase} {shown(retention[phase])}" for phase in sorted(retention))


def expiry_of(doc: Mapping[str, Any]) -> datetime | None:
    """The date the server deletes ``doc`` by, as its TTL index judges the field: a date,
    or the earliest date of an array; None for anything else (a user's garbage included),
    which the server ignores too."""
    value = doc.get(EXPIRY_FIELD)
    values = value if isinstance(value, list) else [value]
    dates = [_utc(v) for v in values if isinstance(v, datetime)]
    return min(dates) if dates else None


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
