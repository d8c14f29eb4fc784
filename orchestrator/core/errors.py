"""The exception tree: one root, so callers can catch everything the library raises."""

from __future__ import annotations

from typing import Any

from orchestrator.core.outcomes import LeaseWrite


class OrchestratorError(Exception):
    """Root of every error the orchestrator raises."""


class ConfigError(OrchestratorError, ValueError):
    """Invalid settings, handler registration or call arguments, found before any work."""


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
