"""The distribution's name and its extras, for errors that say what to install.

The library needs only pymongo, apscheduler and pydantic; the in-memory store and the
command line's output come with extras, and a missing one is named, never a traceback.
"""

import importlib.util
from collections.abc import Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "mongo-orchestrator"

EXTRA_OF_MODULE = {
    "mongomock": "testing",
    "rich": "cli",
    "click": "cli",
    "starlette": "web",
    "jinja2": "web",
    "uvicorn": "web",
    "prometheus_client": "metrics",
    "opentelemetry": "tracing",
}
"""The extra that installs each optional module."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``, quoted for a shell."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(extra: str, modules: Iterable[str], what: str) -> None:
    """Fail at import, naming what to install, when a module ``what`` needs (one of
    ``modules``, which the ``extra`` installs) is missing."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"{what} needs {module}, which the {extra!r} extra installs: {install_hint(extra)}",
                name=module,
            )


@cache
def library_version() -> str:
    """The installed distribution's version (each replica records it), or "unknown" when
    the package runs from a source tree that was never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
