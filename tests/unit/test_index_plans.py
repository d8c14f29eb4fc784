"""How a store gets the index it needs (``orchestrator/mongo/index_plans.py``), decided from
the indexes read: an equivalent one is reused whatever its name, an earlier version's is
replaced, and one on the same keys that cannot do the job is refused, naming it."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import ConfigError
from orchestrator.mongo.index_plans import IndexPlan, index_options, index_problem, plan_index

pytestmark = pytest.mark.pure

WANTED = [("phase", 1), ("lockedUntil", 1)]


def plan(existing: list[dict[str, Any]], *, unique: bool = False) -> IndexPlan:
    return plan_index("jobs", existing, WANTED, index_name="ours", unique=unique, collation=None)


def test_an_equivalent_index_is_reused_whatever_its_name() -> None:
    existing = [{"name": "_id_", "key": {"_id": 1}}, {"name": "app", "key": dict(WANTED)}]
    assert plan(existing) == IndexPlan(reuse="app")


def test_an_index_of_ours_with_other_keys_is_an_earlier_version_replaced() -> None:
    assert plan([{"name": "ours", "key": {"phase": 1}}]) == IndexPlan(replace="ours")
    assert plan([]) == IndexPlan()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"unique": True}, "is unique"),
        ({"sparse": True}, "is sparse"),
        ({"hidden": True}, "is hidden"),
        ({"partialFilterExpression": {"n": 1}}, "is partial"),
        ({"collation": {"locale": "fr"}}, "has a collation"),
    ],
)
def test_an_index_on_the_same_keys_that_cannot_serve_the_claim_is_refused_by_name(
    options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError, match=rf"index 'app' on \(phase, lockedUntil\) that {problem}"):
        plan([{"name": "app", "key": dict(WANTED), **options}])


def test_a_unique_index_keeps_its_fields_unique_in_any_order_and_direction() -> None:
    info = {"name": "app", "key": {"lockedUntil": -1, "phase": 1}, "unique": True}
    assert index_problem(info, WANTED, True, None) is None
    assert plan([info], unique=True) == IndexPlan(reuse="app")
    assert index_problem({**info, "unique": False}, WANTED, True, None) == "is not unique"


def test_a_simple_collation_however_spelt_is_none() -> None:
    info = {"name": "app", "key": dict(WANTED), "collation": {"locale": "simple"}}
    assert index_problem(info, WANTED, False, None) is None


def test_a_ttl_index_must_expire_after_the_time_asked() -> None:
    info = {"name": "app", "key": dict(WANTED), "expireAfterSeconds": 60}
    assert index_problem(info, WANTED, False, None, expire_after=60) is None
    assert "does not expire documents 30s after" in str(
        index_problem(info, WANTED, False, None, expire_after=30)
    )
    assert index_options("ours", True, 30) == {
        "name": "ours",
        "unique": True,
        "expireAfterSeconds": 30,
    }
