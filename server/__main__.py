"""python -m server [--model-dir DIR] [--host H] [--port 50051] [--metrics-port 8000] ...

Every flag also reads a TRANSLATOR_* environment variable; `python -m server --help` lists them.
Exit status: 0 after a graceful shutdown (SIGTERM/SIGINT), 1 if there is no bundle to serve (the log
line says which command makes it: the server does not export checkpoints) or the model failed to load,
2 for bad configuration (flags and TRANSLATOR_* variables alike: server/config.py checks every setting
before anything starts and prints one line naming each bad one and the values it allows).
"""

from __future__ import annotations

import asyncio
import faulthandler
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


# After "stopped", the interpreter still joins non-daemon threads and runs exit hooks (gRPC core, ONNX
# Runtime). Should that ever hang, every thread's stack goes to stderr and the process exits 1 instead of
# waiting for the container engine's SIGKILL (issue 23: twice an exit 137 30 s after "stopped").
EXIT_WATCHDOG_S = 5.0


def exit_with(code: int, watchdog_s: float = EXIT_WATCHDOG_S) -> None:
    """sys.exit(code), bounded: past `watchdog_s` seconds of interpreter teardown, dump stacks and _exit(1).
    Only for `python -m server`: tests call main() in their own process."""
    faulthandler.dump_traceback_later(watchdog_s, exit=True)
    sys.exit(code)


if __name__ == "__main__":
    exit_with(main())
