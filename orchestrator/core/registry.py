"""Which handler claims which documents: kept on each Orchestrator, never global."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from orchestrator.core import queries
from orchestrator.core.backoff import BackoffPolicy
from orchestrator.core.errors import ConfigError
from orchestrator.core.resource import Resource
from orchestrator.core.settings import HandlerOptions, Settings
from orchestrator.core.validation import explain

HandlerFunc = Callable[[Any], Any]
"""A step: takes its lease (``Lease`` or ``AsyncLease``), returns the lease's outcome or
None (an ``async def`` step returns it when awaited)."""
Target = str | type[Resource]


@dataclass(frozen=True, eq=False)
class Handler:
    """A registered step function, with its options resolved against the settings."""

    func: HandlerFunc
    collection: str
    match: Mapping[str, Any]
    phase: str | None
    model: type[Resource] | None
    max_attempts: int
    failed_phase: str
    relock_policy: BackoffPolicy
    retry_policy: BackoffPolicy
    name: str = field(default="")
    to: tuple[str, ...] = ()  # declared transitions; empty: any phase, none drawn
    key: str = ""
    """The registration's identity, written as ``failedBy``: its collection and filter,
    which no two registrations of one orchestrator share (its name may be shared: handlers
    made by one helper function, lambdas) and every replica of the same code agrees on."""
    exclusion: Mapping[str, Any] | None = None
    """The claim's condition that keeps it off what it failed (``queries.failed_exclusion``)."""


def resolve(target: Target) -> tuple[str, type[Resource] | None]:
    """A collection name, or a Resource model and the collection it declares."""
    if isinstance(target, str):
        if not target or target.startswith("system.") or "$" in target or "\x00" in target:
            raise ConfigError(f"invalid collection name {target!r}")
        return target, None
    if isinstance(target, type) and issubclass(target, Resource):
        name = getattr(target, "collection", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f'{target.__name__} must set `collection = "..."`')
        return resolve(name)[0], target
    raise ConfigError(f"expected a collection name or a Resource model, not {target!r}")


def options(given: Mapping[str, Any]) -> HandlerOptions:
    """Validated at decoration time, so a misspelt option fails at import, not at 3 a.m."""
    try:
        return HandlerOptions(**given)
    except ValidationError as exc:
        raise ConfigError(explain(exc, "handler options", HandlerOptions)) from exc


class Registry:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.handlers: list[Handler] = []
        self.models: dict[str, type[Resource]] = {}
        self.unique: dict[str, set[tuple[str, ...]]] = {}
        self._keys: dict[tuple[str, str], Handler] = {}

    @property
    def collections(self) -> list[str]:
        seen = dict.fromkeys(h.collection for h in self.handlers)
        seen.update(dict.fromkeys(self.models))
        return list(seen)

    def add(
        self,
        func: HandlerFunc,
        target: Target,
        match: Mapping[str, Any],
        phase: str | None,
        opts: HandlerOptions,
    ) -> Handler:
        if not callable(func):
            raise ConfigError(f"a handler must be callable, not {func!r}")
        if inspect.isasyncgenfunction(func):
            raise ConfigError(f"{_describe(func)} is an async generator; a handler returns")
        collection, model = resolve(target)
        queries.check_match(match)
        key = (collection, _canonical(match))
        if key in self._keys:
            raise ConfigError(
                f"{_describe(func)}: {self._keys[key].name} already handles "
                f"{collection} documents matching {key[1]}"
            )
        name = _describe(func)
        failed_phase = opts.failed_phase or self._settings.failed_phase
        handler_key = f"{collection} {key[1]}"
        handler = Handler(
            func=func,
            collection=collection,
            match=dict(match),
            phase=phase,
            model=model,
            max_attempts=opts.max_attempts or self._settings.max_attempts,
            failed_phase=failed_phase,
            relock_policy=opts.relock_policy or self._settings.relock_policy,
            retry_policy=opts.retry_policy or self._settings.retry_policy,
            name=name,
            to=opts.to or (),
            key=handler_key,
            exclusion=queries.failed_exclusion(
                handler_key, _describe(func, "."), failed_phase, match
            ),
        )
        self._keys[key] = handler
        self.handlers.append(handler)
        if model is not None:
            self.add_model(model)
        return handler

    def add_model(self, model: type[Resource]) -> None:
        collection, _ = resolve(model)
        self.models.setdefault(collection, model)
        if model.unique:
            self.add_unique(collection, tuple(model.field_name(k) for k in model.unique))

    def add_unique(self, collection: str, keys: tuple[str, ...]) -> None:
        if keys != ("_id",):
            self.unique.setdefault(collection, set()).add(keys)

    def model_for(self, collection: str) -> type[Resource] | None:
        return self.models.get(collection)


def _canonical(match: Mapping[str, Any]) -> str:
    return json.dumps(match, sort_keys=True, default=str)


def _describe(func: Any, separator: str = ":") -> str:
    """``module:function``, as entry points name a function (``module.function`` in the
    ``failedBy`` marks of versions before handler keys, which ``failed_exclusion`` still
    honours)."""
    module = getattr(func, "__module__", "?")
    return f"{module}{separator}{getattr(func, '__qualname__', repr(func))}"
