"""The API server example, as a clone names it: the FastAPI app that embeds the orchestrator.

Its code ships inside the package, in ``orchestrator/demo/api_server.py`` (so that the
``api`` extra runs it wherever the package is installed: ``uvicorn
orchestrator.demo.api_server:app``); this module is the name a clone uses for it, one
source for both:

    uvicorn examples.api_server:app --port 8000          # MONGODB_URI, else in-memory
    python -m examples.api_server --memory --port 8000   # its own in-memory store
"""

from orchestrator.demo.api_server import (
    LOGGERS,
    app,
    configure_logging,
    create_app,
    database_from_env,
    main,
)

__all__ = ["LOGGERS", "app", "configure_logging", "create_app", "database_from_env", "main"]

if __name__ == "__main__":
    main()
