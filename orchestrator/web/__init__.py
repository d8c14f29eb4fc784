"""The operator's web page (the ``web`` extra), for mounting in your own FastAPI or Starlette
application, behind its authentication::

    from orchestrator.web import operator_app

    app.mount("/ops", operator_app(async_client["orchestrator"]))

or to serve alone with ``orchestrator web``. It reads and acts through
``orchestrator.operations``, as the command line does, and serves a JSON API under
``/api`` (``orchestrator.web.api``). ``actor=`` names who acts (the application's
signed-in user); ``status=`` shares its status cache with a ``PrometheusListener``.
"""

from orchestrator.web import _requires  # noqa: F401  (first: names the missing extra)
from orchestrator.web.app import operator_app

__all__ = ["operator_app"]
