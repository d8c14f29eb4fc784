"""What an operator's action did, named for what it is: a document retried (``Retried``)
or cancelled (``Cancelled``), both a ``Moved`` document; and, for an action on every
document of a filter, a ``Bulk`` of the rows changed and of those ``Skipped``, each with
its ``Refusal``: the very value the ``OperatorError`` of a single-document action carries
for the same condition. A cancel says what it did to the documents the cancelled ones own
(``Cascade``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from orchestrator.core.errors import OperatorError, Refusal
from orchestrator.operations.filters import Filter, Row
from orchestrator.operations.rules import Action, Children


@dataclass(frozen=True)
class Descendant:
    """A document a cancel's cascade met: in ``collection``, its id as text (``id``) and
    as canonical Extended JSON (``ref``, exact), owned by ``owner`` (its owner's
    ``collection/id``, as text), in ``phase`` as read."""

    collection: str
    id: str
    ref: str
    owner: str
    phase: str | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Cascade:
    """What a cancel did to the documents the cancelled ones own, and theirs in turn, by
    ``policy``: ``cancelled`` those it sent to the cancelled phase; ``left`` those it
    left as they were (done with already, in a phase no live replica handles; or moving
    on every try to cancel them); ``cut``: it stopped at its bound (``MAX_CASCADE``
    documents), those past it not looked at."""

    policy: Children = Children.CANCEL
    cancelled: tuple[Descendant, ...] = ()
    left: tuple[Descendant, ...] = ()
    cut: bool = False

    def plus(self, other: Cascade) -> Cascade:
        """Both cascades' documents (of a bulk cancel's documents, one after another)."""
        return Cascade(
            self.policy,
            self.cancelled + other.cancelled,
            self.left + other.left,
            self.cut or other.cut,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.value,
            "cancelled": [d.to_dict() for d in self.cancelled],
            "left": [d.to_dict() for d in self.left],
            "cut": self.cut,
        }


@dataclass(frozen=True)
class Moved:
    """A document an operator sent to a phase: ``document`` after it, sent from
    ``source`` to ``target``; ``at``: the time stamped as ``updatedAt``, the server's
    unless ``server_time`` is False (then this machine's); ``lease_taken``: a replica held
    it, and lost its lease; ``action``: which of the two it was."""

    action: ClassVar[Action]
    document: dict[str, Any]
    source: Any
    target: str
    at: datetime
    server_time: bool
    lease_taken: bool


@dataclass(frozen=True)
class Retried(Moved):
    """A retry done: the document sent back to ``target`` with its attempts reset."""

    action: ClassVar[Action] = Action.RETRY


@dataclass(frozen=True)
class Cancelled(Moved):
    """A cancel done: the document sent to the cancelled phase (or the application's own
    cancelling phase), released, its attempts reset; ``cascade``: what was done to the
    documents it owns."""

    action: ClassVar[Action] = Action.CANCEL
    cascade: Cascade = Cascade()


@dataclass(frozen=True)
class Skipped:
    """A document a bulk action left alone: its ``row`` as read, the ``refusal`` (what a
    single-document action raises an ``OperatorError`` of), and ``why``, in words."""

    row: Row
    refusal: Refusal
    why: str

    @classmethod
    def because(cls, row: Row, error: OperatorError) -> Skipped:
        """Left alone for the reason ``error`` gives (raised for one document)."""
        return cls(row, error.refusal, str(error))

    def to_dict(self) -> dict[str, Any]:
        return {**self.row.to_dict(), "why": self.why, "refusal": self.refusal.value}


@dataclass
class Bulk:
    """What an action on every document of a filter did (or, ``dry_run``, would do):
    ``changed`` the documents' rows as they were; ``skipped`` those left alone, each with
    its refusal (held by a live lease, no error phase to retry to, changed meanwhile);
    ``targets``: the phase each changed document was (or would be) sent to, by its row's
    ``ref`` (else ``id``): a retry without ``target`` sends each to its own error phase;
    ``cascade``: a cancel's, of the documents those it changed own (none in a dry run)."""

    action: Action
    filter: Filter
    dry_run: bool
    target: str | None
    changed: list[Row] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    cascade: Cascade = Cascade()

    def target_of(self, row: Row) -> str | None:
        """The phase ``row``'s document was (or would be) sent to."""
        return self.targets.get(row.ref or row.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "filter": self.filter.describe(),
            "dry_run": self.dry_run,
            "target": self.target,
            "changed": [{**row.to_dict(), "to": self.target_of(row)} for row in self.changed],
            "skipped": [skipped.to_dict() for skipped in self.skipped],
            **({"cascade": self.cascade.to_dict()} if self.action is Action.CANCEL else {}),
        }


__all__ = ["Bulk", "Cancelled", "Cascade", "Descendant", "Moved", "Retried", "Skipped"]
