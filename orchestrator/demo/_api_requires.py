"""Fail at import with what to install when the ``api`` extra is missing."""

from orchestrator.core.distribution import require

require("api", ("fastapi", "uvicorn"), "orchestrator.demo.api_server (the example API server)")
