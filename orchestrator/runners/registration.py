"""Handlers and documents as both engines take them: the decorators, and what a submit
writes (its fields and unique keys), decided before any I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.core import sharding
from orchestrator.core.errors import ConfigError
from orchestrator.core.queries import submissions
from orchestrator.core.registry import (
    Handler,
    Registry,
    Target,
    key_of,
    model_shard_key,
    options,
    resolve,
)
from orchestrator.core.resource import PRIORITY_FIELD, Resource
from orchestrator.core.validation import explain

__all__ = ["Registration", "Submission"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Submission:
    """A document to create: its collection, its fields, and the keys that make it unique
    (a second submit of the same keys returns the first document)."""

    collection: str
    fields: dict[str, Any]
    keys: tuple[str, ...]
    named: bool = False
    """The keys were named (by ``unique`` or the model): they need a unique index."""


class Registration:
    """The decorators (``phase``, ``when``) and submit's checks, over a ``Registry``.

    ``check`` refuses a function the engine cannot run (the sync one: ``async def``);
    ``registered`` is told the handlers after each registration (the scheduler's)."""

    def __init__(
        self,
        registry: Registry,
        check: Callable[[Callable[..., Any]], None],
        registered: Callable[[list[Handler]], None],
    ) -> None:
        self.registry = registry
        self._check = check
        self._registered = registered

    def phase(self, target: Target, phase: str, **opts: Any) -> Callable[[F], F]:
        if not isinstance(phase, str) or not phase or phase.startswith("$"):
            raise ConfigError(f"phase must be a non-empty name, not {phase!r}")
        return self._decorator(target, {"phase": phase}, phase, opts)

    def when(self, target: Target, match: Mapping[str, Any], **opts: Any) -> Callable[[F], F]:
        phase = match.get("phase") if isinstance(match, Mapping) else None
        return self._decorator(target, match, phase if isinstance(phase, str) else None, opts)

    def retain(self, target: Target, phases: Mapping[str, Any]) -> None:
        self.registry.retain(target, phases)

    def _decorator(
        self, target: Target, match: Mapping[str, Any], phase: str | None, opts: dict[str, Any]
    ) -> Callable[[F], F]:
        collection, _ = resolve(target)
        named = match if isinstance(match, Mapping) else {}
        handler_options = options(opts, key_of(collection, named))

        def decorate(func: F) -> F:
            self._check(func)
            self.registry.add(func, target, match, phase, handler_options)
            self._registered(list(self.registry.handlers))
            return func

        return decorate

    def submission(
        self,
        target: Target,
        doc: Mapping[str, Any] | Resource,
        unique: str | Iterable[str] | None,
    ) -> Submission:
        """What submitting ``doc`` writes, checked, registering nothing; ``unique`` defaults
        to the keys the model declares (``Resource.unique``; for a collection name, those
        of the model registered on it), else to ``_id`` when the document has one. With a
        shard key declared, the document must carry it and the unique keys must start with
        it (``_id`` alone is taken as the shard key and ``_id``)."""
        collection, model = resolve(target)
        fields = _document_fields(doc, model)
        _check_fields(fields)
        declared = model or self.registry.model_for(collection)
        shard_key = self._shard_key(collection, declared)
        absent = [k for k in sharding.missing_fields(fields, shard_key) if k != "_id"]
        if absent:
            raise ConfigError(
                f"submit: the document has no value for {absent}, of {collection!r}'s shard"
                f" key {shard_key!r}"
            )
        keys = _unique_keys(fields, unique, model, declared)
        if shard_key and keys == ("_id",):
            keys = tuple(dict.fromkeys((*shard_key, "_id")))
        if keys:
            sharding.check_unique(keys, shard_key, "submit")
        named = unique is not None or (declared is not None and bool(declared.unique))
        return Submission(collection, fields, keys, named)

    def _shard_key(self, collection: str, declared: type[Resource] | None) -> tuple[str, ...]:
        """The shard key the handlers of ``collection`` declare, else its model's."""
        if known := self.registry.shard_key_for(collection):
            return known
        return model_shard_key(declared) if declared is not None else ()

    def register_unique_keys(self, submission: Submission) -> None:
        """Keys a submit named become unique indexes (``indexes``): the next
        ``ensure_indexes`` builds them. The ``_id`` default is no such name."""
        if submission.named:
            self.registry.add_unique(submission.collection, submission.keys)

    def indexes(self) -> tuple[list[str], list[tuple[str, tuple[str, ...]]]]:
        """The collections needing the claim index, and the unique keys of submit."""
        unique = [
            (collection, keys)
            for collection, key_sets in self.registry.unique.items()
            for keys in key_sets
        ]
        return list(self.registry.collections), unique


def _check_fields(fields: Mapping[str, Any]) -> None:
    """A document the orchestrator can own: a phase, and none of the fields it manages."""
    phase = fields.get("phase")
    if not isinstance(phase, str) or not phase or phase.startswith("$"):
        raise ConfigError("submit: the document needs a 'phase' (a non-empty string)")
    for name, instead in (("lockedUntil", "not_before"), (PRIORITY_FIELD, "priority")):
        if name in fields:
            raise ConfigError(
                f"submit: field {name!r} is managed by the orchestrator; pass"
                f" submit(..., {instead}=...) instead"
            )
    submissions.check_fields(
        {k: v for k, v in fields.items() if k not in {"_id", "phase", "updatedAt"}}
    )


def _unique_keys(
    fields: Mapping[str, Any],
    unique: str | Iterable[str] | None,
    model: type[Resource] | None,
    declared: type[Resource] | None,
) -> tuple[str, ...]:
    """The stored names of the keys that make the document unique: those ``unique`` names
    (by the fields of the ``model`` given), else those the ``declared`` model does, else
    ``_id`` when the document has one."""
    if unique is None and declared is not None and declared.unique:
        return tuple(declared.field_name(k) for k in declared.unique)
    if unique is None:
        return ("_id",) if "_id" in fields else ()
    raw = (unique,) if isinstance(unique, str) else tuple(unique)
    keys = tuple(model.field_name(k) if model else k for k in raw)
    if not keys:
        raise ConfigError("submit: unique names no field")
    return keys


def _document_fields(
    doc: Mapping[str, Any] | Resource, model: type[Resource] | None
) -> dict[str, Any]:
    if isinstance(doc, BaseModel):
        return doc.model_dump(by_alias=True, exclude_unset=True)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"submit: a document is a dict or a Resource, not {type(doc)}")
    if model is None:
        return dict(doc)
    try:
        return model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True)
    except ValidationError as exc:
        raise ConfigError(explain(exc, f"{model.__name__} to submit", model)) from exc
