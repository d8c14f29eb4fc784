"""The package installs lean: the library imports no extra, and a missing extra is named.

Each check runs in a fresh interpreter where the optional module cannot be imported (a
``None`` in ``sys.modules`` makes ``import`` fail as if it were not installed), so what
a user without the extra sees is what is asserted. CI also installs the built wheel in a
fresh virtual environment and runs the command from there (``.ci/run``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which ``modules`` cannot be imported."""
    hide = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run(
        [sys.executable, "-c", "import sys\n" + hide + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_library_imports_no_extra() -> None:
    result = without(
        ("mongomock", "rich", "click", "starlette", "jinja2", "uvicorn"),
        """
        import orchestrator, orchestrator.mongo, orchestrator.runners._sync.engine
        from orchestrator import Orchestrator, Settings
        print("imported")
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_the_in_memory_store_names_the_testing_extra() -> None:
    result = without(("mongomock",), "import orchestrator.testing")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "mongomock" in last
    assert "pip install 'mongo-orchestrator[testing]'" in last


@pytest.mark.parametrize("hidden", ["starlette", "jinja2"])
def test_the_operators_page_names_the_web_extra(hidden: str) -> None:
    result = without((hidden,), "from orchestrator.web import operator_app")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert hidden in last
    assert "pip install 'mongo-orchestrator[web]'" in last


@pytest.mark.parametrize(
    ("hidden", "argv", "extra"),
    [
        (("rich",), ["status", "--uri", "mongodb://127.0.0.1:1/x"], "cli"),
        (("click",), ["--help"], "cli"),
        (("rich",), ["demo", "--gateways", "2"], "demo"),
        (("mongomock",), ["demo", "--gateways", "2"], "demo"),
        (("starlette",), ["web", "--uri", "mongodb://127.0.0.1:1/x"], "web"),
        (("uvicorn",), ["web", "--uri", "mongodb://127.0.0.1:1/x"], "web"),
    ],
)
def test_the_command_names_the_missing_extra_in_one_line(
    hidden: tuple[str, ...], argv: list[str], extra: str
) -> None:
    result = without(hidden, f"from orchestrator.cli.main import main\nsys.exit(main({argv!r}))")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"needs the '{extra}' extra" in line
    assert f"no module named {hidden[0]!r}" in line
    assert f"pip install 'mongo-orchestrator[{extra}]'" in line
