"""Fail at import with what to install when the ``testing`` extra is missing."""

import importlib.util

from orchestrator.core.extras import install_hint

if importlib.util.find_spec("mongomock") is None:
    raise ModuleNotFoundError(
        "orchestrator.testing (the in-memory store) needs mongomock, which the 'testing' "
        f"extra installs: {install_hint('testing')}",
        name="mongomock",
    )
