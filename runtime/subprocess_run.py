"""The one way this project runs a helper program on someone's input (today: GNU gettext's msgfmt).

Every run has a timeout, runs in its own process group (so a program that forks leaves nothing behind)
and can be killed from another thread through a `Cancellation`: the HTTP API cancels one when its
request is cancelled (the client hung up, the server stops) while the run waits in a worker thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence


class SubprocessError(Exception):
    """A run that did not finish on its own (message for the user)."""


class SubprocessTimeout(SubprocessError):
    pass


class SubprocessCancelled(SubprocessError):
    pass


class Cancellation:
    """Kills the runs registered with it, now and later; thread-safe. One per piece of work (a file)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)

    def _register(self, proc: subprocess.Popen) -> bool:
        """False (and the process killed) when already cancelled."""
        with self._lock:
            if not self.cancelled:
                self._procs.add(proc)
                return True
        _kill_group(proc)
        return False

    def _unregister(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    # start_new_session=True made the child its own group leader: the group id is its pid. Not once it
    # is reaped: its pid may belong to another process by then.
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    cmd: Sequence[str],
    *,
    input: bytes | None = None,
    timeout_s: float,
    cancel: Cancellation | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `cmd` to its end and return its exit status and output (stdout, stderr as bytes).
    SubprocessTimeout past `timeout_s` seconds, SubprocessCancelled when `cancel` fires: in both cases
    the whole process group is killed and reaped before this returns."""
    if cancel is not None and cancel.cancelled:
        raise SubprocessCancelled(f"{cmd[0]} was not started: the work was cancelled")
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    registered = cancel is None or cancel._register(proc)
    try:
        try:
            out, err = proc.communicate(input if registered else None, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise SubprocessTimeout(f"{cmd[0]} took more than {timeout_s:g} s and was stopped") from None
        except BrokenPipeError:  # killed (cancelled) while its input was being written
            _kill_group(proc)
            out, err = proc.communicate()
        if cancel is not None and cancel.cancelled:
            raise SubprocessCancelled(f"{cmd[0]} was stopped: the work was cancelled")
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    finally:
        if proc.poll() is None:  # an exception (KeyboardInterrupt...) between start and reaping
            _kill_group(proc)
            proc.wait()
        if cancel is not None:
            cancel._unregister(proc)
