"""The package installs lean, ships what it promises, and reads well on PyPI.

The import checks run in a fresh interpreter where the optional module cannot be imported
(a ``None`` in ``sys.modules`` makes ``import`` fail as if it were not installed), so what
a user without the extra sees is what is asserted. The wheel is built as a user's
installer builds it (``uv build``, offline: from the cache) and read: its license, its
type marker, its templates, the modules the README tells installed users to run. The
README is PyPI's project page, which renders no relative link: every file it links or
shows is an absolute URL under the one repository URL, ``[project.urls] Repository``.
CI also installs the built wheel in a fresh virtual environment and runs the command from
there (``.ci/run``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REPOSITORY = PROJECT["urls"]["Repository"]
OWNER_NAME = urlsplit(REPOSITORY).path.strip("/")
RAW = f"https://raw.githubusercontent.com/{OWNER_NAME}/main/"
README = (ROOT / "README.md").read_text()


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


def test_the_example_api_server_names_the_api_extra() -> None:
    result = without(("fastapi",), "import orchestrator.demo.api_server")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "fastapi" in last
    assert "pip install 'mongo-orchestrator[api]'" in last


# -- the README as PyPI shows it -------------------------------------------------------------

LINK = re.compile(r"(?P<image>!?)\[(?:[^\]\\]|\\.)*\]\((?P<target>[^)\s]*)(?:\s+\"[^\"]*\")?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(?P<target>\S+)", re.MULTILINE)
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HTML = re.compile(r"<(?P<tag>img|a)\b[^>]*?\b(?:src|href)=[\"'](?P<target>[^\"']*)[\"']", re.I)


def targets(text: str) -> list[tuple[bool, str]]:
    """Every link and image of a Markdown text, outside its code blocks: (is an image, its
    target)."""
    text = FENCED.sub("", text)
    found = [(bool(m["image"]), m["target"]) for m in LINK.finditer(text)]
    found += [(False, m["target"]) for m in REFERENCE.finditer(text)]
    found += [(m["tag"].lower() == "img", m["target"]) for m in HTML.finditer(text)]
    return found


def problem(image: bool, target: str) -> str | None:  # noqa: PLR0911  one reason per rule PyPI applies
    """Why PyPI would not show ``target`` as the README means it, or None.

    An anchor in the page (``#section``) stays: it is no file. A file of the repository
    is a URL under ``Repository`` on its main branch, one that exists in this checkout:
    an image its raw bytes (raw.githubusercontent.com), a link its page on GitHub (``blob``
    for a file, ``tree`` for a folder). Any other absolute https URL is another site's.
    """
    if target.startswith("#"):
        return None
    if urlsplit(target).scheme != "https":
        return "relative (PyPI renders no relative path) or not https"
    path = target.split("#", 1)[0]
    if path.startswith(RAW):
        kind, inside = "raw", path.removeprefix(RAW)
    elif path.startswith(f"{REPOSITORY}/blob/main/"):
        kind, inside = "blob", path.removeprefix(f"{REPOSITORY}/blob/main/")
    elif path.startswith(f"{REPOSITORY}/tree/main/"):
        kind, inside = "tree", path.removeprefix(f"{REPOSITORY}/tree/main/")
    elif image:
        return f"an image not under {RAW}"
    elif urlsplit(target).netloc in {"github.com", "raw.githubusercontent.com"} and (
        f"/{OWNER_NAME}/".lower() in target.lower()
    ):
        return f"this repository's file, not as {REPOSITORY}/blob/main/PATH"
    else:
        return None
    if image and kind != "raw":
        return f"an image shown from GitHub's page of it, not its raw bytes ({RAW})"
    local = ROOT / inside
    if not (local.is_dir() if kind == "tree" else local.is_file()):
        return f"{inside} is not a {'folder' if kind == 'tree' else 'file'} of the repository"
    return None


def test_every_url_of_the_project_is_under_its_repository() -> None:
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPOSITORY)
    for name, url in PROJECT["urls"].items():
        assert url == REPOSITORY or url.startswith((f"{REPOSITORY}/", f"{REPOSITORY}#")), name


def test_every_readme_link_and_image_renders_on_pypi() -> None:
    found = targets(README)
    assert any(image for image, _ in found), "the parser found no image: is it broken?"
    wrong = [f"{t}: {why}" for image, t in found if (why := problem(image, t))]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.pure
def test_the_readme_check_refuses_relative_and_misplaced_files() -> None:
    sample = textwrap.dedent(
        f"""
        ![shot](docs/web-overview.png) [guide](docs/security.md) [up](../x.md)
        <img src="docs/x.png">
        [ref]: examples/gateway.py
        ![page]({REPOSITORY}/blob/main/docs/web-overview.png)
        [gone]({REPOSITORY}/blob/main/docs/no-such.md) [plain](http://example.com)
        [fine]({REPOSITORY}/blob/main/docs/security.md#top) [anchor](#install)
        ![fine]({RAW}docs/web-overview.png) [other](https://pypi.org/project/mongoeco/)
        ```python
        print(["code"](0))
        ```
        """
    )
    judged = {t: problem(image, t) is None for image, t in targets(sample)}
    assert judged == {
        "docs/web-overview.png": False,
        "docs/security.md": False,
        "../x.md": False,
        "docs/x.png": False,
        "examples/gateway.py": False,
        f"{REPOSITORY}/blob/main/docs/web-overview.png": False,
        f"{REPOSITORY}/blob/main/docs/no-such.md": False,
        "http://example.com": False,
        f"{REPOSITORY}/blob/main/docs/security.md#top": True,
        "#install": True,
        f"{RAW}docs/web-overview.png": True,
        "https://pypi.org/project/mongoeco/": True,
    }


# -- the wheel -------------------------------------------------------------------------------

TARGET = re.compile(r"(?:orchestrator\s+(?:run|graph)|uvicorn)\s+(?P<module>[a-z_][\w.]*):\w+")
"""A module the README tells someone to run, as ``orchestrator run MODULE:NAME`` or
``uvicorn MODULE:NAME``."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of this checkout, built by uv from its cache (no network)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed: nothing here builds a wheel")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [uv, "build", "--wheel", "--offline", "--out-dir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    if built.returncode != 0 and "network was disabled" in built.stderr:
        pytest.skip(f"the build backend is not in uv's cache and this is offline: {built.stderr}")
    assert built.returncode == 0, built.stderr
    [path] = out.glob("*.whl")
    return zipfile.ZipFile(path)


def metadata(wheel: zipfile.ZipFile) -> Message:
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return HeaderParser().parsestr(wheel.read(name).decode())


def test_the_wheel_ships_the_license_the_type_marker_and_the_templates(
    wheel: zipfile.ZipFile,
) -> None:
    names = set(wheel.namelist())
    [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file) == (ROOT / "LICENSE").read_bytes()
    assert "orchestrator/py.typed" in names
    templates = ROOT / "orchestrator" / "web" / "templates"
    shipped = {f"orchestrator/web/templates/{p.name}" for p in templates.iterdir()}
    assert shipped and shipped <= names
    assert not [n for n in names if n.startswith(("examples/", "tests/"))]


def test_every_module_the_readme_tells_users_to_run_is_in_the_wheel(
    wheel: zipfile.ZipFile,
) -> None:
    """``examples/`` is not in the wheel: an installed user runs the packaged path."""
    names = set(wheel.namelist())
    modules = {m["module"] for m in TARGET.finditer(README)}
    ours = {m for m in modules if (ROOT / m.split(".")[0]).is_dir()}
    assert "orchestrator.demo.workflows" in ours
    assert "orchestrator.demo.api_server" in ours
    for module in ours:
        path = module.replace(".", "/")
        assert {f"{path}.py", f"{path}/__init__.py"} & names, module


def test_the_wheels_metadata_names_license_urls_and_classifiers(wheel: zipfile.ZipFile) -> None:
    meta = metadata(wheel)
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier") or []
    # PEP 639: the expression supersedes license classifiers, and PyPI refuses both.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert {"Typing :: Typed", "Framework :: AsyncIO", "Topic :: Database"} <= set(classifiers)
    oldest = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert oldest is not None
    python = re.compile(r"Programming Language :: Python :: 3\.\d+")
    versions = [c for c in classifiers if python.fullmatch(c)]
    assert versions and all(int(v.rsplit(".", 1)[1]) >= int(oldest[1]) for v in versions)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls == PROJECT["urls"]
    assert meta["Description-Content-Type"] == "text/markdown"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _module_or_package(module: str, package: str) -> str:
    """``module`` if it is one, else the ``package`` it was imported from."""
    try:
        return module if importlib.util.find_spec(module) is not None else package
    except ModuleNotFoundError:
        return package


def _installs(names: set[str]) -> set[str]:
    """The distributions that installing ``names`` brings (their own requirements, not
    their extras'), as this environment's metadata says."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for requirement in importlib.metadata.requires(name) or []:
            if "extra ==" not in requirement:
                todo.append(_requirement_name(requirement))
    return found


def test_the_tracing_extra_installs_what_the_tracing_example_imports(
    wheel: zipfile.ZipFile,
) -> None:
    """The tracing example (README, docs) records spans with the SDK's TracerProvider: the
    ``tracing`` extra installed only opentelemetry-api, which the library calls, so the
    example failed with ModuleNotFoundError for a user who installed just that extra. CI
    installs the wheel with it in a fresh environment and runs those imports (.ci/run)."""
    tracing = {
        _requirement_name(r)
        for r in metadata(wheel).get_all("Requires-Dist") or []
        if re.search(r"extra\s*==\s*[\"']tracing[\"']", r)
    }
    installed = _installs(tracing)
    pages = [README, *(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))]
    blocks = [b for page in pages for b in re.findall(r"```python\n(.*?)```", page, re.S)]
    modules: set[str] = set()
    for block in blocks:
        for module, names in re.findall(r"^from (opentelemetry\S*) import (.+)$", block, re.M):
            # "from opentelemetry import trace": the module trace (opentelemetry is a
            # namespace, in no one distribution).
            modules |= {
                _module_or_package(f"{module}.{n.strip()}", module) for n in names.split(",")
            }
        modules |= set(re.findall(r"^import (opentelemetry\S*)", block, re.M))
    assert "opentelemetry.sdk.trace" in modules, "the tracing example moved: follow it here"
    for module in sorted(modules):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        origin = Path(spec.origin).resolve()
        shipped_by = [
            name
            for name in installed
            if any(
                Path(str(importlib.metadata.distribution(name).locate_file(f))).resolve() == origin
                for f in importlib.metadata.distribution(name).files or []
            )
        ]
        assert shipped_by, f"{module} is in no distribution the tracing extra installs"
