"""The lease a handler is handed, as the types to annotate it with.

A plain ``def`` handler gets a ``Lease`` from the threaded ``Orchestrator`` and a
``ThreadLease`` from the ``AsyncOrchestrator`` (a view on the step's ``AsyncLease``, which
has no sync store to write through): two classes, one API. ``BlockingLease`` is that API:
annotate a ``def`` handler ``BlockingLease[Model]`` and it type-checks on both engines
(an ``async def`` one takes an ``AsyncLease[Model]``). ``LeaseInfo`` is what every lease
shows, whichever engine runs it; ``StepLease`` adds what the engines read and set.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from orchestrator.core.documents import Document
    from orchestrator.core.lease_values import Outcome
    from orchestrator.core.registry import Handler, Target
    from orchestrator.core.resource import Resource
    from orchestrator.core.trees import Owner, Signal

__all__ = ["BlockingLease", "LeaseInfo", "StepLease"]

R_co = TypeVar("R_co", covariant=True)


@runtime_checkable
class LeaseInfo(Protocol[R_co]):
    """What a lease says about itself and its step."""

    @property
    def doc(self) -> dict[str, Any]:
        """The claimed document as stored."""

    @property
    def resource(self) -> R_co:
        """The document validated by the handler's model (``doc`` for a collection name)."""

    @property
    def handler(self) -> Handler: ...

    @property
    def token(self) -> str: ...

    @property
    def id(self) -> Any: ...

    @property
    def collection(self) -> str: ...

    @property
    def phase(self) -> str | None: ...

    @property
    def held(self) -> bool:
        """True until the lease is released or found lost."""

    @property
    def lost(self) -> bool:
        """True once a write found the document held by another lease."""

    @property
    def outcome(self) -> Outcome | None:
        """The step's own outcome, once one landed."""

    @property
    def claimed_at(self) -> datetime: ...

    @property
    def locked_at(self) -> datetime: ...

    @property
    def expires_at(self) -> datetime: ...

    def expired(self, now: datetime) -> bool:
        """True once the lease's expiry has passed."""


@runtime_checkable
class BlockingLease(LeaseInfo[R_co], Protocol[R_co]):
    """A ``def`` handler's lease on either engine (``Lease``, ``ThreadLease``): each outcome
    blocks until its write landed."""

    def unlock(self, **fields: Any) -> Outcome:
        """Step done, more to do: release now so the next step can be claimed at once."""

    def relock(self, wait: float | None = None, **fields: Any) -> Outcome:
        """Waiting on something outside: release, claimable again after ``wait`` seconds."""

    def advance(self, phase: str, **fields: Any) -> Outcome:
        """Enter ``phase`` (setting ``fields`` with it) and release at once."""

    def fail(self, reason: str) -> Outcome:
        """Give up now: the failed phase, with ``reason`` recorded."""

    def remove(self) -> Outcome:
        """Delete the document (the end of its life)."""

    def extend(self) -> None:
        """Renew the lease for another lock timeout."""

    def progress(self, fraction: float, note: str | None = None) -> None:
        """Say how far the step is (0 to 1), rate-limited, fenced."""

    @property
    def cancel_requested(self) -> bool:
        """An operator moved or deleted the document while the step runs."""

    @property
    def owner(self) -> Owner | None:
        """The document that owns this one (its parent), or None."""

    @property
    def signals(self) -> list[Signal]:
        """The signals sent to this document, oldest first."""

    def signal(self, name: str) -> Signal | None:
        """The latest signal named ``name``, or None."""

    def create_child(
        self, target: Target, name: str, doc: Mapping[str, Any] | Resource
    ) -> Document:
        """Make the child ``name`` of this document unless it is there; it as stored."""

    def children(self) -> list[Document]:
        """This document's children, whatever their phase."""

    def move_children(self, phase: str) -> int:
        """Send its children not in ``phase`` there; how many."""

    def wait_for(
        self, name: str, *, then: str, timeout: Any = None, on_timeout: str | None = None
    ) -> Outcome:
        """Release until a signal ``name`` comes, then enter ``then``."""

    def wait_for_children(
        self,
        *,
        then: str,
        need: Any = "all",
        on_failure: str | None = None,
        cancel_siblings: bool = False,
        timeout: Any = None,
        on_timeout: str | None = None,
    ) -> Outcome:
        """Release until its children have ended, then enter ``then``."""


class StepLease(LeaseInfo[Any], Protocol):
    """What the engines read and set on a step's lease besides what a handler sees
    (``AsyncLease``, ``Lease``): the claim's budget and the replica it took over from."""

    throttled: bool

    @property
    def taken_from(self) -> str | None: ...
