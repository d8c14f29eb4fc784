"""The exception tree: one root, so callers can catch everything the library raises."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from orchestrator.core.outcomes import LeaseWrite


class OrchestratorError(Exception):
    """Root of every error the orchestrator raises."""


class ConfigError(OrchestratorError, ValueError):
    """Invalid settings, handler registration or call arguments, found before any work."""


class ShardKeyRequired(ConfigError):
    """A sharded collection the orchestrator was not told the shard key of (or was told a
    wrong one): its claims would be refused on MongoDB before 8.0, or sent to every shard
    after. The message names the fix. A store that raised it for a collection claims
    nothing more there: the error is said once, not at every tick."""


class StoreError(OrchestratorError):
    """The database failed an operation; ``transient`` says whether a retry may succeed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class LeaseLost(OrchestratorError):
    """A write under a lease matched nothing: another replica holds the document now,
    or this lease was already released. The step's outcome is dropped; ``action`` is the
    write that was refused."""

    def __init__(
        self,
        collection: str,
        doc_id: Any,
        token: str,
        action: LeaseWrite,
        reason: str = "another replica holds it now, or its phase was changed from outside",
    ) -> None:
        super().__init__(
            f"lease {token[:8]} on {collection}/{doc_id} is no longer held ({reason}); "
            f"{action} dropped"
        )
        self.collection = collection
        self.doc_id = doc_id
        self.token = token
        self.action = action


class Refusal(StrEnum):
    """Why an operator's action was not carried out: one value for one document (the
    ``OperatorError`` it raises carries it as ``refusal``) and for each document a bulk
    action leaves alone (its ``Skipped`` carries it), so a tool tells them apart by value,
    never by the words."""

    MALFORMED = "malformed"
    """The request itself: no phase name, no field, an id or cursor that does not parse."""
    NOT_FOUND = "not_found"
    """No document has that id (any more)."""
    AMBIGUOUS_ID = "ambiguous_id"
    """The id typed names more than one document."""
    CHANGED = "changed"
    """The document moved since it was read (its phase, its lease, or out of the filter)."""
    LEASE_HELD = "lease_held"
    """A replica holds it now, and the action was not forced."""
    UNHANDLED_PHASE = "unhandled_phase"
    """No live replica handles the phase it would be sent to."""
    UNHANDLED_SCOPE = "unhandled_scope"
    """A pause of a collection, phase or handler no live replica has, and not forced."""
    NO_ERROR_PHASE = "no_error_phase"
    """A retry without a phase, of a document with no recorded error to take one from."""
    ALREADY_FREE = "already_free"
    """An unlock of a document no lease holds and no wait keeps."""
    UNINDEXED_FIELD = "unindexed_field"
    """A filter on a field no index starts with."""
    NO_UNIQUE_KEY = "no_unique_key"
    """A business key given where no live replica declares one."""
    TOO_MANY = "too_many"
    """A bulk action's filter selects more documents than it may change at once."""


class OperatorError(OrchestratorError):
    """An operator's request that cannot be carried out as asked (``orchestrator.operations``):
    malformed input here; the subclasses say which document is not as the request says.
    ``refusal``: which refusal it is, as a bulk action records it for each document."""

    refusal: Refusal = Refusal.MALFORMED

    def __init__(self, message: str, *, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        if refusal is not None:
            self.refusal = refusal


class DocumentNotFound(OperatorError):
    """No document has the id the operator gave (``shown``: that id as they gave it)."""

    refusal = Refusal.NOT_FOUND

    def __init__(self, collection: str, shown: str) -> None:
        super().__init__(f"no document {shown} in collection {collection!r}")
        self.collection = collection
        self.shown = shown


class AmbiguousId(OperatorError):
    """An id typed as text names more than one document (the string ``"42"`` and the
    integer ``42``): ``documents`` are those it names, for the operator to choose from."""

    refusal = Refusal.AMBIGUOUS_ID

    def __init__(self, collection: str, typed: str, documents: list[dict[str, Any]]) -> None:
        super().__init__(f"{typed!r} names more than one document in {collection!r}")
        self.collection = collection
        self.typed = typed
        self.documents = documents


class DocumentChanged(OperatorError):
    """The document moved since the operator saw it (another operator, a replica or the
    application changed its phase or its lease): nothing was done."""

    refusal = Refusal.CHANGED

    def __init__(self, collection: str, doc_id: Any) -> None:
        super().__init__(f"{collection}/{doc_id} changed since it was read: nothing was done")
        self.collection = collection
        self.doc_id = doc_id


class LeaseHeld(OperatorError):
    """A retry refused because a replica holds the document's lease now: retrying would let
    another replica run its step while that one is still in it (``force`` allows it)."""

    refusal = Refusal.LEASE_HELD

    def __init__(self, collection: str, doc_id: Any, holder: Any, until: Any) -> None:
        super().__init__(
            f"{collection}/{doc_id} is held by a live lease of replica {holder!r} until {until}"
        )
        self.collection = collection
        self.doc_id = doc_id
        self.holder = holder
        self.until = until


class UnhandledPhase(OperatorError):
    """A retry or cancel to a phase no live replica handles (nor leaves documents in on
    purpose): the document would sit there, unclaimed, looking ordinary. ``handled``: the
    phases they do handle. Forcing it is the operator's explicit choice."""

    refusal = Refusal.UNHANDLED_PHASE

    def __init__(self, collection: str, target: str, handled: list[str], why: str) -> None:
        shown = ", ".join(handled) or "none"
        super().__init__(
            f"no live replica handles phase {target!r} of {collection!r} ({why}); "
            f"the phases they handle: {shown}"
        )
        self.collection = collection
        self.target = target
        self.handled = handled


class UnhandledScope(OperatorError):
    """A pause of a collection, phase or handler no live replica has: most likely a typo,
    which would pause nothing while looking done. ``unknown``: what it names that they
    lack, in words; ``known``: what they have there (None: no replica is live to ask).
    Forcing it is the operator's explicit choice (a pause holds for replicas started later
    too)."""

    refusal = Refusal.UNHANDLED_SCOPE

    def __init__(self, scope: str, unknown: str, known: list[str] | None, why: str) -> None:
        if known is None:
            super().__init__(f"{scope}: {unknown} ({why})")
        else:
            super().__init__(f"{unknown} ({why}); they have: {', '.join(known) or 'none'}")
        self.scope = scope
        self.unknown = unknown
        self.known = known or []


class NoErrorPhase(OperatorError):
    """A retry that names no phase, of a document with no recorded error to take it from."""

    refusal = Refusal.NO_ERROR_PHASE

    def __init__(self, collection: str, doc_id: Any) -> None:
        super().__init__(
            f"{collection}/{doc_id} has no recorded error phase (nor a previous one): name the"
            " phase to send it to"
        )
        self.collection = collection
        self.doc_id = doc_id
