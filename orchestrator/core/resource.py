"""The document model: a resource's phase, desired state and lease bookkeeping.

Field names in MongoDB are camelCase (``lockedAt``); Python code may use either form.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from orchestrator.core.trees import (
    OWNER_FIELD,
    OWNS_FIELD,
    PROGRESS_FIELD,
    SENT_FIELD,
    SIGNALS_FIELD,
    TAKEN_FIELD,
    WAIT_FIELD,
)

EPOCH = datetime(1970, 1, 1)
"""``lockedUntil`` of a document nobody holds: long past, so claimable at once."""

TRACE_FIELD = "orchestratorTrace"
"""The trace context stored on a document at submit (text keys to text values: W3C
``traceparent``, ``tracestate``), when a listener gives one (``SubmittingEvent``); each of
its steps' ``StepClaimedEvent`` carries it back."""
PRIORITY_FIELD = "claimPriority"
"""Where ``submit(..., priority=N)`` stores a document's priority (``claims.MAX_PRIORITY``)."""
EXPIRY_FIELD = "orchestratorExpiresAt"
"""When the server deletes a document left in a retained phase (``orchestrator.core.
retention``): set by the write that enters the phase, unset by one that leaves it, read
by a TTL index."""

LEASE_FIELDS = frozenset(
    {
        "lockedAt",
        "lockedUntil",
        "lockToken",
        "lastToken",
        "lockedBy",
        "attempts",
        "relocks",
        "lastError",
        "previousError",
        "failedBy",
        "createdAt",
        "orchestratorHistory",
        TRACE_FIELD,
        PRIORITY_FIELD,
        EXPIRY_FIELD,
        OWNER_FIELD,
        OWNS_FIELD,
        PROGRESS_FIELD,
        WAIT_FIELD,
        SIGNALS_FIELD,
        SENT_FIELD,
        TAKEN_FIELD,
    }
)
"""Fields the orchestrator owns: handlers cannot set them through a lease."""


class ErrorRecord(BaseModel):
    """The last failure of a step, kept on the document for operators."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    type: str
    message: str
    at: datetime
    phase: str | None = None


class Resource(BaseModel):
    """Base model of an orchestrated document; subclasses set ``collection``.

    ``unique`` names fields that identify a document: ``ensure_indexes`` makes them unique
    and ``submit`` uses them for idempotent creation. ``shard_key`` names the fields the
    collection is sharded on: every claim, write and delete then names them, so each
    targets one shard (and ``unique`` must start with them).
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    collection: ClassVar[str]
    unique: ClassVar[tuple[str, ...]] = ()
    shard_key: ClassVar[tuple[str, ...]] = ()

    id: Any = Field(default=None, alias="_id")
    phase: str
    state: str | None = None
    locked_at: datetime | None = None
    locked_until: datetime = EPOCH
    created_at: datetime | None = None
    updated_at: datetime | None = None
    lock_token: str | None = None
    locked_by: str | None = None
    attempts: int = 0
    relocks: int = 0
    last_error: ErrorRecord | None = None
    previous_error: ErrorRecord | None = None
    failed_by: str | None = None
    claim_priority: int = 0

    @classmethod
    def field_name(cls, name: str) -> str:
        """The stored name of an attribute: ``custom_domain`` -> ``customDomain``."""
        info = cls.model_fields.get(name)
        if info is not None and info.alias:
            return info.alias
        return name
