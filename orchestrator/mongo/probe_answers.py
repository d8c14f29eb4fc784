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
from orchestrator.core.scheduler import Due, Found

UNKNOWN_STAGE_CODES = frozenset({16436, 40324})
"""The server's answer to an aggregation stage it does not know (``$unionWith`` before 4.4)."""


def unknown_stage(exc: OperationFailure) -> bool:
    """The server refused a pipeline stage it does not know (so the probe asks per
    collection)."""
    return exc.code in UNKNOWN_STAGE_CODES or "Unrecognized pipeline stage" in str(exc)


def found(
    rows: Sequence[Mapping[str, Any]], with_pauses: bool = False, in_house: InHouse = NO_IN_HOUSE
) -> Found:
    """A probe's answer (``claims.probe_pipeline``): the handlers with work now, each
    collection's earliest due time among the documents of the others (while migrating, an
    in-house lease's comes as its ``lockedAt``) with that document's phase, the operators'
    pauses (``with_pauses``) and how many replicas are live, when it read them. A row that
    is none of those is skipped: the probe only ever narrows what is claimed."""
    ready: set[int] = set()
    dues: list[Due] = []
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
            due = _due(row, as_utc(when))
            if due is not None:
                dues.append(due)
        elif isinstance(row.get(claims.PROBE_PAUSE), Mapping):
            paused.append(row[claims.PROBE_PAUSE])
        elif isinstance(row.get(claims.PROBE_LIVE), int):
            live = row[claims.PROBE_LIVE]
    return Found(
        frozenset(ready), tuple(dues), pauses.read_all(paused) if with_pauses else None, live
    )


def _due(row: Mapping[str, Any], at: datetime) -> Due | None:
    """A due-time answer, or None when it names no collection (nothing to wake)."""
    collection, phase = row.get(claims.PROBE_COLLECTION), row.get(claims.PROBE_PHASE)
    if not isinstance(collection, str):
        return None
    return Due(collection, at, phase if isinstance(phase, str) else None)


def merged(answers: Sequence[Found], sizes: Sequence[int]) -> Found:
    """The answers of a probe read in parts (``claims.probe_chunks``) as one: each part's
    handlers numbered after those of the parts before (``sizes``), every part's due times,
    the pauses and the live replicas of the first."""
    ready: set[int] = set()
    offset = 0
    for answer, size in zip(answers, sizes, strict=True):
        ready.update(offset + n for n in answer.ready)
        offset += size
    first = answers[0]
    dues = tuple(d for a in answers for d in a.dues)
    return Found(frozenset(ready), dues, first.pauses, first.live)
