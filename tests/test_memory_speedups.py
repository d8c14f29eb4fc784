"""The in-memory store's faster paths give exactly what plain mongomock gives.

They decide claim-shaped filters, and sorts on dates and priorities, natively, and hand
anything else (arrays, missing fields, other types, other operators) back to mongomock;
here both are asked the same queries over documents built to hit every one of those
cases.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import mongomock
import pytest
from bson import ObjectId
from pymongo import ReturnDocument

from orchestrator.core.queries import claims, lease_writes, trees
from orchestrator.testing import memory_database

BASE = datetime(2026, 1, 1)
OWNER = ObjectId()


def _value(rng: random.Random) -> Any:
    return rng.choice(
        [
            BASE + timedelta(seconds=rng.randint(-100, 100)),
            datetime(1970, 1, 1),
            None,
            "text",
            7,
            [BASE, BASE + timedelta(seconds=50)],
            {"nested": 1},
        ]
    )


def _documents(seed: int) -> list[dict[str, Any]]:
    """Seed 0: what the library writes (string phases, dates), taking the native paths;
    other seeds mix in every shape the native paths must hand back to mongomock."""
    rng = random.Random(seed)
    docs = []
    for n in range(120):
        doc: dict[str, Any] = {"_id": rng.choice([ObjectId(), f"id-{n}"]), "n": n}
        if seed == 0:
            doc["phase"] = rng.choice(["A", "B", "C"])
            doc["lockedUntil"] = BASE + timedelta(seconds=rng.randint(-100, 100) // 10 * 10)
            if rng.random() < 0.3:
                doc["failedBy"] = rng.choice(["h1", "h2"])
            doc["updatedAt"] = BASE + timedelta(seconds=rng.randint(-5, 5))
            if rng.random() < 0.4:
                doc["claimPriority"] = rng.randint(1, 3)
        elif rng.random() < 0.9:
            doc["phase"] = rng.choice(["A", "B", ["A", "C"], 3, None])
        if seed != 0 and rng.random() < 0.3:
            doc["failedBy"] = rng.choice(["h1", "h2", 3, None, ["h1"]])
        if seed != 0 and rng.random() < 0.5:
            doc["claimPriority"] = rng.choice([rng.randint(0, 3), None, 2.5, "text", True])
        if rng.random() < 0.5:  # a child's owner, or what else the field may hold
            owner = rng.choice(
                [
                    {"collection": "parents", "id": rng.choice(["p1", "p2", OWNER, 7])},
                    {"collection": ["parents"], "id": "p1"},
                    [{"collection": "parents", "id": "p1"}],
                    "parents/p1",
                    {"id": "p1"},
                    None,
                ]
            )
            doc["orchestratorOwner"] = owner
        for field in ("lockedUntil", "updatedAt"):
            if seed != 0 and rng.random() < 0.9:
                doc[field] = (
                    BASE + timedelta(seconds=rng.randint(-100, 100))
                    if rng.random() < 0.8
                    else _value(rng)
                )
        docs.append(doc)
    return docs


NOW = BASE.replace(tzinfo=UTC)
FILTERS = [
    claims.claim_filter({"phase": "A"}, NOW, 60, claims.failed_exclusion("h1", "x", "A", {})),
    claims.claim_filter({"phase": "C"}, NOW, 60),
    claims.probe_filter(
        [({"phase": "A"}, claims.failed_exclusion("h1", "h1", "B", {})), ({"phase": "B"}, None)],
        NOW,
        60,
    ),
    claims.claim_filter(
        {"$or": [{"phase": "A"}, {"phase": "B"}]},
        NOW,
        60,
        claims.failed_exclusion("h2", "h1", "B", {}),
    ),
    {"phase": {"$in": ["A", "B"]}, "lockedUntil": {"$lt": BASE}},
    {"lockedUntil": {"$gte": BASE.replace(tzinfo=UTC)}},
    {"failedBy": {"$ne": "h1"}},
    {"updatedAt": {"$not": {"$lte": BASE}}},
    {"phase": "B"},
    trees.children_filter("parents", "p1"),
    trees.children_filter("parents", OWNER),
    {"orchestratorOwner.id": "p2", "phase": "A"},
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spec", FILTERS, ids=range(len(FILTERS)))
def test_finds_and_sorted_claims_match_plain_mongomock(seed: int, spec: dict[str, Any]) -> None:
    fast = memory_database()["items"]
    plain = mongomock.MongoClient()["db"]["items"]
    for doc in _documents(seed):
        fast.insert_one(dict(doc))
        plain.insert_one(dict(doc))

    assert list(fast.find(spec)) == list(plain.find(spec))
    assert fast.count_documents(spec) == plain.count_documents(spec)
    for sort in (
        claims.CLAIM_SORT,
        [("lockedUntil", -1), ("updatedAt", 1)],
        [("claimPriority", 1), ("lockedUntil", 1)],
    ):
        for _ in range(5):  # repeated claims walk down the sort order identically
            update = {"$set": {"lockedUntil": BASE + timedelta(days=1)}, "$inc": {"claims": 1}}
            got = fast.find_one_and_update(
                spec, update, sort=sort, return_document=ReturnDocument.AFTER
            )
            want = plain.find_one_and_update(
                spec, update, sort=sort, return_document=ReturnDocument.AFTER
            )
            assert got == want
    assert list(fast.find({}, sort=[("_id", 1)])) == list(plain.find({}, sort=[("_id", 1)]))


def test_fenced_writes_by_id_match_only_the_holder() -> None:
    coll = memory_database()["items"]
    oid = coll.insert_one({"lockToken": "t1", "phase": "A"}).inserted_id
    coll.insert_one({"_id": "named", "lockToken": "t1", "phase": "A"})
    assert coll.update_one(lease_writes.fenced(oid, "t2"), {"$set": {"x": 1}}).matched_count == 0
    assert coll.update_one(lease_writes.fenced(oid, "t1"), {"$set": {"x": 1}}).matched_count == 1
    assert (
        coll.update_one(lease_writes.fenced(str(oid), "t1"), {"$set": {"x": 2}}).matched_count == 0
    )
    assert (
        coll.update_one(lease_writes.fenced("named", "t1"), {"$set": {"x": 3}}).matched_count == 1
    )
    assert coll.find_one({"_id": oid})["x"] == 1
    assert coll.find_one({"_id": "named"})["x"] == 3
