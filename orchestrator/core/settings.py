"""Settings: one validated model, built explicitly and passed in.

Nothing is read from the environment here; the CLI builds settings from its own options.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.backoff import BackoffPolicy, ExponentialBackoff, ProgressiveBackoff
from orchestrator.core.errors import ConfigError
from orchestrator.core.history import DEFAULT_HISTORY, DEFAULT_TRACEBACK, MAX_HISTORY
from orchestrator.core.in_house import InHouse
from orchestrator.core.limits import MAX_SLOTS, parse_rate
from orchestrator.core.names import (
    AUDIT_COLLECTION,
    PAUSES_COLLECTION,
    REPLICAS_COLLECTION,
    SCHEDULES_COLLECTION,
    SLOTS_COLLECTION,
)
from orchestrator.core.validation import explain

DAY = 86_400.0
MAX_LOCK_TIMEOUT = DAY
"""No lease lasts longer. A longer step keeps its lease with the heartbeat."""
MAX_DURATION = 30 * DAY
"""Longest wait or step: keeps every date the library computes far inside datetime's range."""
HORIZON = MAX_DURATION + DAY
"""A ``lockedUntil`` further ahead than this is no lease or wait any replica writes,
whatever its settings (a wait is at most ``MAX_DURATION``, a lease at most
``MAX_LOCK_TIMEOUT``; a day more for clocks that disagree), so it counts as free. One
constant for every reader: a bound from the reader's own settings (its ``max_wait``) made
a replica with a shorter one cut short the long waits another wrote."""
HISTORY_BYTES = 4 * 2**20
"""Most a document's history may hold, so it never pushes an application's document past
MongoDB's 16 MiB (a write refused as too large would leave the step's outcome unwritten)."""
ENTRY_BYTES = 2500
"""A history entry's size without its traceback, at most (its error message is cut at 2000
characters)."""
DEFAULT_DATABASE = "orchestrator"
"""The database every tool uses when none is named (a URI without a path, no ``--db``): the
CLI, the demo, the worker, the example API server, the in-memory stores and the quickstart
all default to this one name, so each finds what another wrote."""


def default_replica_id() -> str:
    """Host, process and a random suffix: unique even for two replicas in one process."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Settings(BaseModel):
    """Every knob of a replica. Times are in seconds.

    Besides each field's own bounds, the fields must agree (``ConfigError`` otherwise):

    - ``tick`` at most ``lock_timeout``: a lease must not expire between two ticks;
    - ``step_timeout`` (when set) at least ``lock_timeout``: a step is given its whole lease
      to run in, and ``step_timeout`` stops one the heartbeat keeps extending past it;
    - ``history`` entries of up to ``traceback_chars`` each keep at most 4 MiB on a
      document (MongoDB holds 16 MiB in all);
    - ``cancelled_phase`` differs from ``failed_phase``;
    - ``min_relock`` (when set) at most ``max_wait``;
    - ``write_concern`` ``"majority"`` or a node count of at least 1;
    - ``legacy_lock_timeout`` in whole milliseconds, as the old pods' ``lockedAt`` is.
    """

    # An infinite lock_timeout or max_wait would make a lease that never expires.
    model_config = ConfigDict(
        extra="forbid", frozen=True, arbitrary_types_allowed=True, allow_inf_nan=False
    )

    lock_timeout: float = Field(
        30.0, gt=0, le=MAX_LOCK_TIMEOUT, description="How long a lease lasts unless extended."
    )
    legacy_lock_timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_LOCK_TIMEOUT,
        description="During a rolling migration from the in-house pattern (claim with"
        " lockedAt < now - timeout, unlock to the epoch): the old pods' lock timeout. While"
        " set, a document whose lockedAt is later than now minus it is held, and every"
        " lease this replica writes carries the lockedAt an old pod reads the same way;"
        " None (after the last old pod stopped): lockedUntil alone decides.",
    )
    tick: float = Field(1.0, gt=0, description="Seconds between two ticks of the loop.")
    tick_jitter: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="Each tick comes up to this fraction of a tick late, at random, and a"
        " replica's first scheduled tick at a random point of its first tick: replicas"
        " started together do not poll together.",
    )
    max_concurrency: int = Field(
        4, ge=1, le=1024, strict=True, description="Steps run at once per replica."
    )
    max_attempts: int = Field(
        5, ge=1, strict=True, description="Failed attempts before the failed phase."
    )
    failed_phase: str = Field(
        "Failed",
        min_length=1,
        description="Where a document goes when its step failed max_attempts times (the"
        " library gave up; orchestrator retry sends it back); no handler should take it.",
    )
    cancelled_phase: str = Field(
        "Cancelled",
        min_length=1,
        description="Where an operator's cancel sends a document (orchestrator cancel); no"
        " handler should take it, like the failed phase.",
    )
    history: int = Field(
        DEFAULT_HISTORY,
        ge=0,
        le=MAX_HISTORY,
        strict=True,
        description="Entries of each document's history kept on it (orchestratorHistory):"
        " one per step and per operator's action, carried by the write the step or action"
        " makes anyway; 0 keeps none.",
    )
    traceback_chars: int = Field(
        DEFAULT_TRACEBACK,
        ge=0,
        le=100_000,
        strict=True,
        description="Characters of a failed step's traceback kept with its error (its"
        " end, redacted); 0 keeps none.",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=200,
        description="This replica's name: in every lease it writes (lockedBy), its record"
        " (orchestrator status), every log line, the history and the audit trail; unique per"
        " replica. By default (or None) host-pid-random: the host name, the process id and a"
        " random suffix.",
    )
    write_concern: Literal["majority"] | int = Field(
        "majority", description='Write concern of lease writes: "majority" or a node count.'
    )
    write_timeout: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Seconds a write waits for its write concern (wtimeout); past it the"
        " write fails as a transient error instead of blocking while no majority is up.",
    )
    clock_refresh: float = Field(
        60.0, gt=0, le=MAX_DURATION, description="Re-measure the server clock this often."
    )
    skew_tolerance: float = Field(
        60.0,
        ge=0,
        le=DAY,
        description="Only when the server reports no time: the clock skew between replicas"
        " that leases stay safe against; every lease is then judged this much later.",
    )
    heartbeat: bool = Field(True, description="Extend leases of steps running past half a timeout.")
    step_timeout: float | None = Field(
        300.0,
        gt=0,
        le=MAX_DURATION,
        description="A step running longer loses its lease and counts as a failed attempt;"
        " None: no limit. At least lock_timeout: a step is given its whole lease to run"
        " in, and step_timeout stops one the heartbeat keeps extending past it.",
    )
    max_wait: float = Field(
        3600.0, gt=0, le=MAX_DURATION, description="Cap on any relock or retry wait."
    )
    progress_interval: float = Field(
        1.0,
        ge=0,
        le=MAX_DURATION,
        description="A step's lease.progress() writes at most once per this many seconds;"
        " the latest unwritten one goes with the step's outcome.",
    )
    max_unlocks_per_tick: int = Field(
        100,
        ge=1,
        le=1_000_000,
        strict=True,
        description="Claims of one document per tick; past it, whatever the step's outcome"
        " (unlock, advance, fail), the document waits a tick: no handler can spin the database.",
    )
    min_relock: float | None = Field(
        None,
        ge=0,
        le=MAX_DURATION,
        description="Floor of a relock's wait; defaults to one tick, so none spins.",
    )
    replicas_collection: str = Field(
        REPLICAS_COLLECTION,
        min_length=1,
        max_length=120,
        description="Where each replica records itself while it runs (orchestrator status"
        " lists them); every replica of a deployment, and its tools, must name the same one.",
    )
    pauses_collection: str = Field(
        PAUSES_COLLECTION,
        min_length=1,
        max_length=120,
        description="Where operators' pauses are kept (orchestrator pause); read at every"
        " heartbeat, never at a tick.",
    )
    audit_collection: str = Field(
        AUDIT_COLLECTION,
        min_length=1,
        max_length=120,
        description="The audit trail (operators' actions, leases taken over from dead"
        " replicas), each entry deleted 90 days on by a TTL index.",
    )
    slots_collection: str = Field(
        SLOTS_COLLECTION,
        min_length=1,
        max_length=120,
        description="Where the slots of handlers with a global_limit or a rate_limit are"
        " kept (one small document per unit of each limit); every replica of a deployment"
        " must name the same one.",
    )
    schedules_collection: str = Field(
        SCHEDULES_COLLECTION,
        min_length=1,
        max_length=120,
        description="Where each schedule (@orch.schedule) keeps its document: its spec, its"
        " next fire, its counts; every replica of a deployment must name the same one.",
    )
    claim_strategy: Literal["auto", "sorted", "peek"] = Field(
        "auto",
        description="How a claim finds its document: sorted (one findAndModify takes the"
        " longest-free document; every replica aims at the same one), peek (read the"
        " claim_candidates longest-free, then claim one by its _id, each replica starting"
        " at its own place in the list), or auto: sorted below 50 live replicas, peek from"
        " 50 (as the fleet model chose, docs/scale.md). A collection with a declared shard"
        " key always peeks.",
    )
    claim_candidates: int = Field(
        32,
        ge=1,
        le=1000,
        strict=True,
        description="Documents one peek reads (their _id and shard key); they serve the"
        " claims of up to one tick.",
    )
    relock_policy: BackoffPolicy = Field(
        default_factory=ProgressiveBackoff,
        description="The wait of each relock (a step that waits for something outside),"
        " from the time the document has spent in its phase and the relocks so far;"
        " floored by min_relock, capped by max_wait.",
    )
    retry_policy: BackoffPolicy = Field(
        default_factory=ExponentialBackoff,
        description="The wait before each retry of a failed attempt, from the attempts so"
        " far; capped by max_wait.",
    )

    @field_validator(
        "replicas_collection",
        "pauses_collection",
        "audit_collection",
        "slots_collection",
        "schedules_collection",
    )
    @classmethod
    def _collection_name(cls, value: str) -> str:
        if value.startswith("system.") or "$" in value or "\x00" in value:
            raise ValueError("a collection name has no '$' or NUL and is not system.*")
        return value

    @field_validator("replica_id", mode="before")
    @classmethod
    def _default_replica_id(cls, value: Any) -> Any:
        """None is the documented default, not a refusal: ``replica_id=None`` passed on by
        an application that sets it only sometimes."""
        return default_replica_id() if value is None else value

    @field_validator("legacy_lock_timeout")
    @classmethod
    def _whole_milliseconds(cls, value: float | None) -> float | None:
        """Old pods stamp ``lockedAt`` in milliseconds: a finer timeout names moments no
        stamp can, so the lease a replica writes and the one its fence names could differ."""
        if value is not None and abs(value * 1000 - round(value * 1000)) > 1e-6:
            raise ValueError(f"must be whole milliseconds (as lockedAt is), not {value!r}")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.tick > self.lock_timeout:
            raise ValueError(
                f"tick ({self.tick}s) must not exceed lock_timeout ({self.lock_timeout}s): "
                "a lease would expire between two ticks"
            )
        if self.step_timeout is not None and self.step_timeout < self.lock_timeout:
            raise ValueError(
                f"step_timeout ({self.step_timeout:g}s) must be at least lock_timeout"
                f" ({self.lock_timeout:g}s): a step is given its whole lease to run in, and"
                " step_timeout stops one the heartbeat keeps extending past it"
            )
        if self.history * (self.traceback_chars + ENTRY_BYTES) > HISTORY_BYTES:
            raise ValueError(
                f"history ({self.history}) x traceback_chars ({self.traceback_chars}) may keep"
                f" {self.history * (self.traceback_chars + ENTRY_BYTES) / 2**20:.1f} MiB on a"
                f" document (MongoDB holds 16 MiB in all); keep it under"
                f" {HISTORY_BYTES / 2**20:g} MiB: fewer entries or shorter tracebacks"
            )
        if self.cancelled_phase == self.failed_phase:
            raise ValueError("cancelled_phase must differ from failed_phase")
        if self.min_relock is not None and self.min_relock > self.max_wait:
            raise ValueError("min_relock must not exceed max_wait")
        if isinstance(self.write_concern, int) and self.write_concern < 1:
            raise ValueError("write_concern must be 'majority' or a node count >= 1")
        return self

    @property
    def relock_floor(self) -> float:
        return min(self.tick if self.min_relock is None else self.min_relock, self.max_wait)

    @property
    def in_house(self) -> InHouse:
        """``legacy_lock_timeout`` as the object every judgement and write of the in-house
        leases goes through."""
        return InHouse(self.legacy_lock_timeout)

    @property
    def horizon(self) -> float:
        """``HORIZON``: the same for every replica, whatever its settings."""
        return HORIZON

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Validate, raising ``ConfigError`` (a ``ValueError``) that names every bad field."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(explain(exc, "orchestrator settings", cls)) from exc


class HandlerOptions(BaseModel):
    """Per-handler overrides of the replica's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    max_attempts: int | None = Field(
        None, ge=1, description="The handler's own Settings.max_attempts (None: the replica's)."
    )
    failed_phase: str | None = Field(
        None,
        min_length=1,
        description="The handler's own Settings.failed_phase (None: the replica's).",
    )
    relock_policy: BackoffPolicy | None = Field(
        None, description="The handler's own Settings.relock_policy (None: the replica's)."
    )
    retry_policy: BackoffPolicy | None = Field(
        None, description="The handler's own Settings.retry_policy (None: the replica's)."
    )
    to: tuple[str, ...] | None = Field(
        None,
        description="Phases the handler may advance to: drawn by `orchestrator graph`,"
        " and any other advance is refused.",
    )
    shard_key: tuple[str, ...] | None = Field(
        None,
        description="The fields the collection is sharded on (a handler registered on a"
        " collection name; a model says it as `shard_key`): every claim, write and delete"
        " then names them and targets one shard.",
    )
    global_limit: int | None = Field(
        None,
        ge=1,
        le=MAX_SLOTS,
        strict=True,
        description="At most this many of the handler's steps run at once across every"
        " replica (a slot per step, held as long as its lease).",
    )
    rate_limit: str | None = Field(
        None,
        description="At most this many of the handler's steps start per period across every"
        ' replica: "10/minute" (N/second, N/minute or N/hour; N/s, N/min, N/h).',
    )

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rate(value)
        return value

    @field_validator("to", "shard_key", mode="before")
    @classmethod
    def _one_phase(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _phase_names(self) -> Self:
        for phase in self.to or ():
            if not phase or phase.startswith("$"):
                raise ValueError(f"to: {phase!r} is not a phase name")
        return self
