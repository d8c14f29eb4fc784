"""Index builds judged as a server judges them, which mongomock does not.

mongomock builds any index it is asked for; a server refuses one whose name or key
pattern clashes with an existing index, with IndexOptionsConflict (85) or
IndexKeySpecsConflict (86), by rules that changed in MongoDB 5.0. The library's index
setup must meet those errors in tests as it does in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from pymongo.errors import OperationFailure

__all__ = ["check_hint", "index_conflict", "index_spec", "model_options"]

_IDENTIFYING = ("key", "unique", "sparse", "partialFilterExpression", "collation")
"""What tells two indexes apart on MongoDB 5.0+ (the index "signature")."""
_IDENTIFYING_BEFORE_5 = ("key", "collation")
"""Before 5.0 (wire version 13), two indexes on one key pattern could not differ in
uniqueness, sparseness or partial filter."""
_NOT_COMPARED = frozenset({"name", "v", "ns", "background"})


def index_spec(keys: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The index pymongo's ``create_index(keys, **options)`` asks the server for."""
    if isinstance(keys, str):
        pairs = [(keys, 1)]
    elif isinstance(keys, Mapping):
        pairs = list(keys.items())
    else:
        pairs = [(item, 1) if isinstance(item, str) else tuple(item) for item in keys]
    spec = {k: v for k, v in options.items() if k not in ("session", "comment")}
    spec["key"] = dict(pairs)
    spec.setdefault("name", "_".join(f"{field}_{direction}" for field, direction in pairs))
    return spec


def model_options(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.document.items() if k != "key"}


def _options(index: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of an index spec, with the defaults a server leaves out made explicit."""
    options = {k: v for k, v in index.items() if k not in _NOT_COMPARED}
    options["key"] = list(dict(index["key"]).items())
    for flag in ("unique", "sparse"):
        options[flag] = bool(options.get(flag, False))
    return options


def index_conflict(
    spec: Mapping[str, Any], existing: list[Mapping[str, Any]], wire_version: int
) -> bool:
    """True when an identical index exists (nothing to build); raise the server's error
    when ``spec`` clashes with an index by name (86, or 85) or by signature (85)."""
    identifying = _IDENTIFYING if wire_version >= 13 else _IDENTIFYING_BEFORE_5

    def _signature(index: Mapping[str, Any]) -> tuple[Any, ...]:
        options = _options(index)
        return tuple(options.get(k) for k in identifying)

    def _other_options(index: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in _options(index).items() if k not in identifying}

    def fail(code: int, message: str) -> NoReturn:
        name = {85: "IndexOptionsConflict", 86: "IndexKeySpecsConflict"}[code]
        raise OperationFailure(
            message, code, {"ok": 0.0, "errmsg": message, "code": code, "codeName": name}
        )

    wanted = _signature(spec)
    for index in existing:
        if index.get("name") != spec["name"]:
            continue
        if _signature(index) != wanted:
            fail(
                86,
                "An existing index has the same name as the requested index. "
                f"Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        if _other_options(index) != _other_options(spec):
            fail(
                85,
                "An equivalent index already exists with the same name but different "
                f"options. Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        return True
    for index in existing:
        if _signature(index) != wanted:
            continue
        if _other_options(index) != _other_options(spec):
            fail(
                85,
                "An equivalent index already exists with a different name and options. "
                f"Requested index: {dict(spec)}, existing index: {dict(index)}",
            )
        fail(85, f"Index already exists with a different name: {index['name']}")
    return False


BAD_VALUE = 2


def check_hint(hint: Any, existing: list[Mapping[str, Any]]) -> None:
    """As a server does, refuse a hint (an index's name, or its key pattern) that names no
    index of the collection: the hint is what keeps a query off a collection scan, so a
    query hinted at an index that is missing must fail in tests as in production."""
    if hint is None:
        return
    if isinstance(hint, str):
        found = any(index.get("name") == hint for index in existing)
    else:
        wanted = dict(index_spec(hint, {})["key"])
        found = any(list(dict(index["key"]).items()) == list(wanted.items()) for index in existing)
    if not found:
        raise OperationFailure("hint provided does not correspond to an existing index", BAD_VALUE)
