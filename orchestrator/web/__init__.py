"""The operator's web page (the ``web`` extra), for mounting in your own FastAPI or Starlette
application, behind its authentication::

    from orchestrator.web import operator_app

    app.mount("/ops", operator_app(async_client["orchestrator"]))

or to serve alone with ``orchestrator web``. It reads and acts through
``orchestrator.operations``, as the command line does, and serves a JSON API under
``/api`` (``orchestrator.web.api``). ``actor=`` names who acts (the application's
signed-in user); ``permit=`` says who may act, per request and ``WebAction`` (read-only
where it says nothing; ``read_only=False`` lets everyone act); ``status=`` shares its
status cache with a ``PrometheusListener``.
"""

from orchestrator.web import _requires  # noqa: F401  (first: names the missing extra)
from orchestrator.web.app import operator_app
from orchestrator.web.permits import Permit, WebAction

__all__ = ["Permit", "WebAction", "operator_app"]
