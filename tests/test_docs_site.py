"""The docs site: it builds with every warning an error, its reference cannot drift from
the code, and its pages show in a browser (the screenshots the docs show are taken here).

The reference pages that can be generated are (docs/_ext/reference.py, autodoc,
sphinx-click); those written by hand (the stored fields, the JSON API, which names go on
the API page) are checked here against the names the code has: a field, route, body field
or public name added to the code and not to its page fails a test. The generated pages are
checked in the built site, so a generator that silently drops a name fails too.

One build serves every test of the module (``site``): ``sphinx-build -W --keep-going``,
as CI's step runs it; CI passes that step's output in ``ORCHESTRATOR_DOCS_SITE`` (built from
the same clean tree a minute before) rather than build the site twice. Screenshots for the
docs, when asked:
``ORCHESTRATOR_SCREENSHOTS=docs/ uv run pytest tests/test_docs_site.py``.
"""

from __future__ import annotations

import html
import os
import pydoc
import re
import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from starlette.routing import Mount, Route

import orchestrator
import orchestrator.monitoring.prometheus
import orchestrator.monitoring.tracing
import orchestrator.operations
import orchestrator.testing
import orchestrator.web
from orchestrator.cli.commands import main as cli_main
from orchestrator.core import names
from orchestrator.core.audit import OperatorAct, operator_record, takeover_record
from orchestrator.core.events import Event
from orchestrator.core.fire_times import Every
from orchestrator.core.history import operator_entry, step_entry
from orchestrator.core.limits import Limit, LimitKind
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.queries import limit_slots
from orchestrator.core.queries.lease_writes import error_record
from orchestrator.core.queries.replica_records import replica_document
from orchestrator.core.queries.schedules import PAUSED_FIELD, schedule_document
from orchestrator.core.replicas import HandlerInfo, ReplicaIdentity, ReplicaSettings, new_record
from orchestrator.core.schedules import SCHEDULED_FIELD, ScheduleSpec
from orchestrator.core.settings import HandlerOptions, Settings
from orchestrator.core.sharding import RESERVED
from orchestrator.core.trees import Owner, Signal, Wait, WaitKind, progress_record
from orchestrator.monitoring.prometheus import PrometheusListener
from orchestrator.testing import async_view, memory_database
from orchestrator.web import api, operator_app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
T0 = datetime(2026, 1, 1, tzinfo=UTC)

PUBLIC = (
    orchestrator,
    orchestrator.operations,
    orchestrator.testing,
    orchestrator.monitoring.prometheus,
    orchestrator.monitoring.tracing,
    orchestrator.web,
)
"""The modules whose ``__all__`` is the public API the API page documents."""


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def missing(names_: set[str], text: str) -> list[str]:
    """The names ``text`` never shows in code (```name```, ```{name, other}```)."""
    shown = {
        word for span in re.findall(r"`([^`]+)`", text) for word in re.split(r"[^\w./:-]+", span)
    }
    return sorted(name for name in names_ if name not in shown)


# -- the pages written by hand, against the code -----------------------------------------


def test_the_api_page_documents_every_public_name() -> None:
    """By object: a name two modules export (``orchestrator.Status`` is
    ``orchestrator.operations.Status``) is documented once."""
    targets = re.findall(r"^\.\. auto\w+:: (\S+)", page("api.md"), re.MULTILINE)
    documented = {id(pydoc.locate(target)) for target in targets}
    undocumented = [
        f"{module.__name__}.{name}"
        for module in PUBLIC
        for name in module.__all__
        if id(getattr(module, name)) not in documented
    ]
    assert undocumented == []


def test_the_fields_page_names_every_field_the_library_stores_on_a_document() -> None:
    stored = set(RESERVED) | {SCHEDULED_FIELD}
    text = page("fields.md")
    terms = set(re.findall(r"^`(\w+)`$", text, re.MULTILINE))  # each a definition's term
    assert sorted(stored - terms) == []


def stored_subfields() -> set[str]:
    """The keys of every value the library stores: inside its fields on a document, and
    in its own collections, built by the very functions that write them."""
    act = OperatorAct(action="retry", by="ops", why="why", at=T0)
    scope = Scope("invoices", "Sending", "billing:send")
    spec = ScheduleSpec("nightly", "reports", Every(3600.0))
    identity = ReplicaIdentity("r", "i", "host", 1, "1.0", "threaded", T0)
    record = new_record(identity, ReplicaSettings(30.0, 1.0, 4), now=T0)
    limit = Limit(LimitKind.GLOBAL, 1)
    built: list[dict[str, Any]] = [
        error_record("ValueError", "boom", T0, "Sending", trace="Traceback"),
        step_entry(
            replica="r",
            claimed_at=T0,
            now=T0,
            outcome="failed",
            phase="a",
            to="b",
            error={},
            taken_from="q",
        ),
        operator_entry(action="retry", by="ops", why="why", at=T0, phase="a", to="b"),
        Owner("invoices", 1, "child").stored(),
        Wait(WaitKind.CHILDREN, "Done", T0).stored(),
        Signal.new("paid", None, T0).stored(),
        progress_record(0.5, "half", "Sending", T0),
        {SCHEDULED_FIELD: None, "name": None, "fire": None},
        replica_document(record),
        HandlerInfo("invoices", "Sending", "send", "billing:send", "Failed").to_dict(),
        Pause(scope, "ops", T0, "why").document(T0),
        operator_record(
            act,
            collection="c",
            scope={},
            documents=["d"],
            count=0,
            failed="x",
            refused="x",
            keys=["number=1"],
        ),
        takeover_record(at=T0, by="r", taken_from="q", collection="c", document="d", phase="a"),
        *limit_slots.slot_documents("billing:send", limit),
        limit_slots.take_slot_update("t", T0, "r", T0)["$set"],
        schedule_document(spec, T0, T0, "r", T0),
        {key: None for key in spec.stored() if key not in spec.times.stored()},
        {PAUSED_FIELD: None},
    ]
    return {key for value in built for key in value}


def test_the_fields_page_names_every_key_the_library_stores() -> None:
    assert missing(stored_subfields(), page("fields.md")) == []


def test_the_fields_page_names_every_collection_and_index_of_the_library() -> None:
    constants = {
        value
        for name, value in vars(names).items()
        if name.endswith(("_COLLECTION", "_INDEX_NAME")) and isinstance(value, str)
    }
    text = page("fields.md")
    assert missing(constants, text) == []
    assert f"`{names.UNIQUE_PREFIX}<fields>`" in text


def api_routes() -> set[str]:
    """``METHOD /api/path`` of every route of the page's JSON API."""
    app = operator_app(async_view(memory_database()))
    mounted = next(r for r in app.routes if isinstance(r, Mount) and r.path == "/api")
    found = set()
    for route in mounted.routes:
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":
                found.add(f"{method} /api{route.path}")
    return found


def test_the_json_api_page_has_every_route() -> None:
    headings = set(re.findall(r"`((?:GET|POST) /api/[\w/]+)`", page("json-api.md")))
    assert sorted(api_routes() - headings) == []


def test_the_json_api_page_has_every_body_field_an_action_takes() -> None:
    fields = api.ONE | api.MANY | api.SIGNAL | api.PAUSE | api.SCHEDULE | api.BACKFILL
    assert missing(set(fields), page("json-api.md")) == []


@pytest.mark.parametrize("model", [Settings, HandlerOptions])
def test_every_setting_says_what_it_does(model: type[Settings | HandlerOptions]) -> None:
    """The settings page is generated from the model: a field without a description would
    show there as a bare name."""
    bare = [name for name, field in model.model_fields.items() if not field.description]
    assert bare == []


# -- the site, built ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as CI builds it: every warning an error, all of them reported."""
    prebuilt = os.environ.get("ORCHESTRATOR_DOCS_SITE")
    if prebuilt:
        assert (Path(prebuilt) / "index.html").is_file(), f"no site built in {prebuilt}"
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, out],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (built.returncode, built.stderr) == (0, "")
    return out


def text_of(site: Path, name: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / name).read_text()))


def commands(group: click.Group) -> Iterator[str]:
    for name, command in group.commands.items():
        yield name
        if isinstance(command, click.Group):
            yield from commands(command)


def test_the_site_builds_with_no_warning_and_no_error_shown(site: Path) -> None:
    for built in site.rglob("*.html"):
        text = built.read_text()
        assert 'class="problematic"' not in text, built
        assert 'class="system-message"' not in text, built


def test_the_generated_reference_has_every_name_of_the_code(site: Path) -> None:
    listener = PrometheusListener(CollectorRegistry(), status=lambda: pytest.fail("counted"))
    assert listener.status is not None
    wrappers = [m for m in vars(listener).values() if isinstance(m, MetricWrapperBase)]
    metrics = {family.name for m in wrappers for family in m.describe()}
    metrics |= {family.name for family in listener.status.describe()}
    expected = {
        "metrics.html": metrics,
        "events.html": {event.__name__ for event in typing.get_args(Event)},
        "settings.html": {f"Settings.{name}" for name in Settings.model_fields},
        "cli.html": set(commands(cli_main)),
    }
    for name, names_ in expected.items():
        text = text_of(site, f"reference/{name}")
        assert [n for n in sorted(names_) if n not in text] == [], name


# -- the site in a browser ----------------------------------------------------------------


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log in the tests' output."""


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on localhost; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, name="docs-site")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_the_site_shows_its_home_a_how_to_and_the_api_reference(served: str) -> None:
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415

    from tests.test_web_browser import CHROMIUM, LAUNCH_ARGS, SCREENSHOTS  # noqa: PLC0415

    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is not installed ({CHROMIUM}): .ci/run installs it")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            shots = [
                ("index.html", "docs-home.png", "mongo-orchestrator"),
                ("how-to/operate.html", "docs-howto.png", None),
                ("reference/api.html", "docs-reference.png", "Python API"),
            ]
            for path, shot, heading in shots:
                tab.goto(f"{served}/{path}")
                expect(tab).to_have_title(
                    re.compile(rf"mongo-orchestrator {orchestrator.__version__}$")
                )
                title = tab.locator("article h1").first
                expect(title).to_be_visible()
                if heading is not None:
                    expect(title).to_contain_text(heading)
                assert tab.locator(".problematic, .system-message").count() == 0, path
                if path == "reference/api.html":
                    entry = tab.locator('[id="orchestrator.AsyncOrchestrator.phase"]')
                    expect(entry).to_contain_text("phase")
                    expect(tab.locator('[id="orchestrator.Orchestrator"]')).to_be_visible()
                if SCREENSHOTS:
                    tab.screenshot(path=str(Path(SCREENSHOTS) / shot))
        finally:
            browser.close()
