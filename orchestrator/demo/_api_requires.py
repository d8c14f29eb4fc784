"""Fail at import with what to install when the ``api`` extra is missing."""

import importlib.util

from orchestrator.core.extras import install_hint

for _module in ("fastapi", "uvicorn"):
    if importlib.util.find_spec(_module) is None:
        raise ModuleNotFoundError(
            f"orchestrator.demo.api_server (the example API server) needs {_module}, which "
            f"the 'api' extra installs: {install_hint('api')}",
            name=_module,
        )
