"""``orchestrator web``: the operator's page served alone, by uvicorn, on one event loop.

The socket is bound first (a port in use is one line, before anything connects), then the
database is reached with the async driver within the connect timeout, then uvicorn serves
the app on that loop, so the ``AsyncMongoClient`` lives and dies on the loop it runs on.
Ctrl-C stops it gracefully (open requests finish).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from orchestrator.core.errors import ConfigError
from orchestrator.core.names import REPLICAS_COLLECTION
from orchestrator.mongo import connect_async
from orchestrator.web.app import operator_app


@dataclass(frozen=True)
class WebOptions:
    uri: str
    database: str | None
    host: str = "127.0.0.1"
    port: int = 8080
    connect_timeout: float = 5.0
    refresh: float = 5.0
    errors: int = 10
    replicas_collection: str = REPLICAS_COLLECTION
    log_level: str = "warning"
    read_only: bool = False
    """Let the operator look, not act; else every action is permitted (the page is
    served for the operator who runs it, on loopback by default)."""


def serve(options: WebOptions, ready: Callable[[str, str, bool], None]) -> None:
    """Serve until interrupted. ``ready(url, database, loopback)`` is called once the
    socket listens and the database answers (requests from then on are served)."""
    sock = listen(options.host, options.port)
    try:
        asyncio.run(_serve(options, sock, ready))
    finally:
        sock.close()


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: any free port), or a ``ConfigError``."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def url_of(sock: socket.socket) -> tuple[str, bool]:
    """The page's URL on ``sock``, and whether only this machine can reach it."""
    address, port = sock.getsockname()[:2]
    ip = ipaddress.ip_address(address)
    shown = f"[{address}]" if ip.version == 6 else address
    return f"http://{shown}:{port}/", ip.is_loopback


async def _serve(
    options: WebOptions, sock: socket.socket, ready: Callable[[str, str, bool], None]
) -> None:
    database = await connect_async(options.uri, options.database, timeout=options.connect_timeout)
    try:
        app = operator_app(
            database,
            refresh=options.refresh,
            errors=options.errors,
            replicas_collection=options.replicas_collection,
            read_only=options.read_only,
        )
        config = uvicorn.Config(
            app,
            log_level=options.log_level.lower(),
            access_log=options.log_level.upper() == "DEBUG",
            lifespan="off",
            server_header=False,
        )
        url, loopback = url_of(sock)
        ready(url, database.name, loopback)
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        await database.client.close()


__all__ = ["WebOptions", "listen", "serve", "url_of"]
