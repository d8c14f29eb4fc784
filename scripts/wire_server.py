"""mongoeco's wire-protocol server on one address, for ``scripts/wire-server``.

mongoeco ships the server as a class, not a command. This program starts it on an
in-memory engine, checks that it answers ``hello`` through pymongo (as the tests will
talk to it), then writes the URI to ``--uri-file``: a caller that sees the file can
connect. It serves until SIGTERM or SIGINT. Runs inside the Python 3.13 root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from mongoeco.engines import MemoryEngine
from mongoeco.wire.proxy import AsyncMongoEcoProxyServer
from pymongo import MongoClient


def answers_hello(uri: str) -> None:
    client: MongoClient[dict[str, object]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        reply = client.admin.command("hello")
    finally:
        client.close()
    if reply.get("ok") != 1:
        raise RuntimeError(f"hello failed: {reply}")


async def serve(host: str, port: int, uri_file: str) -> None:
    server = AsyncMongoEcoProxyServer(engine=MemoryEngine(), host=host, port=port)
    address = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # pymongo blocks: in a thread, so the server's loop answers it meanwhile.
        await asyncio.to_thread(answers_hello, address.uri)
        partial = f"{uri_file}.partial"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(address.uri + "\n")
        os.replace(partial, uri_file)  # readers never see half a URI
        print(f"serving at {address.uri}", flush=True)
        await stop.wait()
    finally:
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--uri-file", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.uri_file))


if __name__ == "__main__":
    main()
