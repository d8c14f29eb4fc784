"""Sharded collections, on both engines, against the in-memory store's emulation of a 7.0
mongos (``db.shard_collection``): with the shard key declared, every claim, fenced write,
delete and operator's change targets one shard (no write reaches every shard by its
``_id``); without it, the server's refusal is one ``ConfigError`` naming the fix, said
once and not at every tick; ``submit`` keeps unique keys that start with the shard key;
and the peek-then-claim strategy survives a lost race."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from queue import Queue
from typing import Any, ClassVar

import pytest
from pymongo import ReturnDocument
from pymongo.database import Database
from pymongo.errors import OperationFailure, WriteError

from bench.instrument import CountingDatabase, Meter
from orchestrator import ConfigError, Orchestrator, Resource, ShardKeyRequired
from orchestrator.core import sharding
from orchestrator.core.queries import claims, lease_writes
from orchestrator.core.sharding import ShardState
from orchestrator.mongo import Store
from orchestrator.operations import Action, Filter, Operations
from orchestrator.testing import FakeClock, async_view, memory_database
from tests.conftest import MakeEither
from tests.engines import Replica, new_replica, wait

pytestmark = pytest.mark.anyio


@dataclass
class Cluster:
    """A database whose collections may be sharded, its clock, and replicas of one engine."""

    db: Database[Any]
    clock: FakeClock
    make: Callable[..., Awaitable[Replica]]


@pytest.fixture(params=["threaded", "async"])
async def cluster(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Cluster]:
    db = memory_database(clock=clock)
    adb = async_view(db)
    made: list[Replica] = []

    async def make(
        replica_id: str = "pod-1", *, meter: Meter | None = None, **options: Any
    ) -> Replica:
        """A replica on the database (its operations counted by ``meter``, if given)."""
        sync: Any = db if meter is None else CountingDatabase(db, meter)
        view: Any = adb if meter is None else CountingDatabase(adb, meter)
        replica = new_replica(request.param, len(made), sync, view, clock, replica_id, **options)
        made.append(replica)
        await replica.measure_clock()
        return replica

    yield Cluster(db, clock, make)
    for replica in made:
        await replica.stop(timeout=5)


class Logged(logging.Handler):
    """The orchestrator's records at WARNING and above, with an event set at the first:
    the threaded engine's worker may log its failure after ``run_once`` has returned."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.first.set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[Logged]:
        library = logging.getLogger("orchestrator")
        library.addHandler(self)
        try:
            yield self
        finally:
            library.removeHandler(self)

    async def error(self) -> str:
        """The first record's message, once it is logged."""
        assert await wait(self.first)
        return self.records[0].getMessage()


class Job(Resource):
    collection: ClassVar[str] = "jobs"
    shard_key: ClassVar[tuple[str, ...]] = ("tenant",)
    unique: ClassVar[tuple[str, ...]] = ("tenant", "name")
    tenant: str
    name: str


# -- targeted, with the shard key declared ------------------------------------------------


async def test_every_claim_fenced_write_and_delete_targets_one_shard(cluster: Cluster) -> None:
    db = cluster.db
    db.shard_collection("jobs", ("tenant",))
    replica = await cluster.make(max_attempts=2)

    @replica.phase(Job, "Run")
    async def run(lease: Any) -> Any:
        seen = lease.doc.get("seen", 0)
        if seen == 0:
            return await lease.unlock(seen=1)
        if seen == 1:
            return await lease.relock(wait=0, seen=2)
        name = lease.resource.name
        if name == "boom" and lease.doc.get("attempts", 0) == 0:
            raise RuntimeError("once")  # a failed attempt's record
        if name == "gone":
            return await lease.remove()
        if name == "bad":
            return await lease.fail("no")
        await lease.advance("Done")
        raise RuntimeError("after its outcome")  # noted on the document as it was released

    for n, name in enumerate(["a", "boom", "gone", "bad"]):
        await replica.submit(Job, {"tenant": f"t{n % 2}", "name": name, "phase": "Run"})
    for _ in range(4):
        await replica.run_once()
        cluster.clock.advance(60)

    phases = {d["name"]: d["phase"] for d in db.jobs.find({})}
    assert phases == {"a": "Done", "boom": "Done", "bad": "Failed"}
    assert db.jobs.find_one({"name": "a"})["lastError"]["message"] == "after its outcome"
    assert db.jobs.find_one({"name": "boom"})["previousError"]["message"] == "once"
    assert db.sharding.broadcasts == []  # none went to every shard by its _id alone


async def test_the_peek_strategy_takes_a_lost_race_and_moves_on(cluster: Cluster) -> None:
    """Replica B peeks both documents and claims one; while its step runs, A claims the
    other (its one candidate); B's next claim aims at that one from its list, finds it
    taken, drops the list, peeks again and finds nothing: each step runs once, and B's
    tick ends."""
    db = cluster.db
    db.shard_collection("jobs", ("tenant",))
    meter = Meter()
    other = await cluster.make("pod-a")
    replica = await cluster.make("pod-b", meter=meter, max_concurrency=1)
    ran: list[tuple[str, Any]] = []

    @other.phase("jobs", "Run", shard_key="tenant")
    async def run_a(lease: Any) -> Any:
        ran.append(("pod-a", lease.id))
        return await lease.advance("Done")

    @replica.phase("jobs", "Run", shard_key="tenant")
    async def run_b(lease: Any) -> Any:
        ran.append(("pod-b", lease.id))
        assert (await other.run_once()).get("claimed") == 1  # the other document
        return await lease.advance("Done")

    for n in range(2):
        await replica.submit("jobs", {"_id": f"j{n}", "tenant": f"t{n}", "phase": "Run"})
    meter.reset()
    await replica.run_once()

    assert sorted(doc for _, doc in ran) == ["j0", "j1"]
    assert [who for who, _ in ran] == ["pod-b", "pod-a"]
    assert db.jobs.count_documents({"phase": "Done"}) == 2
    # B: a peek and a claim, then a claim of the taken one (lost), a peek finding nothing.
    assert meter.ops["find"] == 2
    assert meter.ops["find_one_and_update"] == 2
    assert replica.stats()["claimed"] == 1
    assert db.sharding.broadcasts == []


@pytest.mark.parametrize("shard_key", [None, "tenant"])
async def test_the_peek_strategy_drains_an_unsharded_collection(
    replicas: MakeEither, db: Database[Any], shard_key: str | None
) -> None:
    """On any server (the MONGODB_URI tier too): peek-then-claim, by choice or with a
    declared shard key on a collection that is not sharded."""
    replica = await replicas(claim_strategy="peek", claim_candidates=3)
    options = {} if shard_key is None else {"shard_key": shard_key}

    @replica.phase("jobs", "Run", **options)
    async def run(lease: Any) -> Any:
        if not lease.doc.get("again"):
            return await lease.unlock(again=True)
        return await lease.advance("Done")

    for n in range(10):
        await replica.submit("jobs", {"_id": n, "tenant": f"t{n % 3}", "phase": "Run"})
    assert (await replica.run_once())["advanced"] == 10
    assert db.jobs.count_documents({"phase": "Done"}) == 10


class Staging:
    """Gates around one replica's reads of candidates and claims on ``jobs``, staging the
    interleaving in which a peek reads a document as free just before another worker of
    the same replica takes it: each event names what has happened."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: list[Any] = []  # the documents the claims aimed at, in order
        self.empty: list[Any] = []  # those whose claim matched nothing
        self.sibling_claiming = threading.Event()  # the second claim is under way
        self.read = threading.Event()  # a peek read the sibling's document as free
        self.sibling_stepping = threading.Event()  # its claim came back: it is the replica's
        self.aimed = threading.Event()  # the peek's claim aims at a document of its list

    def claim(self, target: Any, send: Callable[[], Any]) -> Any:
        with self.lock:
            self.claims.append(target)
            second = len(self.claims) == 2
            if self.read.is_set() and not self.aimed.is_set():
                self.aimed.set()
        if second:
            self.sibling_claiming.set()
            assert self.read.wait(10), "hang guard"
        before = send()
        if before is None:
            self.empty.append(target)
        return before

    def peeked(self, docs: list[Any]) -> list[Any]:
        if self.sibling_claiming.is_set() and not self.read.is_set():
            self.read.set()
            assert self.sibling_stepping.wait(10), "hang guard"
        return docs


class StagedCursor:
    """A peek's cursor whose read waits on the ``Staging``."""

    def __init__(self, cursor: Any, staging: Staging) -> None:
        self._cursor = cursor
        self._staging = staging

    def sort(self, *args: Any) -> StagedCursor:
        self._cursor = self._cursor.sort(*args)
        return self

    def limit(self, most: int) -> StagedCursor:
        self._cursor = self._cursor.limit(most)
        return self

    def to_list(self) -> list[Any]:
        return self._staging.peeked(self._cursor.to_list())


class StagedCollection:
    def __init__(self, collection: Any, staging: Staging) -> None:
        self._collection = collection
        self._staging = staging

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self._collection.find(*args, **kwargs)
        peek = args[1:2] == (claims.peek_projection(()),)
        return StagedCursor(cursor, self._staging) if peek else cursor

    def find_one_and_update(self, query: Any, update: Any, **kwargs: Any) -> Any:
        def send() -> Any:
            return self._collection.find_one_and_update(query, update, **kwargs)

        if kwargs.get("return_document") is not ReturnDocument.BEFORE or "_id" not in query:
            return send()
        return self._staging.claim(query["_id"], send)


class StagedDatabase:
    """``db`` whose ``jobs`` collection is staged."""

    def __init__(self, db: Database[Any], staging: Staging) -> None:
        self._db = db
        self._staging = staging

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> Any:
        collection = self._db.get_collection(name, *args, **kwargs)
        return StagedCollection(collection, self._staging) if name == "jobs" else collection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_peek_leaves_out_what_a_worker_of_its_replica_took_after_reading_it(
    db: Database[Any], clock: FakeClock
) -> None:
    """Worker 1 runs a step; worker 2 peeks, and claims document b. Worker 1 ends its step
    and peeks (b is still free: the claim of it has not landed) and reads b; b's claim
    lands and its step starts before worker 1 makes its list of what it read. Before the
    fix, b was in that list (it is no longer being claimed), and a claim of it matched
    nothing: counted as a race lost to another replica, it dropped the list (twice in one
    claim, and the handler sat the tick out with work left: how
    ``test_the_peek_strategy_drains_an_unsharded_collection`` failed once under load)."""
    staging = Staging()
    orch = Orchestrator(
        StagedDatabase(db, staging),
        replica_id="pod-1",
        clock=clock,
        claim_strategy="peek",
        claim_candidates=1,
        max_concurrency=2,
        lock_timeout=30,
        tick=1.0,
        clock_refresh=1e6,
    )
    orch.measure_clock()

    @orch.phase("jobs", "Run")
    def run(lease: Any) -> Any:
        if lease.id == staging.claims[0]:  # its step lasts until the other worker claims
            assert staging.sibling_claiming.wait(10), "hang guard"
        elif lease.id == staging.claims[1]:  # and this one until the peek's claim aims
            staging.sibling_stepping.set()
            assert staging.aimed.wait(10), "hang guard"
        return lease.advance("Done")

    try:
        for name in "abcd":
            orch.submit("jobs", {"_id": name, "phase": "Run"})
        counts = orch.run_once()
    finally:
        orch.stop(timeout=5)
    assert staging.read.is_set() and staging.aimed.is_set()  # staged as told
    assert staging.empty == []  # no claim aimed at what this replica had taken
    assert counts["advanced"] == 4 and len(staging.claims) == 4


class Overtaken:
    """The first ``times`` reads of candidates by the thread named ``reader`` each wait,
    once they have read, until another claim has taken what they found."""

    def __init__(self, reader: str, times: int) -> None:
        self.reader = reader
        self.times = times
        self.found: Queue[list[Any]] = Queue()
        self.taken = threading.Semaphore(0)
        self.empty: list[Any] = []  # the documents of claims that matched nothing

    def peeked(self, docs: list[Any]) -> list[Any]:
        if threading.current_thread().name == self.reader and self.times:
            self.times -= 1
            self.found.put(docs)
            assert self.taken.acquire(timeout=10), "hang guard"
        return docs

    def claim(self, target: Any, send: Callable[[], Any]) -> Any:
        before = send()
        if before is None:
            self.empty.append(target)
        return before


def test_a_claim_reads_again_when_its_replica_took_all_its_read_found(
    db: Database[Any], clock: FakeClock
) -> None:
    """Twice, another claim of the replica takes the one document a claim's read found,
    while the read is under way: those reads leave no list, and do not count against
    ``PEEKS_PER_CLAIM`` (documents may still be free: none is lost to another replica);
    the claim reads a third time and takes c. Before the fix, both lists held what the
    replica had taken: both claims of them matched nothing, as races lost to another
    replica, and the claim came back None with c free (the failure of
    ``test_the_peek_strategy_drains_an_unsharded_collection`` under load)."""
    now = clock.now()
    for n, name in enumerate("abc"):
        db.jobs.insert_one({"_id": name, "phase": "Run", "updatedAt": now + timedelta(seconds=n)})
    staging = Overtaken("overtaken", times=2)
    store = Store(StagedDatabase(db, staging))  # type: ignore[arg-type]
    plan = sharding.ClaimPlan(strategy="peek", candidates=1, key="run")
    update = claims.claim_update(now, now + timedelta(seconds=30), "t", "pod-1")

    def claim() -> Any:
        return store.claim(
            "jobs", claims.ClaimRequest({"phase": "Run"}, now, 3600.0, update, plan=plan)
        )

    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(claim()), name="overtaken")
    reader.start()
    for name in "ab":
        assert staging.found.get(timeout=10) == [{"_id": name}]
        assert claim()["_id"] == name  # taken meanwhile by the replica's other claim
        staging.taken.release()
    reader.join(10)
    assert staging.empty == []  # no claim aimed at what the replica had taken
    [taken] = got
    assert taken is not None and taken["_id"] == "c"


# -- without the shard key: one ConfigError, not a loop -----------------------------------


@pytest.mark.parametrize("told_by", ["config", "collstats", "refusal"])
async def test_a_sharded_collection_without_its_key_is_one_config_error_not_a_loop(
    cluster: Cluster, told_by: str
) -> None:
    """Found sharded in ``config.collections``, by ``collStats`` (a user who may not read
    ``config``), or only by the server refusing the claim: the first tick meets one
    ``ShardKeyRequired`` naming the fix, logged once; later ticks send and log nothing."""
    db = cluster.db
    db.shard_collection("jobs", ("tenant",), listed=told_by == "config")
    db.sharding.config_readable = told_by != "collstats"
    meter = Meter()
    replica = await cluster.make(meter=meter)

    @replica.phase("jobs", "Run")
    async def run(lease: Any) -> Any:
        return await lease.advance("Done")

    db.jobs.insert_one({"_id": "j", "tenant": "t", "phase": "Run"})
    raised: list[ShardKeyRequired] = []
    with Logged().watching() as logged:
        try:
            await replica.run_once()
        except ShardKeyRequired as exc:
            raised.append(exc)
        error = await logged.error()
        sent = meter.total()
        for _ in range(5):
            cluster.clock.advance(2)
            await replica.run_once()  # raises nothing more
    assert raised == []  # the tick goes on: the handler is set aside, the others claim
    fix = "shard_key=('tenant',)" if told_by == "config" else "shard_key=(...its fields...)"
    assert "'jobs' is sharded" in error and f"declare {fix}" in error
    assert "\n" not in error
    assert len(logged.records) == 1
    assert replica.stats()["shard_key_required"] == 1
    assert meter.total() == sent  # nothing sent after the first tick: not even a probe
    assert db.jobs.find_one({"_id": "j"})["phase"] == "Run"
    assert "lockToken" not in db.jobs.find_one({"_id": "j"})


async def test_a_declared_key_other_than_the_collections_is_refused(cluster: Cluster) -> None:
    cluster.db.shard_collection("jobs", ("tenant",))
    replica = await cluster.make()

    @replica.phase("jobs", "Run", shard_key="region")
    async def run(lease: Any) -> Any:
        return await lease.advance("Done")

    cluster.db.jobs.insert_one({"_id": "j", "tenant": "t", "region": "eu", "phase": "Run"})
    with Logged().watching() as logged:
        with contextlib.suppress(ShardKeyRequired):  # raised, or only logged (see above)
            await replica.run_once()
        said = str(await logged.error())
    assert "sharded on ('tenant',) but its handlers declare ('region',)" in said


# -- submit ---------------------------------------------------------------------------------


async def test_submit_keeps_unique_keys_that_start_with_the_shard_key(cluster: Cluster) -> None:
    db = cluster.db
    db.shard_collection("jobs", ("tenant",))
    replica = await cluster.make()

    @replica.phase("jobs", "Run", shard_key="tenant")
    async def run(lease: Any) -> Any:
        return await lease.advance("Done")

    with pytest.raises(ConfigError, match=r"must start with the shard key \('tenant',\)"):
        await replica.submit("jobs", {"tenant": "t", "name": "n", "phase": "Run"}, unique="name")
    with pytest.raises(ConfigError, match=r"no value for \['tenant'\]"):
        await replica.submit("jobs", {"name": "n", "phase": "Run"})
    keys = ("tenant", "name")
    first = await replica.submit("jobs", {"tenant": "t", "name": "n", "phase": "Run"}, unique=keys)
    again = await replica.submit(
        "jobs", {"tenant": "t", "name": "n", "phase": "Run", "x": 1}, unique=keys
    )
    assert again["_id"] == first["_id"] and "x" not in again
    # By _id, the submit is idempotent on the shard key and _id (no index of its own).
    await replica.submit("jobs", {"_id": "j", "tenant": "t", "phase": "Run"})
    twice = await replica.submit("jobs", {"_id": "j", "tenant": "t", "phase": "Run", "x": 1})
    assert "x" not in twice and db.jobs.count_documents({"_id": "j"}) == 1
    patterns = [dict(info["key"]) for info in db.jobs.list_indexes()]
    assert {"tenant": 1, "name": 1} in patterns
    assert {"tenant": 1, "_id": 1} not in patterns
    assert db.sharding.broadcasts == []


async def test_a_model_whose_unique_keys_miss_its_shard_key_is_refused_at_decoration(
    cluster: Cluster,
) -> None:
    class Bad(Resource):
        collection: ClassVar[str] = "jobs"
        shard_key: ClassVar[tuple[str, ...]] = ("tenant",)
        unique: ClassVar[tuple[str, ...]] = ("name",)

    replica = await cluster.make()
    with pytest.raises(ConfigError, match=r"Bad: unique keys \('name',\) must start with"):

        @replica.phase(Bad, "Run")
        async def run(lease: Any) -> Any:
            return await lease.advance("Done")


# -- declaring a shard key ------------------------------------------------------------------


def test_the_handlers_of_a_collection_declare_one_shard_key() -> None:
    orch = Orchestrator(memory_database(), replica_id="pod-1")

    def step(lease: Any) -> Any:
        return lease.advance("Done")

    def other(lease: Any) -> Any:
        return lease.advance("Done")

    first = orch.phase("jobs", "A", shard_key="tenant")(step)
    orch.phase("jobs", "B")(other)  # declares none: takes the collection's
    assert [h.shard_key for h in orch.handlers] == [("tenant",), ("tenant",)]
    assert all(h.plan.peeks(None) for h in orch.handlers)
    both = r"step declares shard_key=\('region',\).*but .*step was registered on it with"
    with pytest.raises(ConfigError, match=both):
        orch.phase("jobs", "C", shard_key="region")(first)
    orch.phase("pods", "A")(step)
    with pytest.raises(ConfigError, match=r"registered on it with no shard key"):
        orch.phase("pods", "B", shard_key="tenant")(other)
    with pytest.raises(ConfigError, match=r"Job.shard_key is \('tenant',\)"):
        orch.phase(Job, "Z", shard_key="region")(step)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("phase", "written by the orchestrator"),
        ("lockedUntil", "written by the orchestrator"),
        ("lastError.at", "written by the orchestrator"),
        ("", "is not a field name"),
        ("$x", "is not a field name"),
        ((), "names the shard key's fields"),
        (("a", "a"), "names a field twice"),
    ],
)
def test_a_shard_key_the_orchestrator_would_rewrite_is_refused(key: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        sharding.check_shard_key(key, "h")


def test_the_claim_strategy_is_checked_and_published() -> None:
    with pytest.raises(ConfigError, match="claim_strategy"):
        Orchestrator(memory_database(), claim_strategy="random")
    with pytest.raises(ConfigError, match="claim_candidates"):
        Orchestrator(memory_database(), claim_candidates=0)
    db = memory_database()
    orch = Orchestrator(db, replica_id="pod-1", claim_strategy="peek", claim_candidates=4)

    @orch.phase("jobs", "Run", shard_key=("tenant", "region"))
    def run(lease: Any) -> Any:
        return lease.advance("Done")

    orch.start()
    try:
        [record] = Operations(db).replicas()
    finally:
        orch.stop()
    assert (record.claim_strategy, record.claim_candidates) == ("peek", 4)
    assert record.handlers[0].shard_key == ("tenant", "region")
    assert record.to_dict()["handlers"][0]["shardKey"] == ["tenant", "region"]


# -- operators --------------------------------------------------------------------------


async def test_operator_actions_name_the_shard_key_of_what_they_change(cluster: Cluster) -> None:
    """The operators' changes (find-and-modify, which a 7.0 mongos refuses without the
    shard key) name it: the key from the live replicas (this user may not read
    ``config``), the values from the document when the page's form carries only its id,
    phase and lease. With no replica to say the key, the refusal is the ConfigError."""
    db = cluster.db
    db.shard_collection("jobs", ("tenant",))
    db.sharding.config_readable = False
    replica = await cluster.make(max_attempts=1)

    @replica.phase("jobs", "Run", shard_key="tenant")
    async def run(lease: Any) -> Any:
        raise RuntimeError("down")

    for n in range(5):
        await replica.submit("jobs", {"_id": f"j{n}", "tenant": f"t{n % 2}", "phase": "Run"})
    await replica.run_once()
    ops = Operations(db, actor="ops")
    form = {"_id": "j0", "phase": "Failed", "lockToken": None}
    with pytest.raises(ShardKeyRequired, match="'jobs' is sharded"):
        ops.retry("jobs", form, "Parked", any_phase=True)
    await replica.start()
    assert ops.retry("jobs", form, "Parked", any_phase=True).document["phase"] == "Parked"
    assert ops.cancel("jobs", ops.document("jobs", "j1")).document["phase"] == "Cancelled"
    assert ops.unlock("jobs", {"_id": "j2", "phase": "Failed", "lockToken": None})["_id"] == "j2"
    done = ops.bulk(Action.RETRY, Filter("jobs", ("Failed",)), to="Parked", any_phase=True)
    assert sorted(row.id for row in done.changed) == ["j2", "j3", "j4"]
    assert db.jobs.count_documents({"phase": "Parked"}) == 4
    assert db.sharding.broadcasts == []


# -- the pieces -----------------------------------------------------------------------------


@pytest.mark.pure
def test_a_targeted_filter_names_the_id_and_shard_key_at_its_top_level() -> None:
    candidate = {"_id": 7, "tenant": "t", "region": {"zone": 1}}
    key = ("tenant", "region")
    assert claims.targeted_claim(candidate, key, {"phase": "Run"}) == {
        "_id": 7,
        "tenant": "t",
        "region": {"$eq": {"zone": 1}},
        "phase": "Run",
    }
    # A handler's filter on a shard key field stays whole beside the equality.
    clash = {"tenant": {"$in": ["t", "u"]}}
    assert claims.targeted_claim(candidate, ("tenant",), clash) == {
        "_id": 7,
        "tenant": "t",
        "$and": [clash],
    }
    assert lease_writes.fenced(7, "tok", "Run", {"_id": 7}) == {
        "_id": 7,
        "lockToken": "tok",
        "phase": "Run",
    }
    assert claims.shard_filter({"_id": 1}, ("tenant",)) == {"tenant": None}
    assert claims.shard_filter({"_id": 1}, ()) == {}


@pytest.mark.pure
def test_each_replica_goes_round_the_candidates_from_its_own_place() -> None:
    docs = ["a", "b", "c", "d"]
    assert sharding.spread(docs, 5) == ["b", "c", "d", "a"]
    assert sharding.spread([], 5) == []
    starts = {sharding.spread(docs, sharding.seed(f"pod-{n}"))[0] for n in range(20)}
    assert len(starts) > 1
    assert sharding.seed("pod-1") == sharding.seed("pod-1")


@pytest.mark.pure
def test_each_replica_goes_round_one_priority_before_the_next() -> None:
    """A peek's list is in the claim's order; a replica starts at its own place among the
    documents of the highest priority, and takes none of a lower one before them."""
    docs = [
        {"_id": 1, "claimPriority": 5},
        {"_id": 2, "claimPriority": 5},
        {"_id": 3, "claimPriority": 5},
        {"_id": 4, "claimPriority": 2},
        {"_id": 5},
        {"_id": 6},
    ]
    ids = [doc["_id"] for doc in sharding.spread(docs, 4)]
    assert ids == [2, 3, 1, 4, 5, 6]
    for n in range(20):
        ranks = [d.get("claimPriority", 0) for d in sharding.spread(docs, sharding.seed(f"p{n}"))]
        assert ranks == sorted(ranks, reverse=True)


def _peeked(
    queue: sharding.Candidates, docs: list[dict[str, Any]], start: int, now: datetime
) -> Mapping[str, Any] | None:
    """A peek with no claim won while it was under way: the candidate of the claim that
    peeked (the rest of the list goes to the next ``take``)."""
    peek = queue.sent()
    try:
        return queue.listed(peek, docs, start, now)
    finally:
        queue.over(peek)


@pytest.mark.pure
def test_a_list_leaves_out_what_this_replica_claims_and_goes_on_a_lost_race() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [{"_id": n} for n in range(4)]
    queue = sharding.Candidates()
    assert queue.take(t0, 1.0) is None  # nothing peeked yet
    first = _peeked(queue, docs, 1, t0)
    assert first == {"_id": 1}
    # A new peek still sees the document being claimed (free until its claim lands).
    assert _peeked(queue, docs, 1, t0) == {"_id": 2}
    assert [queue.take(t0, 1.0) for _ in range(2)] == [{"_id": 3}, {"_id": 0}]
    assert queue.take(t0, 1.0) is None
    for doc in docs:
        queue.done(doc, lost=False)
    assert _peeked(queue, docs, 0, t0) == {"_id": 0}
    assert queue.take(t0 + timedelta(seconds=2), 1.0) is None  # older than a tick
    queue.done({"_id": 0}, lost=False)
    taken = _peeked(queue, docs, 0, t0)
    assert taken == {"_id": 0}
    queue.done(taken, lost=True)  # another replica had it: the rest is dropped
    assert queue.take(t0, 1.0) is None
    claiming = _peeked(queue, docs, 2, t0)
    assert claiming == {"_id": 2}
    assert _peeked(queue, [claiming], 0, t0) is None  # still being claimed here: left out
    assert _peeked(queue, [{"_id": 5}], 0, t0) == {"_id": 5}


@pytest.mark.pure
def test_a_peek_leaves_out_what_this_replica_won_after_it_was_sent() -> None:
    """A read may find free a document a sibling worker's claim takes just after it: once
    that claim is back, the document is no longer being claimed, but it is this replica's,
    and a claim of it would match nothing (read as a race lost to another replica)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [{"_id": n} for n in range(4)]
    queue = sharding.Candidates()
    first = queue.sent()
    assert queue.listed(first, docs[:1], 0, t0) == {"_id": 0}  # the peeking claim's own
    queue.over(first)
    assert queue.take(t0, 1.0) is None  # the rest of its list: none
    won = queue.sent()  # sent while 0 is being claimed: 0 is still free for its read
    queue.done({"_id": 0}, lost=False)
    later = queue.sent()  # sent after 0 was won: its read cannot find 0 free
    queue.done({"_id": 1}, lost=False)  # (1 was free for both reads, then taken)
    assert queue.listed(later, docs, 0, t0) == {"_id": 0}  # 0 is free again, or not read
    assert [queue.take(t0, 1.0) for _ in range(2)] == [{"_id": 2}, {"_id": 3}]
    queue.over(later)
    # 0 and 1 were won since it was sent, 2 and 3 are being claimed.
    assert queue.listed(won, [*docs, {"_id": 4}], 0, t0) == {"_id": 4}
    assert queue.take(t0, 1.0) is None
    queue.over(won)
    assert queue._won == {}  # nothing is remembered while no peek is under way
    queue.done({"_id": 3}, lost=False)
    assert queue._won == {}


@pytest.mark.pure
def test_a_peek_whose_read_failed_forgets_what_it_kept_for_it() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    queue = sharding.Candidates()
    failed, other = queue.sent(), queue.sent()
    queue.done({"_id": 1}, lost=False)
    queue.over(failed)  # its read raised: no list
    assert queue.listed(other, [{"_id": 1}], 0, t0) is None  # the other still leaves 1 out
    queue.over(other)
    assert queue._won == {}
    again = queue.sent()
    assert queue.listed(again, [{"_id": 1}], 0, t0) == {"_id": 1}  # released since
    queue.over(again)


@pytest.mark.pure
def test_what_the_server_says_decides_whether_a_claim_can_work() -> None:
    assert sharding.problem("jobs", (), sharding.UNSHARDED) is None
    assert sharding.problem("jobs", (), sharding.UNKNOWN) is None
    assert sharding.problem("jobs", ("tenant",), ShardState(True)) is None
    assert sharding.problem("jobs", ("tenant",), ShardState(True, ("tenant",))) is None
    assert "no shard key is declared" in str(sharding.problem("jobs", (), ShardState(True)))
    wrong = sharding.problem("jobs", ("b",), ShardState(True, ("a",)))
    assert wrong is not None and "shard_key=('a',)" in str(wrong)
    assert sharding.from_config({"_id": "d.jobs", "key": {"a": 1, "b": "hashed"}}).key == ("a", "b")
    assert sharding.from_config({"_id": "d.jobs", "key": {"a": 1}, "dropped": True}) == (
        sharding.UNSHARDED
    )
    assert sharding.from_collstats({"ok": 1.0}) == sharding.UNSHARDED
    with pytest.raises(ConfigError, match=r"unique=\('tenant', 'name'\)"):
        sharding.check_unique(("name",), ("tenant",), "submit")


def test_the_memory_store_refuses_untargeted_writes_as_a_7_0_mongos() -> None:
    db = memory_database()
    db.jobs.insert_many([{"_id": 1, "tenant": "t", "n": 0}, {"_id": 2, "tenant": "u", "n": 0}])
    db.shard_collection("jobs", ("tenant",))
    with pytest.raises(OperationFailure, match="must contain the shard key") as found:
        db.jobs.find_one_and_update({"_id": 1}, {"$set": {"n": 1}})
    assert found.value.code == 61
    with pytest.raises(WriteError, match="update on a sharded collection") as updated:
        db.jobs.update_one({"n": 0}, {"$set": {"n": 1}})
    assert updated.value.code == 72
    with pytest.raises(WriteError, match="single delete on a sharded collection") as deleted:
        db.jobs.delete_one({"n": 0})
    assert deleted.value.code == 61
    assert db.jobs.find_one_and_update({"tenant": "t", "_id": 1}, {"$set": {"n": 1}})["n"] == 0
    assert db.jobs.update_many({}, {"$inc": {"n": 1}}).modified_count == 2  # multi: allowed
    db.jobs.update_one({"_id": 2}, {"$set": {"n": 5}})  # by _id: sent to every shard
    assert db.sharding.broadcasts == [("orchestrator.jobs", "update_one")]
    assert db.client["config"]["collections"].find_one({"_id": "orchestrator.jobs"})["key"] == {
        "tenant": 1
    }
    assert db.command("collStats", "jobs")["sharded"] is True
    db.sharding.config_readable = False
    with pytest.raises(OperationFailure) as refused:
        db.client["config"]["collections"].find_one({})
    assert refused.value.code == 13


def test_auto_peeks_from_fifty_live_replicas_as_the_fleet_model_chose() -> None:
    auto = sharding.plan(
        strategy="auto", shard_key=(), candidates=32, replica_id="r", tick=1.0, key="k"
    )
    assert not auto.peeks(None) and not auto.peeks(sharding.PEEK_FROM - 1)
    assert auto.peeks(sharding.PEEK_FROM) and auto.peeks(200)
    sorted_plan = sharding.plan(
        strategy="sorted", shard_key=(), candidates=32, replica_id="r", tick=1.0, key="k"
    )
    assert not sorted_plan.peeks(500)
    keyed = sharding.plan(
        strategy="sorted", shard_key=("tenant",), candidates=32, replica_id="r", tick=1.0, key="k"
    )
    assert keyed.peeks(None)  # a declared shard key always peeks: its claims target a shard
