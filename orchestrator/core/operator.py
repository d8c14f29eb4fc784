"""An operator's decisions, made once without I/O for every tool (the command line, the
page, ``orchestrator.operations``): which document an id names, where a retry sends a
document, and whether a replica holds it now.

An id typed as text may name two documents (the string ``"42"`` and the integer ``42``);
its canonical Extended JSON (``id_json``) names exactly one, whatever its type, so it
round-trips through a link, a form or a command line to the very same id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS

from orchestrator.core.errors import OperatorError
from orchestrator.core.queries import as_utc


@dataclass(frozen=True)
class Retried:
    """A retry done: ``document`` after it, sent from ``source`` to ``target``;
    ``at``: the time stamped as ``updatedAt``, the server's unless ``server_time`` is
    False (then this machine's); ``lease_taken``: a replica held it, and lost its lease."""

    document: dict[str, Any]
    source: Any
    target: str
    at: datetime
    server_time: bool
    lease_taken: bool


def error_phase(doc: Mapping[str, Any]) -> str | None:
    """The phase the document's last error happened in, where a retry sends it by default."""
    error = doc.get("lastError")
    phase = error.get("phase") if isinstance(error, dict) else None
    return phase if isinstance(phase, str) and phase else None


def live_lease(doc: Mapping[str, Any], now: datetime) -> bool:
    """Whether a replica holds ``doc`` now: a lease token with a ``lockedUntil`` after
    ``now``, the server's time (as the status counts judge ``leased``). An expired lease
    is no one's: its holder died or is stuck, and any replica may claim it."""
    until = doc.get("lockedUntil")
    return doc.get("lockToken") is not None and isinstance(until, datetime) and as_utc(until) > now


def check_phase_name(target: str) -> None:
    """A retry's target is a phase name: not empty, and no update operator (``$set``)."""
    if not target or target.startswith("$"):
        raise OperatorError(f"{target!r} is not a phase name")


def id_json(doc_id: Any) -> str:
    """``doc_id`` as canonical Extended JSON: exact whatever its type (``42`` is
    ``{"$numberInt": "42"}``, the string ``"42"`` is ``"42"``)."""
    return json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)


def parse_id_json(text: str) -> Any:
    """An id given as Extended JSON (``id_json``'s form; plain JSON too): ``OperatorError``
    when it is not."""
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise OperatorError(f"malformed Extended JSON id {text!r}: {exc}") from None


__all__ = [
    "Retried",
    "check_phase_name",
    "error_phase",
    "id_json",
    "live_lease",
    "parse_id_json",
]
