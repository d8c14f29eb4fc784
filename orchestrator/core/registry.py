"""Which handler claims which documents: kept on each Orchestrator, never global."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from orchestrator.core import limits, retention, sharding
from orchestrator.core.backoff import BackoffPolicy
from orchestrator.core.errors import ConfigError
from orchestrator.core.queries import claims
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
    """The claim's condition that keeps it off what it failed (``claims.failed_exclusion``)."""
    shard_key: tuple[str, ...] = ()
    """The fields its collection is sharded on, as declared (every write names them)."""
    plan: sharding.ClaimPlan = sharding.SORTED
    """How its claim finds a document (the replica's strategy; peeking with a shard key)."""
    limits: tuple[limits.Limit, ...] = ()
    """Its cluster-wide limits (``global_limit``, ``rate_limit``): a slot of each is taken
    before each of its claims (``orchestrator.core.limits``); none, no extra round trip."""


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


def options(given: Mapping[str, Any], handler: str | None = None) -> HandlerOptions:
    """Validated at decoration time, so a misspelt option fails at import, not at 3 a.m.;
    ``handler`` names the registration in the refusal (its collection and filter)."""
    try:
        return HandlerOptions(**given)
    except ValidationError as exc:
        what = "handler options" if handler is None else f"handler options of {handler}"
        raise ConfigError(explain(exc, what, HandlerOptions)) from exc


class Registry:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.handlers: list[Handler] = []
        self.models: dict[str, type[Resource]] = {}
        self.unique: dict[str, set[tuple[str, ...]]] = {}
        self._keys: dict[tuple[str, str], Handler] = {}
        self._shard_keys: dict[str, tuple[tuple[str, ...], str]] = {}
        """Per collection: its shard key, and the handler (or model) that set it first."""
        self.retention: dict[str, retention.Retention] = {}
        """Per collection, how long documents stay in its retained phases (``retain``);
        the replica's leases read it as it is at their write."""

    @property
    def collections(self) -> list[str]:
        seen = dict.fromkeys(h.collection for h in self.handlers)
        seen.update(dict.fromkeys(self.models))
        return list(seen)

    def retain(self, target: Target, phases: Any) -> None:
        """Keep documents of ``target`` in the phases named for as long as each says, then
        let the server delete them (``orchestrator.core.retention``); checked here."""
        collection, model = resolve(target)
        checked = retention.check(collection, phases)
        if model is not None:
            self.add_model(model)
        known = self.retention.get(collection, retention.NO_RETENTION)
        self.retention[collection] = retention.merged(collection, known, checked)

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
        claims.check_match(match)
        key = (collection, _canonical(match))
        if key in self._keys:
            raise ConfigError(
                f"{_describe(func)}: {self._keys[key].name} already handles "
                f"{collection} documents matching {key[1]}"
            )
        name = _describe(func)
        failed_phase = opts.failed_phase or self._settings.failed_phase
        handler_key = f"{collection} {key[1]}"
        shard_key = self._agreed(collection, self._declared(name, model, opts.shard_key), name)
        settings = self._settings
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
            exclusion=claims.failed_exclusion(
                handler_key, _describe(func, "."), failed_phase, match
            ),
            shard_key=shard_key,
            plan=sharding.plan(
                strategy=settings.claim_strategy,
                shard_key=shard_key,
                candidates=settings.claim_candidates,
                replica_id=settings.replica_id,
                tick=settings.tick,
                key=handler_key,
            ),
            limits=limits.limits_of(opts.global_limit, opts.rate_limit),
        )
        if model is not None:
            self.add_model(model)
        self._shard_keys.setdefault(collection, (shard_key, name))
        self._keys[key] = handler
        self.handlers.append(handler)
        return handler

    def add_model(self, model: type[Resource]) -> None:
        collection, _ = resolve(model)
        keys = tuple(model.field_name(k) for k in model.unique)
        if keys:
            sharding.check_unique(keys, model_shard_key(model), model.__name__)
        self.models.setdefault(collection, model)
        if keys:
            self.add_unique(collection, keys)

    def add_unique(self, collection: str, keys: tuple[str, ...]) -> None:
        """Keys that hold ``_id`` need no index of their own: the ``_id`` index keeps them
        unique (on a sharded collection, within the one shard their shard key prefix
        names)."""
        sharding.check_unique(keys, self.shard_key_for(collection), f"unique keys of {collection}")
        if "_id" not in keys:
            self.unique.setdefault(collection, set()).add(keys)

    def shard_key_for(self, collection: str) -> tuple[str, ...]:
        """The shard key the handlers of ``collection`` declare (() if none)."""
        known = self._shard_keys.get(collection)
        return known[0] if known is not None else ()

    def _declared(
        self, name: str, model: type[Resource] | None, option: tuple[str, ...] | None
    ) -> tuple[str, ...] | None:
        """The shard key a registration declares (its option, or its model's), checked;
        None when it declares none."""
        own = model_shard_key(model) if model is not None else ()
        if option is None:
            return own or None
        given = sharding.check_shard_key(option, name)
        if model is not None:
            given = tuple(model.field_name(k) for k in given)
            if own and own != given:
                raise ConfigError(
                    f"{name}: shard_key={given!r}, but {model.__name__}.shard_key is {own!r}"
                )
        return given

    def _agreed(
        self, collection: str, declared: tuple[str, ...] | None, who: str
    ) -> tuple[str, ...]:
        """One shard key per collection: a registration that declares none takes the one
        declared before it; one that declares another is refused, naming both."""
        known = self._shard_keys.get(collection)
        if known is None:
            key = declared or ()
            for keys in self.unique.get(collection, ()):
                sharding.check_unique(keys, key, f"unique keys of {collection}")
            return key
        key, first = known
        if declared is None or declared == key:
            return key
        said = f"shard_key={key!r}" if key else "no shard key"
        raise ConfigError(
            f"{who} declares shard_key={declared!r} for {collection!r}, but {first} was"
            f" registered on it with {said}: a collection has one shard key (declare it on"
            " its model, or alike on every handler)"
        )

    def model_for(self, collection: str) -> type[Resource] | None:
        return self.models.get(collection)


def model_shard_key(model: type[Resource]) -> tuple[str, ...]:
    """A model's declared shard key, checked, in stored field names (() if none)."""
    if not model.shard_key:
        return ()
    fields = sharding.check_shard_key(model.shard_key, f"{model.__name__}.shard_key")
    return tuple(model.field_name(k) for k in fields)


def key_of(collection: str, match: Mapping[str, Any]) -> str:
    """The key a registration on ``collection`` with ``match`` gets (``Handler.key``)."""
    return f"{collection} {_canonical(match)}"


def _canonical(match: Mapping[str, Any]) -> str:
    return json.dumps(match, sort_keys=True, default=str)


def _describe(func: Any, separator: str = ":") -> str:
    """``module:function``, as entry points name a function (``module.function`` in the
    ``failedBy`` marks of versions before handler keys, which ``failed_exclusion`` still
    honours)."""
    module = getattr(func, "__module__", "?")
    return f"{module}{separator}{getattr(func, '__qualname__', repr(func))}"
