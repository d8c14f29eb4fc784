"""Shard keys, and the order in which a peeking claim aims at documents: pure, no I/O.

On a sharded cluster a write reaches one shard only when its filter names the whole shard
key by equality. MongoDB 4.4 to 7.0 refuse a ``findAndModify`` (the claim) that does not
(ShardKeyNotFound), and from 7.1 (Atlas) / 8.0 run it as a two-phase write across every
shard. A declared shard key (``Resource.shard_key``, or ``shard_key=`` on a handler
registered on a collection name) makes every claim, fenced write and delete name it, so
they target one shard on every version: a claim then reads a few due candidates with
their shard keys (a read may go to every shard) and takes one of them by its ``_id`` and
shard key (``ClaimPlan``, ``spread``, ``Candidates``). The same peek-then-claim serves
unsharded collections too (``claim_strategy="peek"``): replicas aim at different
documents instead of all at the oldest.
"""

from __future__ import annotations

import threading
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any, Literal

from orchestrator.core.errors import ConfigError, ShardKeyRequired
from orchestrator.core.resource import LEASE_FIELDS, PRIORITY_FIELD

ClaimStrategy = Literal["auto", "sorted", "peek"]

PEEK_FROM = 50
"""``auto`` peeks from this many live replicas: the fleet model (``docs/scale.md``) finds
peek-then-claim with continuation wasting less than the sorted claim from 50 replicas up
(10 ms steps, 200 replicas: 0.36 wasted commands per step against 3.82: the server's
retries of claims that all aim at one document), and sending more below (1.45 commands
per step against 1.35 at 3 replicas)."""

RESERVED = LEASE_FIELDS | {"phase", "updatedAt"}
"""Fields no shard key may hold: the orchestrator rewrites them at every claim, release or
advance, and a write that changes a document's shard key moves it between shards."""


def check_shard_key(value: Any, where: str) -> tuple[str, ...]:
    """``value`` (one field name, or a sequence of them) as a shard key, checked where it
    is declared, so a misspelt key fails at import rather than at the first claim."""
    fields = (value,) if isinstance(value, str) else value
    if not isinstance(fields, Sequence) or not fields:
        raise ConfigError(f"{where}: shard_key names the shard key's fields, not {value!r}")
    for name in fields:
        if not isinstance(name, str) or not name or name.startswith("$") or "\x00" in name:
            raise ConfigError(f"{where}: shard_key field {name!r} is not a field name")
        if name in RESERVED or name.split(".", 1)[0] in RESERVED:
            raise ConfigError(
                f"{where}: shard_key field {name!r} is written by the orchestrator (its"
                " claims, releases or advances would move the document between shards)"
            )
    if len(set(fields)) != len(fields):
        raise ConfigError(f"{where}: shard_key {tuple(fields)!r} names a field twice")
    return tuple(fields)


def check_unique(keys: Sequence[str], shard_key: Sequence[str], where: str) -> None:
    """MongoDB keeps a unique index unique across shards only when the shard key is its
    prefix: submit's keys must start with it."""
    if shard_key and tuple(keys[: len(shard_key)]) != tuple(shard_key):
        raise ConfigError(
            f"{where}: unique keys {tuple(keys)!r} must start with the shard key"
            f" {tuple(shard_key)!r} (MongoDB enforces uniqueness across shards only then):"
            f" unique={(*shard_key, *(k for k in keys if k not in shard_key))!r}"
        )


_ABSENT = object()


def value_at(doc: Mapping[str, Any], path: str) -> Any:
    """The value of a (dotted) field, or ``_ABSENT``."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def has(doc: Mapping[str, Any], path: str) -> bool:
    """Whether ``doc`` holds the (dotted) field ``path`` (null counts: a server lists it)."""
    return value_at(doc, path) is not _ABSENT


def shard_values(doc: Mapping[str, Any], shard_key: Sequence[str]) -> dict[str, Any]:
    """The document's shard key values; a missing field is null, as the server files it."""
    found = {name: value_at(doc, name) for name in shard_key}
    return {name: None if value is _ABSENT else value for name, value in found.items()}


def missing_fields(doc: Mapping[str, Any], shard_key: Sequence[str]) -> list[str]:
    """The shard key fields ``doc`` has no value for (submit refuses it)."""
    return [name for name in shard_key if value_at(doc, name) in (_ABSENT, None)]


# -- what the server says of a collection ---------------------------------------------------


@dataclass(frozen=True)
class ShardState:
    """What the server tells of one collection: ``sharded`` (None: it would not say) and,
    where it says, the ``key`` it is sharded on."""

    sharded: bool | None
    key: tuple[str, ...] | None = None


UNKNOWN = ShardState(None)
UNSHARDED = ShardState(False, ())


def from_config(entry: Mapping[str, Any] | None) -> ShardState:
    """``config.collections``'s entry of a collection (None: there is none, so it is not
    sharded; MongoDB 4.4 keeps dropped collections there, marked ``dropped``)."""
    if entry is None or entry.get("dropped") is True:
        return UNSHARDED
    key = entry.get("key")
    if not isinstance(key, Mapping) or not key:
        return ShardState(True)
    return ShardState(True, tuple(str(name) for name in key))


def from_collstats(reply: Mapping[str, Any]) -> ShardState:
    """``collStats``'s reply: a mongos says ``sharded``; a replica set says nothing, and
    it shards nothing."""
    sharded = reply.get("sharded")
    if sharded is True:
        return ShardState(True)
    return UNSHARDED


def problem(collection: str, declared: Sequence[str], found: ShardState) -> ShardKeyRequired | None:
    """Why claiming from ``collection`` with the ``declared`` shard key cannot work, or None:
    it is sharded and no key is declared, or another key than its own."""
    if found.sharded is not True:
        return None
    if found.key is None:
        if declared:
            return None  # the server did not say its key: the declared one is trusted
        return ShardKeyRequired(
            f"collection {collection!r} is sharded and no shard key is declared for it;"
            " declare shard_key=(...its fields...) on its model or handlers"
        )
    if tuple(declared) == found.key:
        return None
    said = f"its handlers declare {tuple(declared)!r}" if declared else "no shard key is declared"
    return ShardKeyRequired(
        f"collection {collection!r} is sharded on {found.key!r} but {said}; declare"
        f" shard_key={found.key!r} on its model or handlers"
    )


def refused(collection: str, declared: Sequence[str] | None, server: str) -> ShardKeyRequired:
    """The server refused a write naming no shard key (``server``: its message);
    ``declared``: the shard key the writer named (None: not known here)."""
    if declared is None:
        said = ""
    elif declared:
        said = f" (not {tuple(declared)!r})"
    else:
        said = " (none is declared)"
    first = server.splitlines()[0][:200] if server else ""
    return ShardKeyRequired(
        f"collection {collection!r} is sharded and every write must name its shard key{said};"
        f" declare shard_key=(...its fields...) on its model or handlers [the server: {first}]"
    )


# -- the peeking claim ----------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    """How one handler's claim finds its document.

    ``sorted``: one ``findAndModify`` takes the first document in the claim's order
    (highest priority, then longest free: every replica aims at the same one). ``peek``: a
    read of the first ``candidates`` documents in that order (their ``_id``, priority and
    shard key), then a claim of one at a time by ``_id`` and shard key, in an order rotated
    by ``seed`` (the replica's) within each priority (``spread``), so replicas aim at
    different documents; a list serves later claims until it runs out, loses a race
    (``Candidates``) or is ``max_age`` seconds old (so work submitted meanwhile with a
    higher priority waits at most that long). A declared ``shard_key`` always peeks. ``key``: the
    handler's key, whose list it is.

    32 candidates by default: draining 600 one-step documents on the in-memory store
    (4 workers a replica), 3 and 8 replicas sent 0.23 and 0.5 lost claims a step with 32,
    about twice that with 8 (and twice the peeks)."""

    strategy: ClaimStrategy = "auto"
    shard_key: tuple[str, ...] = ()
    candidates: int = 32
    seed: int = 0
    max_age: float = 1.0
    key: str = ""

    def peeks(self, live: int | None) -> bool:
        """Whether this claim peeks, the fleet being ``live`` replicas (as the tick's probe
        counted them; None: not known, the sorted claim)."""
        if self.shard_key or self.strategy == "peek":
            return True
        return self.strategy == "auto" and live is not None and live >= PEEK_FROM


SORTED = ClaimPlan(strategy="sorted")
"""The plan of a claim that says none: sorted, no shard key."""

PEEKS_PER_CLAIM = 2
"""Candidate lists one claim reads at most: when its list runs out, or its candidate was
taken by another replica meanwhile (a lost race drops the list), it peeks again, then
finds nothing this time. A read that leaves no list (every document it found was taken
by this replica's other workers meanwhile, ``Candidates.listed``) does not count."""


def seed(replica_id: str) -> int:
    """A stable number of the replica (every process computes the same for one id)."""
    return zlib.crc32(replica_id.encode("utf-8", "replace"))


def plan(
    *,
    strategy: ClaimStrategy,
    shard_key: tuple[str, ...],
    candidates: int,
    replica_id: str,
    tick: float,
    key: str,
) -> ClaimPlan:
    return ClaimPlan(strategy, shard_key, candidates, seed(replica_id), tick, key)


def spread(docs: Sequence[Any], start: int) -> list[Any]:
    """``docs`` (in the claim's order: highest priority first, then longest free) with the
    run of each priority rotated to start at ``start`` modulo its length: each replica
    begins at its own place among the documents of the highest priority and goes round
    them, then the next priority's, so no replica takes lower-priority work from its list
    before higher."""
    spread_out: list[Any] = []
    for _, group in groupby(docs, key=_priority):
        run = list(group)
        at = start % len(run)
        spread_out += [*run[at:], *run[:at]]
    return spread_out


def _priority(doc: Any) -> Any:
    """A peeked candidate's stored priority (None: none, priority 0)."""
    return doc.get(PRIORITY_FIELD) if isinstance(doc, Mapping) else None


@dataclass(frozen=True)
class Peek:
    """A read of candidates under way (``Candidates.sent``): ``since`` counts the claims
    this replica had won when it was sent."""

    since: int


class Candidates:
    """One handler's peeked documents, in this replica's order, handed out one claim at a
    time (safe across the threaded engine's workers: a candidate goes to one claim).

    A peek does not see which of its documents this replica's other workers are claiming
    right now (they are still free until their claim lands): those are left out of a new
    list, and so are those their claims won after the peek was sent (its read may have
    found them still free). A claim that finds its candidate taken (a lost race) then
    means other replicas are working through the same documents: the rest of the list is
    dropped, and the next claim peeks afresh, where documents claimed since are no longer
    free."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: deque[Mapping[str, Any]] = deque()
        self._peeked_at: datetime | None = None
        self._claiming: dict[str, int] = {}
        self._wins = 0  # claims won while a peek was under way
        self._won: dict[str, int] = {}  # their documents, by the count at the latest win
        self._out: dict[int, int] = {}  # peeks under way, by their ``since``

    def take(self, now: datetime, max_age: float) -> Mapping[str, Any] | None:
        """The next candidate, None when the list is used up or older than ``max_age``."""
        with self._lock:
            if self._peeked_at is None or now - self._peeked_at > timedelta(seconds=max_age):
                self._docs.clear()
            if not self._docs:
                return None
            return self._hand_out()

    def _hand_out(self) -> Mapping[str, Any]:
        doc = self._docs.popleft()
        mark = _mark(doc)
        self._claiming[mark] = self._claiming.get(mark, 0) + 1
        return doc

    def done(self, doc: Mapping[str, Any], *, lost: bool) -> None:
        """``doc``'s claim came back; ``lost``: another replica had taken it."""
        with self._lock:
            mark = _mark(doc)
            left = self._claiming.pop(mark, 1) - 1
            if left > 0:
                self._claiming[mark] = left
            if lost:
                self._docs.clear()
            elif self._out:  # a read under way may have found it free
                self._wins += 1
                self._won[mark] = self._wins

    @property
    def claiming(self) -> int:
        """Candidates this replica's workers are claiming now: a new peek reads that many
        more, since they are still free and are left out of the list."""
        with self._lock:
            return len(self._claiming)

    def sent(self) -> Peek:
        """A peek is sent now: until it is ``over``, the claims won are remembered."""
        with self._lock:
            self._out[self._wins] = self._out.get(self._wins, 0) + 1
            return Peek(self._wins)

    def over(self, peek: Peek) -> None:
        """``peek``'s list is made, or its read failed: wins none of the peeks still under
        way can have read as free are forgotten."""
        with self._lock:
            left = self._out.pop(peek.since) - 1
            if left:
                self._out[peek.since] = left
            if not self._out:
                self._won.clear()
                return
            oldest = min(self._out)
            self._won = {mark: won for mark, won in self._won.items() if won > oldest}

    def listed(
        self, peek: Peek, docs: Sequence[Mapping[str, Any]], start: int, now: datetime
    ) -> Mapping[str, Any] | None:
        """``peek``'s ``docs`` (oldest first) as the new list, in this replica's order from
        ``start``, without those this replica is claiming now or won since ``peek`` was
        sent; its first candidate goes to the claim that peeked (so other workers cannot
        use the list up before it aims), the rest to the next claims. None: none is left."""
        with self._lock:
            since = peek.since
            fresh = [
                doc
                for doc in docs
                if (mark := _mark(doc)) not in self._claiming and self._won.get(mark, 0) <= since
            ]
            self._docs = deque(spread(fresh, start))
            self._peeked_at = now
            return self._hand_out() if self._docs else None


def _mark(doc: Mapping[str, Any]) -> str:
    """A candidate's identity in a list (its ``_id`` may be any value, a document too)."""
    return repr(doc.get("_id"))
