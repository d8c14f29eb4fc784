"""What the operator's page tests share: a seeded database and a reader of the page's HTML.

``seed`` makes one document in each state an operator meets: done, failed, held by a
live lease, held by a dead replica (overdue), and waiting out a relock; and the records of
three live replicas (the seeding one, one running a step, one with another lock
timeout) and a dead one. ``seed_invoices`` adds invoices with a business key, three of
them failed; ``seed_certificates`` a certificate waiting for a signal; ``seed_tree`` a
gateway owning two others, one still going on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pymongo import AsyncMongoClient
from pymongo.database import Database

from orchestrator import Lease, Orchestrator
from orchestrator.core.clock import bson_time
from orchestrator.core.distribution import library_version
from orchestrator.core.history import DEFAULT_HISTORY
from orchestrator.core.registry import Handler
from orchestrator.core.replicas import (
    HandlerInfo,
    ReplicaIdentity,
    ReplicaRecord,
    ReplicaSettings,
    RunningStep,
    new_record,
)
from orchestrator.core.trees import OWNER_FIELD, OWNS_FIELD
from orchestrator.mongo import Store
from orchestrator.operations import AsyncOperations, AsyncStatusCache
from orchestrator.testing import FakeClock, async_view
from orchestrator.testing.memory import MemoryDatabase
from orchestrator.web import operator_app
from tests.conftest import MONGODB_URI


@contextmanager
def mounted(db: Database[Any], **options: Any) -> Iterator[TestClient]:
    """The page mounted at /ops in a FastAPI app, on the async view of ``db`` (or an
    ``AsyncMongoClient`` of the same server), as an application mounts it. Its status
    report is computed at every request unless ``options`` give a cache: the tests
    change the database between two reads (the cache is tested on its own clock). Every
    action is permitted unless ``options`` say who may act (``permit``, ``read_only``)."""
    client: AsyncMongoClient[Any] | None = None
    if isinstance(db, MemoryDatabase):
        adb: Any = async_view(db)
    else:
        client = AsyncMongoClient(MONGODB_URI, serverSelectionTimeoutMS=5000)
        adb = client[db.name]
    options.setdefault("status", AsyncStatusCache(AsyncOperations(adb), max_age=0))
    if "permit" not in options:
        options.setdefault("read_only", False)
    app = FastAPI()
    app.mount("/ops", operator_app(adb, **options))
    with TestClient(app) as test_client:
        yield test_client
        if client is not None:
            test_client.portal.call(client.close)  # type: ignore[union-attr]


def read(response: httpx.Response, status: int = 200) -> Page:
    """The page a response carries, whose status must be ``status``."""
    assert response.status_code == status, response.text
    return Page(response.text)


@dataclass
class Seeded:
    """The replica that seeded the database; ``outage`` makes the broken gateway's step
    fail while it is set (clear it and a retry goes through)."""

    orch: Orchestrator
    outage: dict[str, bool] = field(default_factory=lambda: {"on": True})


def seed(db: Database[Any], clock: FakeClock, *, replica_id: str = "pod-1") -> Seeded:
    orch = Orchestrator(
        db,
        replica_id=replica_id,
        clock=clock,
        clock_refresh=1e6,
        max_attempts=1,
        lock_timeout=30,
    )
    seeded = Seeded(orch)

    @orch.phase("gateways", "Provisioning", to="Ready")
    def provision(lease: Lease[Any]) -> Any:
        name = lease.doc["_id"]
        if name == "gw-broken" and seeded.outage["on"]:
            raise RuntimeError("certificate authority unreachable: 503 from ca.internal")
        if name == "gw-waiting":
            return lease.relock(wait=600)
        return lease.advance("Ready")

    orch.measure_clock()
    for name in ("gw-1", "gw-2", "gw-3", "gw-broken", "gw-waiting"):
        orch.submit("gateways", {"_id": name, "phase": "Provisioning", "region": "eu-west-1"})
    orch.run_once()
    now = orch.clock.now()
    db.gateways.insert_many(
        [
            {  # a replica that died mid-step: its lease ran out 70 s ago
                "_id": "gw-stuck",
                "phase": "Provisioning",
                "lockedAt": bson_time(now - timedelta(seconds=100)),
                "lockedUntil": bson_time(now - timedelta(seconds=70)),
                "lockToken": "dead-token",
                "lockedBy": "pod-9",
            },
            {  # a replica running a step now
                "_id": "gw-held",
                "phase": "Provisioning",
                "lockedAt": bson_time(now),
                "lockedUntil": bson_time(now + timedelta(seconds=30)),
                "lockToken": "live-token",
                "lockedBy": "pod-2",
            },
        ]
    )
    # pod-1 records itself as start() makes it (its heartbeat() refreshes the record,
    # with the pauses it honours), without start()'s background loop: the test drives it.
    orch._record.begin()
    store = Store(db)
    for replica in replica_records(now, orch.handlers):
        store.record_replica(replica)
    return seeded


def seed_invoices(seeded: Seeded) -> list[str]:
    """Invoices charged by pod-1, their business key ``invoice`` (unique): while the
    bank is down (``outage["bank"]``), charging INV-1003, INV-1004 and INV-1005 fails and
    its handler gives up on them (Failed). The invoices' ids, in order."""
    orch = seeded.orch
    seeded.outage["bank"] = True

    @orch.phase("invoices", "Charging", to="Paid")
    def charge(lease: Lease[Any]) -> Any:
        if lease.doc["invoice"] in ("INV-1003", "INV-1004", "INV-1005") and seeded.outage["bank"]:
            raise TimeoutError(f"the bank did not answer for {lease.doc['invoice']}")
        return lease.advance("Paid")

    ids = [
        str(
            orch.submit("invoices", {"invoice": f"INV-{n}", "phase": "Charging"}, unique="invoice")[
                "_id"
            ]
        )
        for n in range(1001, 1007)
    ]
    orch.run_once()
    orch.heartbeat()  # its record now names the invoices' handler
    return ids


def seed_refunds(seeded: Seeded) -> list[str]:
    """Refunds INV-2001 and INV-2002 (invoices in Refunding): the bank did not answer
    their first attempt, and their handler tries three times, so the library retries
    them (after a backoff the fake clock never reaches): retrying, never given up on.
    Their ids, in order."""
    orch = seeded.orch

    @orch.phase("invoices", "Refunding", to="Refunded", max_attempts=3)
    def refund(lease: Lease[Any]) -> Any:
        raise TimeoutError(f"the bank did not answer for {lease.doc['invoice']}")

    ids = [
        str(orch.submit("invoices", {"invoice": f"INV-{n}", "phase": "Refunding"})["_id"])
        for n in (2001, 2002)
    ]
    orch.run_once()
    orch.heartbeat()  # its record now names the refunds' handler
    return ids


def seed_certificates(seeded: Seeded) -> dict[str, Any]:
    """A certificate (``domain`` a.example, unique) waiting for the signal
    ``dns-verified``, then Issued with its payload as ``verified``. The certificate."""
    orch = seeded.orch

    @orch.phase("certificates", "Requesting")
    def requesting(lease: Lease[Any]) -> Any:
        return lease.wait_for("dns-verified", then="Validating")

    @orch.phase("certificates", "Validating")
    def validating(lease: Lease[Any]) -> Any:
        signal = lease.signal("dns-verified")
        return lease.advance("Issued", verified=None if signal is None else signal.payload)

    made = orch.submit(
        "certificates", {"phase": "Requesting", "domain": "a.example"}, unique="domain"
    )
    orch.run_once()
    orch.heartbeat()  # its record now names the certificates' handlers
    return made


def seed_tree(db: Database[Any]) -> None:
    """``gw-parent`` (Ready) owning ``gw-child-1``, still going on (Provisioning, which
    pod-1 takes), and ``gw-child-2``, done with (Ready, which no replica takes)."""
    owner = {"collection": "gateways", "id": "gw-parent", "name": "child"}
    db.gateways.insert_many(
        [
            {"_id": "gw-parent", "phase": "Ready", OWNS_FIELD: ["gateways"]},
            {"_id": "gw-child-1", "phase": "Provisioning", OWNER_FIELD: owner},
            {"_id": "gw-child-2", "phase": "Ready", OWNER_FIELD: owner},
        ]
    )


def replica_records(now: datetime, handlers: Sequence[Handler] = ()) -> list[ReplicaRecord]:
    """pod-2 like pod-1 (it runs gw-held's step), pod-3 with a lock timeout of 300 s,
    pod-4 silent for 25 s (past two record intervals: stale, its record still live), and pod-9,
    which died: its record expired, though the TTL monitor has not deleted it yet. Each
    runs ``handlers`` (pod-1's)."""

    def made(
        replica_id: str,
        seen: datetime,
        steps: Sequence[RunningStep] = (),
        engine: str = "threaded",
        lock_timeout: float = 30.0,
    ) -> ReplicaRecord:
        return new_record(
            ReplicaIdentity(
                replica_id,
                f"i-{replica_id}",
                f"web-{replica_id[-1]}",
                7,
                library_version(),
                engine,
                now - timedelta(hours=2),
            ),
            ReplicaSettings(
                lock_timeout=lock_timeout,
                tick=1.0,
                max_concurrency=4,
                history=DEFAULT_HISTORY,
                cancelled_phase="Cancelled",
            ),
            now=seen,
            steps=steps,
            handlers=[
                HandlerInfo(h.collection, h.phase, h.name, h.key, h.failed_phase) for h in handlers
            ],
        )

    return [
        made(
            "pod-2",
            now - timedelta(seconds=1),
            steps=[RunningStep("gateways", "gw-held", "Provisioning", now)],
        ),
        made("pod-3", now - timedelta(seconds=4), engine="async", lock_timeout=300.0),
        made("pod-4", now - timedelta(seconds=25)),
        made("pod-9", now - timedelta(minutes=5)),
    ]


VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
"""Elements without an end tag."""


class Page(HTMLParser):
    """The tables (by id: rows of cell texts), links (by text), forms (action and fields)
    and text of one page, as a person reads them, with the HTML's escapes undone.
    ``row_links``: per table, the links of each row (the header's included), for rows
    whose texts read alike; ``text_of``: the text of an element by its id."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.links: dict[str, str] = {}
        self.row_links: dict[str, list[list[str]]] = {}
        self._row_links: list[str] = []
        self.forms: list[tuple[str, str, dict[str, str]]] = []
        self.text = ""
        self.texts: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._link: str | None = None
        self._link_text: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {name: value or "" for name, value in attrs}
        if tag not in VOID:
            self._open.append((tag, attr.get("id")))
            if attr.get("id"):
                self.texts[attr["id"]] = ""
        if tag == "table":
            self._table = attr.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row, self._row_links = [], []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "a":
            self._link, self._link_text = attr.get("href", ""), []
            if self._row is not None:
                self._row_links.append(self._link)
        elif tag == "form":
            self.forms.append((attr.get("method", "get"), attr.get("action", ""), {}))
        elif tag == "input" and self.forms and "name" in attr:
            self.forms[-1][2][attr["name"]] = attr.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        while self._open and tag in (t for t, _ in self._open):
            if self._open.pop()[0] == tag:
                break
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self.row_links.setdefault(self._table, []).append(self._row_links)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "a" and self._link is not None:
            self.links[" ".join("".join(self._link_text).split())] = self._link
            self._link = None

    def handle_data(self, data: str) -> None:
        self.text += data
        for _, element in self._open:
            if element:
                self.texts[element] += data
        if self._cell is not None:
            self._cell.append(data)
        if self._link is not None:
            self._link_text.append(data)

    def text_of(self, element: str) -> str:
        """The text of the element whose id is ``element``, its spaces collapsed."""
        return " ".join(self.texts[element].split())

    def rows(self, table: str) -> list[list[str]]:
        """The rows of a table without its header row."""
        return self.tables[table][1:]

    def field(self, name: str) -> str:
        """A value of the document page's lease table, by its stored field name."""
        for row in self.tables["lease"]:
            if row[0].endswith(f" {name}"):
                return row[1]
        raise KeyError(name)
