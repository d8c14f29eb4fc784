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
    from orchestrator.core.lease_values import Outcome
    from orchestrator.core.registry import Handler

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


class StepLease(LeaseInfo[Any], Protocol):
    """What the engines read and set on a step's lease besides what a handler sees
    (``AsyncLease``, ``Lease``): the claim's budget and the replica it took over from."""

    throttled: bool

    @property
    def taken_from(self) -> str | None: ...
