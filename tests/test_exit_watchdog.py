"""python -m server's exit is bounded: a teardown that hangs dumps every thread's stack and exits 1."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _exit(code: int, hang: bool) -> subprocess.CompletedProcess:
    script = (
        "import threading, time\n"
        "from server.__main__ import exit_with\n"
        f"if {hang}:\n"
        "    threading.Thread(target=time.sleep, args=(60,)).start()  # non-daemon: joined at exit\n"
        f"exit_with({code}, 0.5)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_a_hung_teardown_dumps_the_stacks_and_exits_1():
    started = time.monotonic()
    done = _exit(0, hang=True)
    assert time.monotonic() - started < 20
    assert done.returncode == 1
    assert "Timeout" in done.stderr
    assert "Thread 0x" in done.stderr or "Current thread" in done.stderr


def test_a_clean_teardown_keeps_its_exit_code():
    assert _exit(0, hang=False).returncode == 0
    assert _exit(2, hang=False).returncode == 2
