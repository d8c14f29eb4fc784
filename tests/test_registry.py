"""Registration, without I/O (``orchestrator/core/registry.py``): what a target names, what
is refused at decoration time, and a handler's options resolved against the settings.
The engines' ``phase``/``when`` decorators register through it (``tests/test_config.py``
shows the same through an ``Orchestrator``)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from orchestrator import ConfigError, ExponentialBackoff, ProgressiveBackoff, Resource
from orchestrator.core.queries import claims
from orchestrator.core.registry import Registry, options, resolve
from orchestrator.core.settings import Settings

pytestmark = pytest.mark.pure


class Gateway(Resource):
    collection: ClassVar[str] = "gateways"
    unique: ClassVar[tuple[str, ...]] = ("tenant_id", "name")
    tenant_id: str
    name: str


class Keyed(Resource):
    collection: ClassVar[str] = "keys"
    unique: ClassVar[tuple[str, ...]] = ("id",)


class Nameless(Resource):
    pass


def step(lease: Any) -> None:
    return None


def other_step(lease: Any) -> None:
    return None


@pytest.mark.parametrize("name", ["", "system.profile", "a$b", "a\x00b"])
def test_a_collection_name_the_server_would_refuse_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid collection name"):
        resolve(name)


def test_a_target_is_a_collection_name_or_a_resource_model_naming_one() -> None:
    assert resolve("jobs") == ("jobs", None)
    assert resolve(Gateway) == ("gateways", Gateway)
    with pytest.raises(ConfigError, match=re.escape('Nameless must set `collection = "..."`')):
        resolve(Nameless)
    with pytest.raises(ConfigError, match="expected a collection name or a Resource model"):
        resolve(3)  # type: ignore[arg-type]


def test_options_are_checked_when_the_decorator_runs() -> None:
    assert options({"to": "Done"}).to == ("Done",)
    for bad in ({"max_attemps": 3}, {"max_attempts": 0}, {"to": ["$set"]}, {"to": [""]}):
        with pytest.raises(ConfigError, match="handler options"):
            options(bad)


def test_a_handler_s_options_default_to_the_settings_and_override_them() -> None:
    relock, retry = ProgressiveBackoff(), ExponentialBackoff()
    settings = Settings(max_attempts=4, failed_phase="Dead")
    registry = Registry(settings)
    plain = registry.add(step, "jobs", {"phase": "A"}, "A", options({}))
    assert (plain.max_attempts, plain.failed_phase, plain.to) == (4, "Dead", ())
    assert plain.relock_policy is settings.relock_policy
    assert plain.retry_policy is settings.retry_policy
    own = registry.add(
        other_step,
        "jobs",
        {"phase": "B"},
        "B",
        options(
            {
                "max_attempts": 9,
                "failed_phase": "Broken",
                "relock_policy": relock,
                "retry_policy": retry,
                "to": ["C", "D"],
            }
        ),
    )
    assert (own.max_attempts, own.failed_phase, own.to) == (9, "Broken", ("C", "D"))
    assert own.relock_policy is relock and own.retry_policy is retry
    assert registry.handlers == [plain, own]


def test_a_handler_is_named_by_its_function_and_keyed_by_its_collection_and_filter() -> None:
    handler = Registry(Settings()).add(step, "jobs", {"phase": "A", "kind": 1}, "A", options({}))
    assert handler.name == f"{__name__}:step"
    assert handler.key == "jobs " + json.dumps({"kind": 1, "phase": "A"}, sort_keys=True)
    assert (handler.collection, dict(handler.match), handler.phase) == (
        "jobs",
        {"phase": "A", "kind": 1},
        "A",
    )
    assert handler.model is None
    assert handler.exclusion is None  # its filter pins a phase: never the failed one


def test_a_phaseless_filter_keeps_off_what_the_handler_failed() -> None:
    handler = Registry(Settings()).add(step, "jobs", {"desired": "on"}, None, options({}))
    assert handler.exclusion == claims.failed_exclusion(
        handler.key, f"{__name__}.step", "Failed", {"desired": "on"}
    )
    assert handler.exclusion is not None


def test_one_filter_of_one_collection_has_one_handler() -> None:
    registry = Registry(Settings())
    registry.add(step, "jobs", {"phase": "A", "kind": 1}, "A", options({}))
    with pytest.raises(ConfigError, match=f"{__name__}:step already handles jobs documents"):
        registry.add(other_step, "jobs", {"kind": 1, "phase": "A"}, "A", options({}))
    registry.add(other_step, "mail", {"phase": "A", "kind": 1}, "A", options({}))
    assert [h.collection for h in registry.handlers] == ["jobs", "mail"]


def test_what_is_no_handler_is_refused() -> None:
    async def generator(lease: Any) -> AsyncIterator[None]:
        yield None

    registry = Registry(Settings())
    with pytest.raises(ConfigError, match="a handler must be callable"):
        registry.add(3, "jobs", {"phase": "A"}, "A", options({}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is an async generator; a handler returns"):
        registry.add(generator, "jobs", {"phase": "A"}, "A", options({}))
    with pytest.raises(ConfigError):
        registry.add(step, "jobs", {"lockToken": "x"}, None, options({}))
    assert registry.handlers == []


def test_models_give_their_collections_and_unique_keys_by_stored_name() -> None:
    registry = Registry(Settings())
    registry.add(step, "jobs", {"phase": "A"}, "A", options({}))
    handler = registry.add(step, Gateway, {"phase": "A"}, "A", options({}))
    registry.add_model(Keyed)
    assert handler.model is Gateway and handler.collection == "gateways"
    assert registry.collections == ["jobs", "gateways", "keys"]
    assert registry.model_for("gateways") is Gateway and registry.model_for("jobs") is None
    assert registry.unique == {"gateways": {("tenantId", "name")}}  # `id` is `_id`: unique
    registry.add_unique("jobs", ("ref",))
    assert registry.unique["jobs"] == {("ref",)}
