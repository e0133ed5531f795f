"""python -m server [--model-dir DIR] [--host H] [--port 50051] [--metrics-port 8000] ...

Every flag also reads a TRANSLATOR_* environment variable; `python -m server --help` lists them.
Exit status: 0 after a graceful shutdown (SIGTERM/SIGINT), 1 if there is no bundle to serve (the log
line says which command makes it: the server does not export checkpoints) or the model failed to load,
2 for bad configuration (flags and TRANSLATOR_* variables alike: server/config.py checks every setting
before anything starts and prints one line naming each bad one and the values it allows).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from server.app import TranslatorServer
from server.config import load_config
from server.logs import setup_logging

log = logging.getLogger("server")


async def serve(argv: list[str] | None = None) -> int:
    try:
        config = load_config(argv)
    except ValueError as e:
        print(f"python -m server: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    server = TranslatorServer(config)
    loop = asyncio.get_running_loop()
    signals = {"count": 0}

    def on_signal(signum: int) -> None:
        signals["count"] += 1
        name = signal.Signals(signum).name
        if signals["count"] == 1:
            log.info("received %s: draining", name)
            asyncio.ensure_future(server.stop())
        else:
            log.warning("received %s again: stopping now", name)
            asyncio.ensure_future(server.stop(0))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.start()
    except Exception as e:
        log.error("could not start: %s", e)
        return 1

    async def stop_on_load_failure() -> None:
        await server._ready.wait()
        if server.load_error is not None:
            await server.stop(0)

    watcher = asyncio.create_task(stop_on_load_failure())
    await server.wait_for_termination()
    watcher.cancel()
    return 1 if server.load_error is not None else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(argv))


if __name__ == "__main__":
    sys.exit(main())
