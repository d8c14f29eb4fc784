"""Fail at import with what to install when the ``web`` extra is missing."""

from orchestrator.core.distribution import require

require("web", ("starlette", "jinja2"), "orchestrator.web (the operator's page)")
