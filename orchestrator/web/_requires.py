"""Fail at import with what to install when the ``web`` extra is missing."""

import importlib.util

from orchestrator.core.extras import install_hint

for _module in ("starlette", "jinja2"):
    if importlib.util.find_spec(_module) is None:
        raise ModuleNotFoundError(
            f"orchestrator.web (the operator's page) needs {_module}, which the 'web' extra "
            f"installs: {install_hint('web')}",
            name=_module,
        )
