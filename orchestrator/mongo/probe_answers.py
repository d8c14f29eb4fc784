"""The idle probe's answer as the scheduler reads it (``Found``), from the rows of one
aggregation or of several read in parts, and the server's refusal of a stage it does not
know (the probe then asks per collection)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo.errors import OperationFailure

from orchestrator.core import pauses
from orchestrator.core.clock import as_utc
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.queries import claims
from orchestrator.core.scheduler import Found

UNKNOWN_STAGE_CODES = frozenset({16436, 40324})
"""The server's answer to an aggregation stage it does not know (``$unionWith`` before 4.4)."""


def unknown_stage(exc: OperationFailure) -> bool:
    """The server refused a pipeline stage it does not know (so the probe asks per
    collection)."""
    return exc.code in UNKNOWN_STAGE_CODES or "Unrecognized pipeline stage" in str(exc)


def found(
    rows: Sequence[Mapping[str, Any]], with_pauses: bool = False, in_house: InHouse = NO_IN_HOUSE
) -> Found:
    """A probe's answer (``claims.probe_pipeline``): the handlers with work now, the
    earliest due time among the documents of the others (while migrating, an in-house
    lease's comes as its ``lockedAt``), the operators' pauses (``with_pauses``) and how
    many replicas are live, when it read them. A row that is none of those is skipped:
    the probe only ever narrows what is claimed."""
    ready: set[int] = set()
    due: datetime | None = None
    paused: list[Mapping[str, Any]] = []
    live: int | None = None
    for row in rows:
        number = row.get(claims.PROBE_HANDLER)
        when = row.get(claims.PROBE_DUE)
        held = row.get(claims.PROBE_HELD_AT)
        if in_house.migrating and isinstance(held, datetime):
            when = in_house.expiry(held)
        if isinstance(number, int) and not isinstance(number, bool):
            ready.add(number)
        elif isinstance(when, datetime):
            when = as_utc(when)
            due = when if due is None or when < due else due
        elif isinstance(row.get(claims.PROBE_PAUSE), Mapping):
            paused.append(row[claims.PROBE_PAUSE])
        elif isinstance(row.get(claims.PROBE_LIVE), int):
            live = row[claims.PROBE_LIVE]
    return Found(frozenset(ready), due, pauses.read_all(paused) if with_pauses else None, live)


def merged(answers: Sequence[Found], sizes: Sequence[int]) -> Found:
    """The answers of a probe read in parts (``claims.probe_chunks``) as one: each part's
    handlers numbered after those of the parts before (``sizes``), the earliest due time,
    the pauses and the live replicas of the first."""
    ready: set[int] = set()
    offset = 0
    for answer, size in zip(answers, sizes, strict=True):
        ready.update(offset + n for n in answer.ready)
        offset += size
    dues = [a.next_due for a in answers if a.next_due is not None]
    first = answers[0]
    return Found(frozenset(ready), min(dues) if dues else None, first.pauses, first.live)
