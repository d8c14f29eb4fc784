"""Handlers and documents as both engines take them (``orchestrator/runners/registration.py``):
the decorators check everything when they are applied (the engine's own check included) and
give the function back unchanged; a submit's fields and unique keys are decided, and
refused, before any I/O, and the keys it names become the unique indexes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from orchestrator import ConfigError, Resource
from orchestrator.core.registry import Handler, Registry
from orchestrator.core.resource import PRIORITY_FIELD
from orchestrator.core.settings import Settings
from orchestrator.runners.calls import HandlerCalls
from orchestrator.runners.registration import Registration, Submission

pytestmark = pytest.mark.pure


class Gateway(Resource):
    collection: ClassVar[str] = "gateways"
    unique: ClassVar[tuple[str, ...]] = ("tenant_id", "name")
    tenant_id: str
    name: str
    phase: str = "New"


class Tenant(Resource):
    collection: ClassVar[str] = "tenants"
    shard_key: ClassVar[tuple[str, ...]] = ("region",)
    region: str
    phase: str = "New"


class Told:
    """The handler lists a registration reports, in turn."""

    def __init__(self) -> None:
        self.lists: list[list[Handler]] = []

    def __call__(self, handlers: list[Handler]) -> None:
        self.lists.append(handlers)


def registration(
    check: Callable[[Callable[..., Any]], None] = lambda f: None, told: Told | None = None
) -> Registration:
    return Registration(Registry(Settings()), check, told if told is not None else Told())


def step(lease: Any) -> None:
    return None


def other_step(lease: Any) -> None:
    return None


# -- the decorators -------------------------------------------------------------------------


def test_a_decorator_gives_the_function_back_and_reports_every_handler_so_far() -> None:
    told = Told()
    reg = registration(told=told)
    assert reg.phase("jobs", "Running")(step) is step
    assert reg.when("jobs", {"phase": "Sending", "urgent": True})(other_step) is other_step
    first, second = told.lists
    assert [h.func for h in first] == [step]
    assert [h.func for h in second] == [step, other_step]
    assert [(h.collection, h.phase) for h in second] == [("jobs", "Running"), ("jobs", "Sending")]


def test_a_filter_without_a_phase_name_gives_a_phaseless_handler() -> None:
    reg = registration()
    reg.when("jobs", {"phase": {"$in": ["A", "B"]}})(step)
    reg.when("jobs", {"kind": "x"})(other_step)
    assert [h.phase for h in reg.registry.handlers] == [None, None]


@pytest.mark.parametrize("phase", ["", "$set", None, 3])
def test_a_phase_that_is_no_name_is_refused_before_any_function(phase: Any) -> None:
    told = Told()
    reg = registration(told=told)
    with pytest.raises(ConfigError, match="phase must be a non-empty name"):
        reg.phase("jobs", phase)
    assert told.lists == []


def test_a_misspelt_option_is_refused_when_the_decorator_is_made_naming_the_registration() -> None:
    reg = registration()
    with pytest.raises(ConfigError, match=r"jobs \{\"phase\": \"Running\"\}.*max_attemps"):
        reg.phase("jobs", "Running", max_attemps=3)


def test_a_function_the_engine_cannot_run_is_refused_and_nothing_is_registered() -> None:
    told = Told()
    reg = registration(HandlerCalls.check, told)  # the threaded engine's check

    async def awaited(lease: Any) -> None:
        return None

    decorate = reg.phase("jobs", "Running")
    with pytest.raises(ConfigError, match="is async"):
        decorate(awaited)
    assert reg.registry.handlers == [] and told.lists == []
    assert decorate(step) is step  # the same decorator takes a function it can run


def test_a_second_handler_for_the_same_filter_is_refused() -> None:
    told = Told()
    reg = registration(told=told)
    reg.phase("jobs", "Running")(step)
    with pytest.raises(ConfigError, match="already handles"):
        reg.when("jobs", {"phase": "Running"})(other_step)
    assert len(told.lists) == 1


# -- what a submit writes -------------------------------------------------------------------


def test_a_plain_document_is_written_as_given_unique_by_its_id_when_it_has_one() -> None:
    reg = registration()
    assert reg.submission("jobs", {"_id": 1, "phase": "New", "n": 2}, None) == Submission(
        "jobs", {"_id": 1, "phase": "New", "n": 2}, ("_id",)
    )
    assert reg.submission("jobs", {"phase": "New"}, None).keys == ()


def test_a_model_s_declared_unique_keys_are_the_default_by_their_stored_names() -> None:
    reg = registration()
    made = reg.submission(Gateway, Gateway(tenant_id="t1", name="gw", phase="New"), None)
    assert made.collection == "gateways"
    assert made.fields == {"tenantId": "t1", "name": "gw", "phase": "New"}
    assert made.keys == ("tenantId", "name")


def test_describing_a_submission_registers_no_unique_key() -> None:
    reg = registration()
    made = reg.submission("jobs", {"phase": "New", "ref": "r1"}, "ref")
    assert made.named
    assert reg.indexes() == ([], [])


def test_a_document_for_a_model_is_validated_and_stored_by_alias() -> None:
    reg = registration()
    made = reg.submission(Gateway, {"tenant_id": "t1", "name": "gw", "phase": "New"}, None)
    assert made.fields == {"tenantId": "t1", "name": "gw", "phase": "New"}
    with pytest.raises(ConfigError, match="Gateway to submit"):
        reg.submission(Gateway, {"tenant_id": "t1", "phase": "New"}, None)


def test_a_collection_name_takes_the_unique_keys_of_the_model_registered_on_it() -> None:
    reg = registration()
    reg.phase(Gateway, "New")(step)
    made = reg.submission("gateways", {"tenantId": "t1", "name": "gw", "phase": "New"}, None)
    assert made.keys == ("tenantId", "name")


@pytest.mark.parametrize(
    ("unique", "keys"), [("name", ("name",)), (["tenant_id", "name"], ("tenantId", "name"))]
)
def test_unique_keys_named_at_submit_are_stored_names_of_the_model(
    unique: Any, keys: tuple[str, ...]
) -> None:
    reg = registration()
    made = reg.submission(Gateway, {"tenant_id": "t1", "name": "gw", "phase": "New"}, unique)
    assert made.keys == keys


def test_unique_keys_named_at_submit_become_unique_indexes_the_id_default_does_not() -> None:
    reg = registration()
    reg.phase("jobs", "New")(step)
    for target, doc, named in (
        ("jobs", {"_id": 1, "phase": "New"}, None),
        ("jobs", {"phase": "New", "ref": "r1"}, "ref"),
        ("jobs", {"phase": "New", "ref": "r1"}, "ref"),  # once, however often
        ("mail", {"phase": "New", "to": "x", "day": 1}, ["to", "day"]),
    ):
        reg.register_unique_keys(reg.submission(target, doc, named))
    collections, unique = reg.indexes()
    assert collections == ["jobs"]
    assert sorted(unique) == [("jobs", ("ref",)), ("mail", ("to", "day"))]


@pytest.mark.parametrize(
    ("doc", "refusal"),
    [
        ({"n": 1}, "needs a 'phase'"),
        ({"phase": ""}, "needs a 'phase'"),
        ({"phase": "$set"}, "needs a 'phase'"),
        ({"phase": 3}, "needs a 'phase'"),
        ({"phase": "New", "lockedUntil": 0}, r"not_before=\.\.\."),
        ({"phase": "New", PRIORITY_FIELD: 1}, r"priority=\.\.\."),
        ({"phase": "New", "$inc": {"n": 1}}, "starts with '\\$'"),
        ({"phase": "New", "lockedBy": "me"}, "managed by the orchestrator"),
    ],
)
def test_a_document_the_orchestrator_cannot_own_is_refused(
    doc: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal):
        registration().submission("jobs", doc, None)


def test_no_unique_field_named_is_refused() -> None:
    with pytest.raises(ConfigError, match="unique names no field"):
        registration().submission("jobs", {"phase": "New"}, [])


@pytest.mark.parametrize("doc", [["phase", "New"], "phase=New", 3])
def test_a_document_is_a_dict_or_a_resource(doc: Any) -> None:
    with pytest.raises(ConfigError, match="a dict or a Resource"):
        registration().submission("jobs", doc, None)


# -- a sharded collection -------------------------------------------------------------------


def test_a_sharded_document_must_carry_its_shard_key() -> None:
    reg = registration()
    reg.phase(Tenant, "New")(step)  # submits by collection name are not validated
    with pytest.raises(ConfigError, match=r"no value for \['region'\]"):
        reg.submission("tenants", {"phase": "New"}, None)
    with pytest.raises(ConfigError, match=r"no value for \['region'\]"):
        reg.submission("tenants", {"phase": "New", "region": None}, None)


def test_a_sharded_document_s_id_is_unique_with_its_shard_key_first() -> None:
    made = registration().submission(Tenant, {"_id": 1, "region": "eu", "phase": "New"}, None)
    assert made.keys == ("region", "_id")


def test_unique_keys_of_a_sharded_collection_must_start_with_its_shard_key() -> None:
    reg = registration()
    doc = {"region": "eu", "name": "t", "phase": "New"}
    with pytest.raises(ConfigError, match="must start with the shard key"):
        reg.submission(Tenant, doc, "name")
    assert reg.submission(Tenant, doc, ["region", "name"]).keys == ("region", "name")


def test_a_shard_key_declared_by_a_handler_option_holds_for_a_collection_name() -> None:
    reg = registration()
    reg.phase("orders", "New", shard_key=("customer",))(step)
    with pytest.raises(ConfigError, match=r"no value for \['customer'\]"):
        reg.submission("orders", {"phase": "New"}, None)
    made = reg.submission("orders", {"_id": 1, "customer": "c", "phase": "New"}, None)
    assert made.keys == ("customer", "_id")
