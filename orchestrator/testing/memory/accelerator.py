"""Faster paths through mongomock for the queries the library sends.

mongomock judges every document with a general interpreter (~20 us each), and a sorted
find copies and sorts every match; a claim on 2,000 documents took ~50 ms, which swamped
what the benchmarks measure. These paths decide the common shapes natively and hand
every document or query they cannot judge exactly back to mongomock, so the results are
mongomock's, only sooner. They run under the client's lock like everything else.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

from bson import ObjectId
from mongomock.aggregate import process_pipeline as _untyped_process_pipeline
from mongomock.filtering import filter_applies as _untyped_filter_applies
from mongomock.helpers import patch_datetime_awareness_in_document as _untyped_patch

__all__ = ["accelerate", "filter_applies"]

filter_applies = cast(Callable[[Any, Any], bool], _untyped_filter_applies)
"""mongomock's general filter interpreter, typed: what decides what the fast paths do not."""
_naive_utc: Callable[[Any], Any] = _untyped_patch
_process_pipeline: Callable[..., Any] = _untyped_process_pipeline
_Verdict = bool | None  # None: not decided here; mongomock judges the document
_Test = Callable[[Mapping[str, Any]], _Verdict]
_MISSING = object()
_EXACT = (str, ObjectId)
"""Values an equality compares natively: only another of the same type equals one."""
_RANGES: dict[str, Callable[[Any, Any], bool]] = {
    "$lt": operator.lt,
    "$lte": operator.le,
    "$gt": operator.gt,
    "$gte": operator.ge,
}


def accelerate(collection: Any) -> None:
    """Give one mongomock collection object the faster paths (once)."""
    if "_iter_documents" in vars(collection):
        return
    store = collection._store
    general_find_one = collection.find_one

    def iter_documents(spec: Any) -> Any:
        if store.is_empty:
            filter_applies(spec, {})  # mongomock validates the filter even then
            return iter(())
        key = spec.get("_id", None) if isinstance(spec, Mapping) else None
        if type(key) in (str, ObjectId):  # _id is unique: one lookup, not a scan
            candidates = [store[key]] if key in store else []
        else:
            candidates = list(store.documents)
        test = _compile(spec)
        if test is None:
            return (doc for doc in candidates if filter_applies(spec, doc))
        return (doc for doc in candidates if _judge(test, spec, doc))

    def find_one(filter: Any = None, *args: Any, **kwargs: Any) -> Any:
        sort = kwargs.get("sort")
        if (
            args
            or not sort
            or not isinstance(filter, Mapping)
            or set(kwargs)
            - {
                "sort",
                "projection",
            }
        ):
            return general_find_one(filter, *args, **kwargs)
        # As mongomock's cursor does: dates in the filter become naive UTC milliseconds.
        spec = _naive_utc(filter)
        first = _first_sorted(list(iter_documents(spec)), sort)
        if first is _MISSING:
            return general_find_one(filter, *args, **kwargs)
        if first is None:
            return None
        return general_find_one({"_id": first["_id"]}, projection=kwargs.get("projection"))

    general_aggregate = collection.aggregate

    def aggregate(pipeline: Any, session: Any = None, **kwargs: Any) -> Any:
        # A pipeline opening with $match (the probe's every branch) reads the documents
        # that match, through the faster path, not a copy of every document first.
        first = pipeline[0] if isinstance(pipeline, list) and pipeline else None
        if session is not None or not isinstance(first, Mapping) or set(first) != {"$match"}:
            return general_aggregate(pipeline, session, **kwargs)
        spec = _naive_utc(first["$match"])
        matched = [copy.deepcopy(doc) for doc in iter_documents(spec)]
        return _process_pipeline(matched, collection.database, pipeline[1:], None)

    collection._iter_documents = iter_documents
    collection.find_one = find_one
    collection.aggregate = aggregate


def _judge(test: _Test, spec: Any, doc: Mapping[str, Any]) -> bool:
    verdict = test(doc)
    return bool(filter_applies(spec, doc)) if verdict is None else verdict


def _compile(spec: Any) -> _Test | None:
    """A native test for filters made of string (or ObjectId) equalities, on fields or
    dotted paths, ``$ne`` of a string, date ranges, ``$not`` of a date range, ``$or`` and
    ``$and`` on top-level fields (a claim's shape, a child's owner); None otherwise."""
    if not isinstance(spec, Mapping) or not spec:
        return None
    tests: list[_Test] = []
    for key, value in spec.items():
        if key in ("$or", "$and"):
            if not isinstance(value, list) or not value:
                return None
            parts = [_compile(part) for part in value]
            if any(part is None for part in parts):
                return None
            tests.append(_either(parts) if key == "$or" else _both(parts))  # type: ignore[arg-type]
            continue
        field = _compile_field(key, value)
        if field is None:
            return None
        tests.append(field)
    return _both(tests)


def _compile_field(key: Any, value: Any) -> _Test | None:  # noqa: PLR0911  one return per shape
    """A native test of one field's condition, or None."""
    if not isinstance(key, str) or not key or key.startswith("$"):
        return None
    if type(value) in _EXACT:
        return _equals(key, value)
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    ((op, operand),) = value.items()
    if op == "$eq" and type(operand) in _EXACT:
        return _equals(key, operand)
    if "." in key:
        return None  # a dotted path: equalities only (a child's owner)
    if op == "$ne" and type(operand) is str:
        return _differs(key, operand)
    negate = op == "$not"
    if negate:
        if not isinstance(operand, Mapping) or len(operand) != 1:
            return None
        ((op, operand),) = operand.items()
    compare = _RANGES.get(op)
    if compare is None or type(operand) is not datetime:
        return None
    return _range(key, compare, operand, negate)


def _equals(key: str, wanted: Any) -> _Test:
    """``key`` (a field, or a dotted path through embedded documents) equals ``wanted``
    (a string or an ObjectId: no type compares equal to another's values)."""
    path = key.split(".")

    def test(doc: Mapping[str, Any]) -> _Verdict:
        value: Any = doc
        for part in path:
            if not isinstance(value, Mapping):
                # Through an array MongoDB looks into each element: mongomock's rules. A
                # path through any other value finds nothing.
                return None if isinstance(value, list) else False
            value = value.get(part, _MISSING)
            if value is _MISSING:
                return False
        if type(value) is type(wanted):
            return bool(value == wanted)
        return None if isinstance(value, list) else False

    return test


def _differs(key: str, unwanted: str) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        value = doc.get(key, _MISSING)
        if value is _MISSING or type(value) is str:
            return value != unwanted
        return None  # arrays and other types: mongomock's rules

    return test


def _range(key: str, compare: Callable[[Any, Any], bool], bound: datetime, negate: bool) -> _Test:
    naive = bound.tzinfo is None

    def test(doc: Mapping[str, Any]) -> _Verdict:
        value = doc.get(key, _MISSING)
        if type(value) is not datetime or (value.tzinfo is None) != naive:
            return None  # missing, arrays, other types: mongomock's rules
        return compare(value, bound) != negate

    return test


def _both(tests: list[_Test]) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        verdict: _Verdict = True
        for part in tests:
            outcome = part(doc)
            if outcome is False:
                return False
            if outcome is None:
                verdict = None
        return verdict

    return test


def _either(tests: list[_Test]) -> _Test:
    def test(doc: Mapping[str, Any]) -> _Verdict:
        verdict: _Verdict = False
        for part in tests:
            outcome = part(doc)
            if outcome is True:
                return True
            if outcome is None:
                verdict = None
        return verdict

    return test


def _first_sorted(docs: list[Mapping[str, Any]], sort: Any) -> Any:  # noqa: PLR0911  one return per sort key kind it can order
    """The first of ``docs`` in ``sort`` order (stable, as mongomock sorts), None when there
    are none, ``_MISSING`` when a sort key is neither a date of one kind in every document
    nor an int or nothing (null, missing) in each (a priority)."""
    if not docs:
        return None
    if not isinstance(sort, list | tuple):
        return _MISSING
    ordered = docs
    for item in reversed(sort):
        if not isinstance(item, list | tuple) or len(item) != 2:
            return _MISSING
        key, direction = item
        if not isinstance(key, str) or key.startswith("$") or "." in key:
            return _MISSING
        if direction not in (1, -1):
            return _MISSING
        values = [doc.get(key, _MISSING) for doc in ordered]
        if all(type(v) is datetime for v in values):
            if len({v.tzinfo is None for v in values}) != 1:
                return _MISSING
        elif all(v is _MISSING or v is None or type(v) is int for v in values):
            # A priority: missing and null sort alike, below every number (BSON's order).
            values = [(0, 0) if v is _MISSING or v is None else (1, v) for v in values]
        else:
            return _MISSING
        ranked = sorted(range(len(ordered)), key=values.__getitem__, reverse=direction < 0)
        ordered = [ordered[i] for i in ranked]
    return ordered[0]
