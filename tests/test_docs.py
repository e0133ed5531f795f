"""Executable docs: the shell examples of README.md and docs/service.md run against a real server.

How examples are found (tests/doc_examples.py): every ```console block is a transcript of `$ command`
lines (continued while a line ends with a backslash) each followed by its expected output; every
```sh / ```bash / ```shell block contributes only its commands that call the client CLI
(`python -m client` / `.venv/bin/python -m client`), which have no output to compare, so for those
the test checks that they exit 0 (a renamed flag or a broken option shows up that way).

How they run: one `python -m server` subprocess for the module, serving the shipped model
(bundles/en-es-small, or models/en-es-small exported, see the `shipped_bundle` fixture) with the
default settings, like `make run`, on free ports of 127.0.0.1. Each example is run with
`bash -c` from the repository root (timeout 60 s), after rewriting the client CLI to
`sys.executable -m client --target 127.0.0.1:PORT` (any --target of the example is replaced) and
localhost:50051 / localhost:8000 to the server's gRPC / metrics addresses; the environment has no
TRANSLATOR_* variable but TRANSLATOR_TARGET (the server). A console example passes when it exits 0
and its stdout equals the documented output (each line right-stripped, trailing blank lines
dropped); an example that documents an error message may instead match stdout followed by stderr,
whatever its exit status.

Examples that cannot run here (a second server, docker, files the repository does not hold, data/
from `make corpus`, TLS material, ...) are listed in SKIPPED with the reason, and reported as skipped.
Any other example that is not a plain client call (only the client CLI piped through harmless text
tools, reading only files of the repository, writing none) fails: a new example is never silently
ignored. A SKIPPED entry that matches no example fails too, so the list cannot go stale.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from client.load import free_port
from tests.conftest import REPO_ROOT
from tests.doc_examples import Example, collect, parse, rewrite, why_not_runnable

DOC_FILES = ("README.md", "docs/service.md")
TIMEOUT_S = 60


@dataclass(frozen=True)
class Skip:
    path: str  # doc file
    command: str  # regular expression searched in the example's command (not its line: docs move)
    reason: str


SKIPPED = (
    Skip(
        "README.md",
        r"^\.venv/bin/python -m client < input\.en > output\.es",
        "reads the user's input.en and writes output.es: files the repository does not hold",
    ),
    Skip(
        "docs/service.md",
        r"^python -m client --target host:50051 --beam-size 1 < in\.en > out\.es",
        "reads the user's in.en and writes out.es: files the repository does not hold",
    ),
    Skip(
        "docs/service.md",
        r"^python -m client --escaped < data/test\.en",
        "needs data/test.en from `make corpus`",
    ),
)

EXAMPLES, PARSE_ERRORS = collect(REPO_ROOT, DOC_FILES)


def skip_reason(example: Example) -> str | None:
    for skip in SKIPPED:
        if skip.path == example.path and re.search(skip.command, example.command):
            return skip.reason
    return None


def lines_of(text: str) -> list[str]:
    out = [line.rstrip() for line in text.splitlines()]
    while out and not out[-1]:
        out.pop()
    return out


@dataclass
class DocServer:
    proc: subprocess.Popen
    target: str
    metrics: str
    log_path: Path


@pytest.fixture(scope="module")
def doc_server(shipped_store, tmp_path_factory) -> Iterator[DocServer]:
    """`python -m server` with every shipped model and default settings (like `make run`)."""
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")}
    env.update(
        TRANSLATOR_MODEL_DIR=str(shipped_store),
        TRANSLATOR_HOST="127.0.0.1",
        TRANSLATOR_PORT=str(port),
        TRANSLATOR_METRICS_PORT=str(metrics_port),
        TRANSLATOR_LOG_LEVEL="WARNING",
    )
    log_path = tmp_path_factory.mktemp("doc-server") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server"], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    server = DocServer(proc, f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}", log_path)
    try:
        wait_until_serving(server, timeout=180)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_until_serving(server: DocServer, timeout: float) -> None:
    from client import TranslatorClient, TranslatorError

    end = time.monotonic() + timeout
    with TranslatorClient(server.target) as c:
        while time.monotonic() < end:
            if server.proc.poll() is not None:
                pytest.fail(
                    f"the doc server exited with {server.proc.returncode}:\n"
                    + server.log_path.read_text()[-4000:]
                )
            try:
                if c.health(timeout=2) == "SERVING":
                    return
            except TranslatorError:
                pass
            time.sleep(0.1)
    pytest.fail(f"the doc server was not SERVING after {timeout}s:\n{server.log_path.read_text()[-4000:]}")


def run_example(example: Example, target: str, metrics: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")}
    env["TRANSLATOR_TARGET"] = target
    env["PYTHONIOENCODING"] = "utf-8"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", rewrite(example.command, sys.executable, target, metrics)],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=TIMEOUT_S,
    )


def failure(example: Example, proc: subprocess.CompletedProcess, problem: str) -> str:
    return (
        f"{example.describe()}\n{problem}\n"
        f"ran: {proc.args[-1]}\nexit status: {proc.returncode}\n"
        f"stderr:\n{proc.stderr[-3000:]}\n"
        "(if the docs are right and the code changed, fix the code; if the example is out of date, "
        "update the docs; if it cannot run in the tests, list it in SKIPPED in tests/test_docs.py)"
    )


def test_docs_parse():
    assert not PARSE_ERRORS, "\n".join(f"{e.id}: {e.message}" for e in PARSE_ERRORS)


SAMPLE_DOC = """\
```console
$ python -m client "Open" \\
    "Close"   # two
Abrir

Cerrar

$ python -m client --info | head -1
name: "en-es-small"
```

```sh
make run   # not an example
python -m client.load --duration 5
.venv/bin/python -m client --beam-size 1 \\
    "Print"
```
"""


def test_parser():
    examples, errors = parse(SAMPLE_DOC, "X.md")
    assert errors == []
    assert [(e.id, e.kind, e.expected) for e in examples] == [
        ("X.md:2", "console", ("Abrir", "", "Cerrar")),
        ("X.md:8", "console", ('name: "en-es-small"',)),
        ("X.md:15", "sh", None),
    ]
    assert examples[0].command == 'python -m client "Open" \\\n    "Close"   # two'
    assert examples[2].command == '.venv/bin/python -m client --beam-size 1 \\\n    "Print"'
    _, errors = parse("```console\nAbrir\n```\n", "Y.md")
    assert [e.id for e in errors] == ["Y.md:2"]


def test_rewrite_and_runnable():
    assert rewrite(".venv/bin/python -m client --target host:50051 x", "/py", "T", "M") == (
        "/py -m client --target T  x"
    )
    assert rewrite("curl -s localhost:8000/metrics", "/py", "T", "M") == "curl -s M/metrics"
    assert why_not_runnable('python -m client "a" 2>&1 | head -1', REPO_ROOT) is None
    assert why_not_runnable("python -m client < client/sample.en > /dev/null", REPO_ROOT) is None
    assert "writes" in why_not_runnable("python -m client x > out.es", REPO_ROOT)
    assert "reads" in why_not_runnable("python -m client < nowhere.en", REPO_ROOT)
    assert "background" in why_not_runnable("python -m client x & python -m client y", REPO_ROOT)
    assert "server" in why_not_runnable("python -m server & python -m client x", REPO_ROOT)
    assert "'make'" in why_not_runnable("make run && python -m client x", REPO_ROOT)
    assert "client CLI" in why_not_runnable("python -m client.load --duration 5", REPO_ROOT)
    assert "client.load" in why_not_runnable("python -m client.load | python -m client", REPO_ROOT)


def test_docs_have_examples():
    assert any(e.kind == "console" for e in EXAMPLES), f"no ```console example in {DOC_FILES}"


def test_skip_list_is_current():
    stale = [
        s for s in SKIPPED if not any(e.path == s.path and re.search(s.command, e.command) for e in EXAMPLES)
    ]
    assert not stale, f"SKIPPED entries that match no example of the docs (remove them): {stale}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_doc_example(example: Example, request):
    reason = skip_reason(example)
    if reason is not None:
        pytest.skip(f"{example.id}: {reason}")
    problem = why_not_runnable(example.command, REPO_ROOT)
    if problem is not None:
        pytest.fail(
            f"{example.describe()}\ncannot run it here: {problem}.\n"
            "List it in SKIPPED in tests/test_docs.py with the reason, or make it a plain client call."
        )
    server = request.getfixturevalue("doc_server")
    try:
        proc = run_example(example, server.target, server.metrics)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{example.describe()}\nno result within {TIMEOUT_S}s; stderr:\n{e.stderr!r}")
    if example.expected is None:
        assert proc.returncode == 0, failure(example, proc, "the command failed")
        return
    expected = lines_of("\n".join(example.expected))
    stdout = lines_of(proc.stdout)
    if proc.returncode == 0 and stdout == expected:
        return
    if lines_of(proc.stdout + proc.stderr) == expected:
        return  # the example documents what the command says on stderr (an error message)
    diff = "\n".join(
        difflib.unified_diff(expected, stdout, f"{example.id} (documented)", "stdout (actual)", lineterm="")
    )
    problem = "the output differs from the docs" if proc.returncode == 0 else "the command failed"
    pytest.fail(failure(example, proc, f"{problem}:\n{diff}"))
