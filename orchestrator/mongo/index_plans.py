"""How a store gets the indexes it needs: an existing index that does the job is reused
whatever its name, an earlier version's is replaced, and one on the same keys that cannot
do the job is refused naming it, decided from the indexes read (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.redact import redact

INDEX_CONFLICT_CODES = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an index of that name or keys exists."""


@dataclass(frozen=True)
class IndexPlan:
    """What ``ensure_index`` does after reading a collection's indexes: use ``reuse`` (an
    index that does the job), or drop ``replace`` (an earlier version's, if any) and
    create the index."""

    reuse: str | None = None
    replace: str | None = None


def index_keys(keys: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(str(k), int(d)) for k, d in keys]


def index_options(index_name: str, unique: bool, expire_after: int | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"name": index_name}
    if unique:
        options["unique"] = True
    if expire_after is not None:
        options["expireAfterSeconds"] = expire_after
    return options


def has_collation(existing: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the collection's default collation must be read to judge ``existing``
    (only an index with a collation can differ from it)."""
    return any("collation" in info for info in existing)


def plan_index(
    collection: str,
    existing: Sequence[Mapping[str, Any]],
    wanted: list[tuple[str, int]],
    *,
    index_name: str,
    unique: bool,
    collation: Any,
    expire_after: int | None = None,
) -> IndexPlan:
    """Decide from the indexes ``existing`` on ``collection`` how to get one doing the job
    of ``wanted``.

    An application's equivalent index is reused whatever its name (the server refuses a
    second index on the same keys: codes 85/86). One on the same keys that cannot do the
    job (not unique, partial, sparse...) is refused with a ``ConfigError`` naming it. An
    index named ``index_name`` with other keys or options is an earlier version's: it is
    replaced. ``expire_after``: a TTL index, deleting documents that many seconds after
    the date in its key (the replicas' records).
    """
    for info in existing:
        if index_problem(info, wanted, unique, collation, expire_after) is None:
            return IndexPlan(reuse=str(info["name"]))
    ours: str | None = None
    for info in existing:
        if info.get("name") == index_name:
            ours = index_name
        elif key_pattern(info) == wanted:
            problem = index_problem(info, wanted, unique, collation, expire_after)
            raise ConfigError(
                f"collection {collection!r} has an index {info.get('name')!r} on "
                f"{describe_keys(wanted)} that {problem}; the orchestrator needs "
                f"{'a unique index' if unique else 'an index'} on these keys and "
                "adds no second index on one key pattern (a server before 5.0 "
                f"refuses it): {_index_remedy(unique)}"
            )
    return IndexPlan(replace=ours)


def duplicates_error(collection: str, wanted: Sequence[tuple[str, int]], exc: Exception) -> str:
    """Why a unique index could not be built: the collection already breaks it."""
    return (
        f"collection {collection!r} holds documents with the same "
        f"{describe_keys(wanted)}: the unique index cannot be built until "
        f"the duplicates are removed ({redact(str(exc))})"
    )


def key_pattern(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    key = info.get("key")
    if isinstance(key, Mapping):
        return list(key.items())
    if isinstance(key, list | tuple):
        return [tuple(pair) for pair in key]
    return []


def index_problem(  # noqa: PLR0911  one reason per way an index falls short
    info: Mapping[str, Any],
    wanted: list[tuple[str, int]],
    unique: bool,
    collation: Any,
    expire_after: int | None = None,
) -> str | None:
    """Why the existing index ``info`` cannot do the job of ``wanted``; None if it can.

    A unique index enforces the uniqueness of its set of fields whatever their order and
    direction; the claim needs its exact key pattern to serve its filter and sort.
    """
    keys = key_pattern(info)
    if unique:
        same = len(keys) == len(wanted) and {k for k, _ in keys} == {k for k, _ in wanted}
        if not same or any(d not in (1, -1) for _, d in keys):
            return "has other keys"
        if not info.get("unique"):
            return "is not unique"
    else:
        if keys != wanted:
            return "has other keys"
        if info.get("unique"):
            return "is unique (documents with equal keys would be refused)"
        if info.get("sparse"):
            return "is sparse (it cannot serve a claim of documents missing a key)"
        if info.get("hidden"):
            return "is hidden from the query planner"
    if expire_after is not None and info.get("expireAfterSeconds") != expire_after:
        return f"does not expire documents {expire_after}s after their {describe_keys(wanted)}"
    if "partialFilterExpression" in info:
        return "is partial (it covers only documents matching its filter)"
    if _collation(info.get("collation")) != _collation(collation):
        return "has a collation other than the collection's (the orchestrator's queries use that)"
    return None


def _collation(value: Any) -> Any:
    """None for the simple (binary) collation, however it is spelt."""
    if not isinstance(value, Mapping) or value.get("locale", "simple") == "simple":
        return None
    return dict(value)


def describe_keys(keys: Sequence[tuple[str, int]]) -> str:
    return "(" + ", ".join(k if d == 1 else f"{k} {d}" for k, d in keys) + ")"


def _index_remedy(unique: bool) -> str:
    if unique:
        return (
            "make it unique (collMod with prepareUnique, then unique; MongoDB 6.0+) or drop it,"
            " and the orchestrator creates its own"
        )
    return "drop it, and the orchestrator creates its own"
