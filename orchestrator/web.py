"""The operator's web page, for mounting in your own application (the ``web`` extra)::

from orchestrator.web import operator_app

app.mount("/ops", operator_app(async_client["orchestrator"]))
"""

from orchestrator.tools.web import operator_app

__all__ = ["operator_app"]
