"""The claim path: how a replica's claim loop finds and takes its documents.

The claim itself (one atomic find-and-modify in the claim's order, or a peek at the first
candidates then a find-and-modify naming one: ``sharding.ClaimPlan``), what the server
says of a collection's sharding (asked once per collection), and the probe that first
asks, in one read, which handlers could claim anything. ``AsyncStore`` holds one
``AsyncClaimer`` and answers its contract's ``claim``, ``shard_state`` and ``probe``
with it; the sync twin is generated (``scripts/synchro.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from bson.codec_options import CodecOptions
from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure, PyMongoError

from orchestrator.core import history, pauses, sharding
from orchestrator.core.documents import Document
from orchestrator.core.errors import ShardKeyRequired
from orchestrator.core.in_house import InHouse
from orchestrator.core.queries import claims
from orchestrator.core.scheduler import Found
from orchestrator.mongo import probe_answers
from orchestrator.mongo.driver_errors import Sharded, is_transient

__all__ = ["AsyncClaimer"]


class _Collections(Protocol):
    """Where the claimer's collections come from: the store's, with its codec options and
    write concern."""

    def collection(self, name: str) -> AsyncCollection[Document]: ...

    def errors(
        self, action: str, sharded: Sharded | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


class AsyncClaimer:
    """The claims and probes of one store, with what they learn of each collection: its
    sharding, whether its claims were refused for want of a shard key, and the
    candidates a peek listed."""

    def __init__(
        self,
        db: AsyncDatabase[Document],
        store: _Collections,
        codec: CodecOptions[Document],
        in_house: InHouse,
    ) -> None:
        self._db = db
        self._store = store
        self._codec = codec
        self._in_house = in_house
        self._no_union = False  # the server lacks $unionWith: a probe per collection
        self._sharding: dict[str, sharding.ShardState] = {}
        self._refused: dict[str, ShardKeyRequired] = {}
        """Collections whose claims were refused for want of their shard key: said once,
        then nothing more is claimed there (no server round trip either)."""
        self._candidates: dict[tuple[str, str], sharding.Candidates] = {}

    def forget(self, name: str) -> None:
        """Forget what was learnt of ``name`` (the store dropped it)."""
        self._sharding.pop(name, None)
        self._refused.pop(name, None)
        self._candidates = {k: v for k, v in self._candidates.items() if k[0] != name}

    async def claim(
        self,
        name: str,
        request: claims.ClaimRequest,
        seen: Callable[[Document], None] | None = None,
    ) -> Document | None:
        """One atomic find-and-modify: the first document ``request.match`` selects whose
        lease is free at ``request.judged_at`` (and that ``request.exclusion`` lets
        through), in ``CLAIM_SORT`` order, taken with ``request.update``
        (``claim_update``); None when there is none.

        Atomic, so that of replicas claiming at once exactly one gets each document; in
        ``CLAIM_SORT`` order (``CLAIM_INDEX``'s, so read off the index), so that the
        highest priority is served first and, within it, the document waiting longest,
        none starving behind fresher ones of its priority. The server returns the
        document as it was, and the claim's ``$set`` is applied here: ``seen``, when
        given, gets that document first (its lease fields say how long it was due: the
        events' claim latency).

        ``request.plan`` (the handler's; by default sorted, no shard key): a peeking plan reads
        the first candidates in that order and claims one by its ``_id`` and shard key
        (``_peek_and_claim``). The first claim on a collection asks the server whether it
        is sharded, and on what; a collection sharded on another key than the declared one,
        or a server refusing a claim for want of its shard key, raises ``ShardKeyRequired``
        once, and from then on nothing is claimed there (None, no round trip).
        """
        plan, judged_at = request.plan, request.judged_at
        if name in self._refused:
            return None
        if name not in self._sharding:
            problem = sharding.problem(name, plan.shard_key, await self.shard_state(name))
            if problem is not None:
                self._refused[name] = problem
                raise problem
        query = claims.claim_filter(
            request.match, judged_at, request.horizon, request.exclusion, self._in_house
        )
        update = self._in_house.update(request.update)
        try:
            with self._store.errors(f"claim on {name}", (name, plan.shard_key)):
                if plan.peeks(request.live):
                    before = await self._peek_and_claim(name, query, update, judged_at, plan)
                else:
                    before = await self._store.collection(name).find_one_and_update(
                        query,
                        dict(update),
                        projection=history.CLAIM_PROJECTION,
                        sort=claims.CLAIM_SORT,
                        return_document=ReturnDocument.BEFORE,
                    )
        except ShardKeyRequired as exc:
            self._refused[name] = exc
            raise
        if before is None:
            return None
        if seen is not None:
            seen(before)
        return claims.claimed(before, update)

    async def _peek_and_claim(
        self,
        name: str,
        query: Mapping[str, Any],
        update: Mapping[str, Any],
        judged_at: datetime,
        plan: sharding.ClaimPlan,
    ) -> Document | None:
        """Peek-then-claim: read the first ``plan.candidates`` documents' ``_id``, priority
        and shard key in the claim's order (a read may go to every shard), then claim them
        one at a time in the
        replica's order (``sharding.spread``), each by a find-and-modify naming its ``_id``
        and shard key (one shard) and re-checking ``query``. One that matches nothing was
        taken by another replica meanwhile (a lost race): the others of its list likely
        were too, so the list is dropped and a fresh peek (where documents claimed since
        are no longer free) gives the next candidates. A list serves this handler's next
        claims until then, until it runs out, or until it is older than ``plan.max_age``;
        its first candidate goes to the claim that read it. A claim reads at most
        ``PEEKS_PER_CLAIM`` lists, and reads again, uncounted, when this replica's other
        workers took every document its read found (``Candidates.listed`` leaves them out):
        at least ``plan.candidates`` documents taken while that read was under way. The
        document as it was, or None."""
        coll = self._store.collection(name)
        queue = self._candidates.get((name, plan.key))
        if queue is None:
            queue = self._candidates.setdefault((name, plan.key), sharding.Candidates())
        peeks = 0
        while True:
            candidate = queue.take(judged_at, plan.max_age)
            if candidate is None:
                if peeks == sharding.PEEKS_PER_CLAIM:
                    return None
                peek = queue.sent()
                try:
                    cursor = coll.find(dict(query), claims.peek_projection(plan.shard_key))
                    most = plan.candidates + queue.claiming  # those are left out of the list
                    docs = await cursor.sort(claims.CLAIM_SORT).limit(most).to_list()
                    candidate = queue.listed(peek, docs, plan.seed, judged_at)
                finally:
                    queue.over(peek)
                if candidate is None:
                    if len(docs) < most:
                        return None  # none is free but what this replica's workers took
                    continue  # this replica took all it read meanwhile: more may be free
                peeks += 1
            before: Document | None = None
            try:
                before = await coll.find_one_and_update(
                    claims.targeted_claim(candidate, plan.shard_key, query),
                    dict(update),
                    projection=history.CLAIM_PROJECTION,
                    return_document=ReturnDocument.BEFORE,
                )
            finally:
                queue.done(candidate, lost=before is None)
            if before is not None:
                return before

    async def shard_state(self, name: str) -> sharding.ShardState:
        """Whether ``name`` is sharded, and on which key, as the server tells (asked once
        per collection): ``config.collections`` (which a user with ``readWrite`` on its own
        database only may not read), else ``collStats``'s ``sharded`` (a mongos says it);
        ``UNKNOWN`` when neither answers."""
        known = self._sharding.get(name)
        if known is not None:
            return known
        found, settled = await self._read_sharding(name)
        if settled:
            self._sharding[name] = found
        return found

    async def _read_sharding(self, name: str) -> tuple[sharding.ShardState, bool]:
        """What the server tells, and whether that is settled (not a passing failure)."""
        try:
            config = self._db.client.get_database("config", codec_options=self._codec)
            entry = await config.get_collection("collections").find_one(
                {"_id": f"{self._db.name}.{name}"}, {"key": 1, "dropped": 1}
            )
            return sharding.from_config(entry), True
        except PyMongoError as exc:  # not allowed to read config, most often
            if is_transient(exc):
                return sharding.UNKNOWN, False
        try:
            reply = await self._db.command({"collStats": name}, codec_options=self._codec)
            return sharding.from_collstats(reply), True
        except PyMongoError as exc:
            return sharding.UNKNOWN, not is_transient(exc)

    async def probe(
        self,
        groups: Sequence[tuple[str, claims.Matches]],
        now: datetime,
        horizon: float,
        pauses_collection: str | None = None,
        replicas_collection: str | None = None,
        *,
        known: frozenset[int] = frozenset(),
    ) -> Found:
        """One read: which handlers (numbered across ``groups`` in order) could claim a
        document now, and when the next one comes due (a lease or a wait running out) if
        nobody writes; with ``pauses_collection``, the operators' pauses too; with
        ``replicas_collection``, how many replicas are live. ``known``: handlers known to
        have work, not asked.

        An idle replica asks this once per tick for all its collections (one
        aggregation joined by ``$unionWith``) instead of a claim per handler, so idling
        writes nothing. A server without ``$unionWith`` (before 4.4) is asked with one
        read per collection from then on, without the due time or the pauses.
        """
        if not groups:
            return Found(frozenset())
        if not self._no_union:
            with self._store.errors("probe"):
                try:
                    return await self._probe_at_once(
                        groups, now, horizon, pauses_collection, replicas_collection, known=known
                    )
                except OperationFailure as exc:
                    if not probe_answers.unknown_stage(exc):
                        raise
                    self._no_union = True
        ready: set[int] = set()
        first = 0
        for name, matches in groups:
            numbers = range(first, first + len(matches))
            first += len(matches)
            asked = [m for n, m in zip(numbers, matches, strict=True) if n not in known]
            if not asked:
                continue
            with self._store.errors(f"probe {name}"):
                doc = await self._store.collection(name).find_one(
                    claims.probe_filter(asked, now, horizon, self._in_house),
                    claims.PROBE_PROJECTION,
                )
            if doc is not None:  # one of them: each claims to find out which
                ready.update(n for n in numbers if n not in known)
        return Found(frozenset(ready))

    async def _probe_at_once(
        self,
        groups: Sequence[tuple[str, claims.Matches]],
        now: datetime,
        horizon: float,
        pauses_collection: str | None,
        replicas_collection: str | None,
        *,
        known: frozenset[int],
    ) -> Found:
        """``probe`` in one aggregation (one per ``PROBE_BRANCHES`` handlers), the pauses
        and the live replicas read with the first."""
        read = None if pauses_collection is None else (pauses_collection, pauses.MAX_PAUSES)
        answers: list[Found] = []
        sizes: list[int] = []
        offset = 0
        for chunk in claims.probe_chunks(groups):
            first = not answers
            size = sum(len(m) for _, m in chunk)
            sizes.append(size)
            pipeline = claims.probe_pipeline(
                chunk,
                now,
                horizon,
                pauses=read if first else None,
                replicas=replicas_collection if first else None,
                in_house=self._in_house,
                known=frozenset(n - offset for n in known if offset <= n < offset + size),
            )
            offset += size
            cursor = await self._store.collection(chunk[0][0]).aggregate(pipeline)
            rows = await cursor.to_list()
            answers.append(probe_answers.found(rows, first and read is not None, self._in_house))
        return probe_answers.merged(answers, sizes)
