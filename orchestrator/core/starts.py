"""When, and in which order, a submitted document is first claimed: ``submit``'s
``not_before`` and ``priority``, checked before any I/O, and the ``lockedUntil`` a later
start is stored as (a wait, judged as every lease is)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.queries.claims import MAX_PRIORITY
from orchestrator.core.resource import EPOCH

__all__ = ["NotBefore", "check_not_before", "check_priority", "start_time"]


def check_priority(value: Any) -> int:
    """``submit``'s ``priority``: an int from 0 to ``MAX_PRIORITY`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"submit: priority is an int from 0 to {MAX_PRIORITY}, not {type(value).__name__}"
            f" {value!r}"
        )
    if not 0 <= value <= MAX_PRIORITY:
        raise ConfigError(
            f"submit: priority is an int from 0 (the default) to {MAX_PRIORITY} (claimed"
            f" first), not {value}"
        )
    return value


NotBefore = datetime | float | int | None
"""``submit``'s ``not_before``: an aware datetime, seconds from now, or None (at once)."""


def check_not_before(value: Any) -> NotBefore:
    """``submit``'s ``not_before``, checked before any I/O: None, an aware datetime, or a
    finite number of seconds >= 0 (not a bool)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError(
                "submit: not_before is a naive datetime; give an aware one"
                " (datetime.now(UTC) + ...) or seconds from now"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            "submit: not_before is an aware datetime or seconds from now, not"
            f" {type(value).__name__} {value!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"submit: not_before needs a finite number of seconds >= 0, not {value!r}"
        )
    return value


def start_time(not_before: NotBefore, now: datetime, max_wait: float) -> datetime:
    """The ``lockedUntil`` of a document submitted at ``now`` (the server's time, as every
    lease is judged) to start at ``not_before`` (``check_not_before``'s): ``EPOCH``
    (claimable at once) when that is not after ``now``. Bounded like any wait: a start
    more than ``max_wait`` seconds ahead is refused, not cut short (a relock cut short is
    only asked again; work started early may not be undone)."""
    if not_before is None:
        return EPOCH
    if isinstance(not_before, datetime):
        until, wait = not_before, (not_before - now).total_seconds()
    else:
        until, wait = now + timedelta(seconds=not_before), float(not_before)
    if wait > max_wait:
        raise ConfigError(
            f"submit: not_before is {wait:g}s ahead, past max_wait ({max_wait:g}s), the bound"
            " of every wait; raise max_wait (up to 30 days) or submit later"
        )
    return until if wait > 0 else EPOCH
