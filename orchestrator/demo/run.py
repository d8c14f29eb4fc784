"""``orchestrator demo``: the gateway workflow at scale, three replicas, checked at the end.

It creates gateways with custom domains, waits while the replicas provision them (each
certificate really waits out its delay, its domain woken by the authority's signal), deletes a
share of them, then audits the result: every resource in its expected final phase, no
side effect run twice (a ledger with a unique key counts repeats), no lease left held.
Time is real; ``tick`` and ``lock_timeout`` are small so the run takes seconds.

The replicas are ``AsyncOrchestrator``s on this process's event loop (the workflow is
written once, async: ``orchestrator.demo.workflows.gateway``), or, with ``processes`` (and
a real server), separate OS processes (``orchestrator.demo.processes``), as the pods
of a deployment are. The display, the users' requests and the replicas share the loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pymongo.asynchronous.database import AsyncDatabase
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import DEFAULT_DATABASE
from orchestrator.core.steps import started
from orchestrator.demo.logs import quiet_logs
from orchestrator.mongo import connect_async
from orchestrator.operations import AsyncOperations, Status

if TYPE_CHECKING:
    from orchestrator.demo.workflows.gateway import Platform, Workflow

PHASES = ("Creating", "Created", "Deleting", "Deleted", "Failed")
WATCHED = (
    "gateways",
    "runtimeDomains",
    "certificates",
    "databases",
    "stages",
    "cloudFunctions",
    "cronTriggers",
)
"""The collections the workflow's handlers claim from: all the display and the audit read."""


@dataclass(frozen=True)
class DemoOptions:
    gateways: int = 100
    replicas: int = 3
    delete_fraction: float = 0.5
    cert_delay: float = 1.0
    fail_rate: float = 0.02
    seed: int = 1
    uri: str | None = None
    database: str = DEFAULT_DATABASE
    tick: float = 0.05
    lock_timeout: float = 5.0
    timeout: float = 120.0
    """Seconds for the whole run, setup included."""
    connect_timeout: float = 5.0
    log_file: Path | None = None
    processes: int = 0
    """Replicas as this many OS processes (needs ``uri``); 0: ``replicas`` tasks here."""
    metrics_port: int | None = None
    """Serve the replicas' Prometheus metrics on this port of 127.0.0.1 while the demo
    runs (0: a free port, printed); None: no metrics."""

    def check(self) -> None:
        if self.gateways < 1:
            raise ConfigError("--gateways must be at least 1")
        if not 1 <= self.replicas <= 32:
            raise ConfigError("--replicas must be between 1 and 32")
        if not 0 <= self.processes <= 32:
            raise ConfigError("--processes must be between 1 and 32 (0: tasks here)")
        if self.processes and not self.uri:
            raise ConfigError(
                "--processes needs MONGODB_URI (or --uri): processes share no in-memory store"
            )
        if not 0.0 <= self.delete_fraction <= 1.0:
            raise ConfigError("--delete-fraction must be between 0 and 1")
        if self.cert_delay < 0:
            raise ConfigError("--cert-delay must be >= 0 seconds")
        if not 0.0 <= self.fail_rate < 0.5:
            raise ConfigError("--fail-rate must be in [0, 0.5)")
        if self.metrics_port is not None:
            if not 0 <= self.metrics_port <= 65535:
                raise ConfigError("--metrics-port must be between 0 and 65535")
            if self.processes:
                raise ConfigError(
                    "--metrics-port serves the replicas of this process: not with --processes"
                )


class Fleet(Protocol):
    """The demo's replicas, wherever they run: tasks here or processes of their own."""

    platform: Platform  # the users' side: create, delete, audit

    def describe(self) -> str: ...

    async def start(self) -> None: ...

    def submitters(self) -> list[Platform]:
        """Where users' requests go in turn (as a load balancer spreads them)."""
        ...

    async def steps(self) -> int: ...

    def trouble(self) -> str | None:
        """Why the run cannot finish (a replica process died), or None."""
        ...

    async def stop(self) -> list[str]:
        """Stop every replica; what each left wrong (steps still running, a bad exit)."""
        ...

    async def stats(self) -> list[tuple[str, Mapping[str, int]]]: ...


class _Tasks:
    """Replicas as ``AsyncOrchestrator``s on this process's event loop."""

    def __init__(self, replicas: list[Workflow]) -> None:
        self.replicas = replicas
        self.platform = replicas[0].platform

    def describe(self) -> str:
        return f"{len(self.replicas)} replicas"

    async def start(self) -> None:
        for workflow in self.replicas:
            await workflow.orch.start()

    def submitters(self) -> list[Platform]:
        return [r.platform for r in self.replicas]

    async def steps(self) -> int:
        return sum(started(r.orch.stats()) for r in self.replicas)

    def trouble(self) -> str | None:
        return None

    async def stop(self) -> list[str]:
        reports = [(r.orch.replica_id, await r.orch.stop(timeout=10)) for r in self.replicas]
        return [
            f"{name}: {len(report.still_running)} steps still running at stop"
            for name, report in reports
            if report.still_running
        ]

    async def stats(self) -> list[tuple[str, Mapping[str, int]]]:
        return [(r.orch.replica_id, r.orch.stats()) for r in self.replicas]


@contextmanager
def _metrics(
    options: DemoOptions, db: AsyncDatabase[Document], console: Console
) -> Iterator[tuple[list[Any], str | None]]:
    """With ``metrics_port``: the listener to register on every replica, and the URL of
    the /metrics endpoint serving it until the demo is over."""
    if options.metrics_port is None:
        yield [], None
        return
    # The metrics extra, which the demo extra includes; imported only when asked for.
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

    from orchestrator.monitoring.prometheus import PrometheusListener  # noqa: PLC0415

    registry = CollectorRegistry()
    # Document counts at most once a second: the live display already queries each 0.2 s.
    listener = PrometheusListener(registry, status=db, status_max_age=1.0)
    try:
        server, thread = start_http_server(options.metrics_port, "127.0.0.1", registry)
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {options.metrics_port}: cannot listen: {exc.strerror or exc}"
        ) from exc
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    console.print(f"Prometheus metrics: {url}", highlight=False, soft_wrap=True)
    try:
        yield [listener], url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(
    options: DemoOptions,
    console: Console,
    monotonic: Callable[[], float] = time.monotonic,
    serving: Callable[[str], None] | None = None,
) -> int:
    """Run the demo; 0 when every invariant holds, 1 otherwise. ``monotonic`` measures
    the run against ``options.timeout`` (a test passes a clock it moves). With
    ``metrics_port``, ``serving`` is called with the metrics URL once the report is
    printed, while the endpoint still serves (a test scrapes the final values)."""
    options.check()
    return asyncio.run(_run(options, console, monotonic, serving))


async def _run(
    options: DemoOptions,
    console: Console,
    monotonic: Callable[[], float],
    serving: Callable[[str], None] | None,
) -> int:
    # The in-memory store needs mongomock, which only the demo extra installs (as does the
    # workflow, which ships in the package): imported here, so a missing extra is named.
    from orchestrator.testing import async_memory_database  # noqa: PLC0415

    if not options.uri:
        db = async_memory_database(options.database)
        return await _serving(
            options, console, monotonic, db, "the embedded in-memory store", serving=serving
        )
    db = await connect_async(options.uri, options.database, timeout=options.connect_timeout)
    try:
        return await _serving(
            options, console, monotonic, db, f"MongoDB database {db.name!r}", serving=serving
        )
    finally:
        await db.client.close()


async def _serving(
    options: DemoOptions,
    console: Console,
    monotonic: Callable[[], float],
    db: AsyncDatabase[Document],
    store_name: str,
    *,
    serving: Callable[[str], None] | None,
) -> int:
    with _metrics(options, db, console) as (listeners, url):
        code = await _demo(options, console, monotonic, db, store_name, listeners=listeners)
        if url is not None and serving is not None:
            # A test scrapes the final values here, from another thread: the loop must
            # stay free to answer the scrape's document counts.
            await asyncio.to_thread(serving, url)
    return code


async def _demo(
    options: DemoOptions,
    console: Console,
    monotonic: Callable[[], float],
    db: AsyncDatabase[Document],
    store_name: str,
    *,
    listeners: list[Any],
) -> int:
    """The run itself, on ``db``, whose client the caller closes."""
    from orchestrator.demo.workflows.gateway import Faults, build  # noqa: PLC0415

    settings: dict[str, Any] = {
        "cert_delay": options.cert_delay,
        "faults": Faults(options.fail_rate, options.seed),
        "tick": options.tick,
        "lock_timeout": options.lock_timeout,
    }
    fleet: Fleet
    if options.processes:
        from orchestrator.demo.processes import Processes  # noqa: PLC0415

        # The users' side submits and deletes; its orchestrator is never started.
        fleet = Processes(build(db, replica_id="demo-users", **settings).platform, options)
    else:
        fleet = _Tasks(
            [
                build(db, replica_id=f"replica-{n + 1}", listeners=listeners, **settings)
                for n in range(options.replicas)
            ]
        )
    await fleet.platform.reset()
    names = [f"gw-{n:03d}" for n in range(options.gateways)]
    deleted = sorted(
        random.Random(options.seed).sample(names, round(len(names) * options.delete_fraction))
    )
    kept = sorted(set(names) - set(deleted))
    console.print(
        f"[bold]orchestrator demo[/]: {len(names)} gateways with custom domains, "
        f"{fleet.describe()} on {store_name}; certificates take {options.cert_delay:g}s, "
        f"{options.fail_rate:.0%} of service calls fail; then {len(deleted)} are deleted.",
        soft_wrap=True,
    )
    started = monotonic()
    deadline = started + options.timeout  # the whole run, setup included
    display = _Display(
        console, db, fleet, monotonic, started=started, total=len(names), to_delete=len(deleted)
    )
    timed_out: str | None = None
    with quiet_logs(options.log_file):
        await fleet.start()
        try:
            submitters = fleet.submitters()

            async def submit(n: int, name: str) -> None:
                await submitters[n % len(submitters)].create_gateway(
                    name, custom_domain=f"{name}.example.com"
                )

            async def provisioned(status: Status) -> bool:
                gateways = status.counts().get("gateways", {})
                return gateways.get("Created", 0) + gateways.get("Failed", 0) >= len(names)

            async def request_deletion(n: int, name: str) -> None:
                await submitters[n % len(submitters)].set_state(name, "Deleted")

            async def finished(status: Status) -> bool:
                gateways = status.counts().get("gateways", {})
                live = sum(gateways.values())
                return live == len(kept) and await fleet.platform.archived() == len(deleted)

            timed_out = (
                await display.each(names, submit, "submitting gateways", deadline)
                or await display.until(provisioned, "provisioning", deadline)
                or await display.each(deleted, request_deletion, "requesting deletions", deadline)
                or await display.until(finished, "deletion", deadline)
            )
        finally:
            left_wrong = await fleet.stop()
    elapsed = monotonic() - started
    # Only the workflow's collections: the database may hold the application's own, whose
    # failed documents and held leases are not the demo's to judge.
    status = await AsyncOperations(db).status(WATCHED, errors=3)
    ending = _Ending(elapsed, kept, deleted, timed_out, left_wrong)
    return await _report(console, options, fleet, status, ending)


class _Display:
    """Live phase counts while the replicas work: a rich table on a terminal, a compact
    line a second otherwise (logs, CI)."""

    def __init__(
        self,
        console: Console,
        db: AsyncDatabase[Document],
        fleet: Fleet,
        monotonic: Callable[[], float],
        *,
        started: float,
        total: int,
        to_delete: int,
    ) -> None:
        self.console = console
        self.operations = AsyncOperations(db)
        self.fleet = fleet
        self.started = started
        self.total = total
        self.to_delete = to_delete
        self.monotonic = monotonic

    async def each(
        self,
        items: list[str],
        action: Callable[[int, str], Awaitable[None]],
        stage: str,
        deadline: float,
    ) -> str | None:
        """Run ``action`` on every item with a progress line a second (thousands of
        submissions take seconds); None when done, else why the stage did not finish."""
        last_line = self.monotonic()
        for n, item in enumerate(items):
            await action(n, item)
            now = self.monotonic()
            if now - last_line >= 1.0:
                self._progress(stage, n + 1, len(items))
                last_line = now
            failure = self._failure(stage, deadline)
            if failure:
                return failure
        if self.monotonic() - self.started >= 1.0:
            self._progress(stage, len(items), len(items))
        return None

    def _progress(self, stage: str, done: int, total: int) -> None:
        elapsed = self.monotonic() - self.started
        self.console.print(f"[{elapsed:5.1f}s] {stage}: {done}/{total}", highlight=False)

    async def until(
        self, done: Callable[[Status], Awaitable[bool]], stage: str, deadline: float
    ) -> str | None:
        """Show progress until ``done``; None then, else why the stage did not finish."""
        if self.console.is_terminal:
            with Live(console=self.console, refresh_per_second=8, transient=False) as live:
                while True:
                    status = await self._status()
                    live.update(await self._render(status, stage))
                    if await done(status):
                        return None
                    failure = self._failure(stage, deadline)
                    if failure:
                        return failure
                    await asyncio.sleep(0.2)  # the display's refresh, not a synchronisation
        last_line = 0.0
        while True:
            status = await self._status()
            finished = await done(status)
            now = self.monotonic()
            if finished or now - last_line >= 1.0:
                line = await self._line(status, stage)  # phases as stored: no markup
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
                last_line = now
            if finished:
                return None
            failure = self._failure(stage, deadline)
            if failure:
                return failure
            await asyncio.sleep(0.2)

    def _failure(self, stage: str, deadline: float) -> str | None:
        trouble = self.fleet.trouble()
        if trouble:
            return f"{stage} did not finish: {trouble}"
        if self.monotonic() > deadline:
            return (
                f"{stage} did not finish: the run's timeout ({deadline - self.started:g}s) passed"
            )
        return None

    async def _status(self) -> Status:
        return await self.operations.status(WATCHED, errors=0)

    async def _render(self, status: Status, stage: str) -> Group:
        counts = status.counts()
        table = Table(title=f"{stage}  ({self.monotonic() - self.started:.1f}s)")
        table.add_column("collection")
        for phase in PHASES:
            table.add_column(phase, justify="right")
        table.add_column("leased now", justify="right")
        for name in WATCHED:
            row = counts.get(name, {})
            leased = sum(p.leased for p in status.phases if p.collection == name)
            table.add_row(name, *(str(row.get(p, "")) for p in PHASES), str(leased))
        gateways = counts.get("gateways", {})
        archived = await self.fleet.platform.archived()
        # A gateway being deleted (or gone) was provisioned first.
        done = archived + sum(gateways.get(p, 0) for p in ("Created", "Deleting", "Deleted"))
        bars = Table.grid(padding=(0, 1))
        bars.add_row(
            "provisioned",
            ProgressBar(total=self.total, completed=min(done, self.total), width=40),
            f"{min(done, self.total)}/{self.total}",
        )
        bars.add_row(
            "deleted",
            ProgressBar(total=max(self.to_delete, 1), completed=archived, width=40),
            f"{archived}/{self.to_delete}",
        )
        steps = await self.fleet.steps()
        rate = steps / max(self.monotonic() - self.started, 1e-9)
        return Group(table, bars, Text(f"steps {steps} ({rate:.0f}/s)"))

    async def _line(self, status: Status, stage: str) -> str:
        counts = status.counts()
        parts = [
            f"{name} " + " ".join(f"{p}={n}" for p, n in sorted(counts.get(name, {}).items()))
            for name in WATCHED
        ]
        elapsed = self.monotonic() - self.started
        archived = await self.fleet.platform.archived()
        return (
            f"[{elapsed:5.1f}s] {stage}: " + " | ".join(parts) + f" | archived {archived}"
            f" | steps {await self.fleet.steps()}"
        )


@dataclass(frozen=True)
class _Ending:
    """How the run ended: its wall time, the gateways kept and deleted, the stage it timed
    out in (None: it finished) and what the replicas left wrong as they stopped."""

    elapsed: float
    kept: list[str]
    deleted: list[str]
    timed_out: str | None
    left_wrong: list[str]


async def _report(
    console: Console, options: DemoOptions, fleet: Fleet, status: Status, ending: _Ending
) -> int:
    elapsed, kept, deleted = ending.elapsed, ending.kept, ending.deleted
    timed_out, left_wrong = ending.timed_out, ending.left_wrong
    stats = await fleet.stats()
    total: Counter[str] = Counter()
    for _, s in stats:
        total.update(s)
    platform = fleet.platform
    repeats = await platform.repeats()
    # Unfinished, every resource is out of place: the audit (a read per gateway) would only
    # take long to say so.
    problems = await platform.audit(kept, deleted) if timed_out is None else []
    held = sum(p.leased + p.overdue for p in status.phases)
    failed = [p for p in status.phases if p.phase == "Failed"]
    checks = [
        (
            timed_out is None,
            f"finished within the timeout ({options.timeout:g}s)"
            if timed_out is None
            else timed_out,
        ),
        (repeats == 0, f"steps run twice: {repeats}"),
        (
            timed_out is None and not problems,
            f"{len(kept)} kept gateways Created with every child, domain, "
            f"certificate and ingress; {len(deleted)} deleted ones archived, nothing left behind"
            if timed_out is None and not problems
            else "resources not audited: the run did not finish"
            if timed_out is not None
            else f"{len(problems)} resources out of place: {problems[:3]}",
        ),
        (
            not failed,
            "no document in the failed phase"
            if not failed
            else f"failed: {[(p.collection, p.count) for p in failed]}",
        ),
        (
            held == 0 and not left_wrong,
            f"no lease left held ({held} held); "
            + ("every replica stopped cleanly" if not left_wrong else "; ".join(left_wrong)),
        ),
    ]
    steps = started(total)
    table = Table(
        title=f"Report: {len(kept) + len(deleted)} gateways, {fleet.describe()}",
        show_header=False,
    )
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("wall time", f"{elapsed:.1f} s")
    table.add_row("steps", f"{steps} ({steps / max(elapsed, 1e-9):.0f} per second)")
    table.add_row(
        "steps per replica",
        ", ".join(f"{name} {started(s)}" for name, s in stats),
    )
    table.add_row("relocks", str(total.get("relocked", 0)))
    table.add_row("retries", f"{total.get('retrying', 0)} (injected faults, retried with backoff)")
    table.add_row("steps run twice", str(repeats))
    counts = status.counts()
    table.add_row(
        "final phases",
        "; ".join(
            f"{name}: " + ", ".join(f"{n} {p}" for p, n in sorted(counts.get(name, {}).items()))
            for name in WATCHED
        )
        + f"; archived gateways: {await platform.archived()}",
    )
    console.print(table)
    for ok, text in checks:
        mark = "[green]ok[/]  " if ok else "[red]FAIL[/]"
        console.print(f"  {mark} {text}", highlight=False, soft_wrap=True)
    healthy = all(ok for ok, _ in checks)
    console.print(
        "[bold green]all invariants hold[/]" if healthy else "[bold red]invariants failed[/]"
    )
    return 0 if healthy else 1
