"""The command line against real servers: the client CLI's requests within the server's limits, its
exit codes (TLS failures, a message over the size limit), its wait for a server that is starting, its
output formats; and the Makefile: `make help`, the data/ check of the targets that need the corpus,
where the tokenizer and the evaluation report go."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from client import AsyncTranslatorClient, TLSError, TranslatorClient, TranslatorError, split_batches
from client.load import free_port
from tests.conftest import REPO_ROOT
from tests.test_client import cli
from tests.test_service import make_pki, pki  # noqa: F401 (pki: a fixture)

SAMPLE = REPO_ROOT / "client" / "sample.en"
SCORED = re.compile(r"^-?\d+\.\d{4}\t")


# ---- requests within the server's limits ------------------------------------------------------------


def test_split_batches_by_texts_and_bytes():
    texts = [f"t{i}" for i in range(10)]
    assert [len(b) for b in split_batches(texts, 4)] == [4, 4, 2]
    assert sum(split_batches(texts, 4), []) == texts
    big = ["x" * 100] * 5  # 102 bytes each inside a TranslateRequest
    assert [len(b) for b in split_batches(big, 64, max_bytes=250)] == [2, 2, 1]
    assert [len(b) for b in split_batches(big, 64, max_bytes=250, fixed_bytes=50)] == [1] * 5
    with pytest.raises(TranslatorError) as e:
        split_batches(["ok", "x" * 300], 64, max_bytes=250)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "text 2 is 300 bytes, more than the 250 bytes" in e.value.details


def test_cli_batch_size_is_capped_by_the_servers_limit(tiny_server):
    """tiny_server takes 16 texts per request: --batch-size 40 with 40 lines used to go out as one
    request and fail with `too many texts`."""
    lines = SAMPLE.read_text().splitlines()
    assert len(lines) == 40
    p = cli("--target", tiny_server.target, "--max-length", "3", "--batch-size", "40", stdin="\n".join(lines))
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 40
    with TranslatorClient(tiny_server.target) as c:
        assert [len(b) for b in c.batches(lines, 40)] == [16, 16, 8]
        assert sum(c.batches(lines, 40), []) == lines


def test_message_over_the_size_limit_is_not_retried(start_server, tiny_bundle):
    server = start_server(tiny_bundle, max_message_bytes=2000)
    line = "Open the file and save it. " * 20  # 540 bytes: 3 per request
    p = cli("--target", server.target, "--max-length", "2", stdin=(line + "\n") * 6)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 6
    # One line alone over the limit: checked before sending, exit 4 (invalid request), not 6 (busy).
    p = cli("--target", server.target, stdin="x" * 3000 + "\n")
    assert p.returncode == 4, p.stderr
    assert "text 1 is 3000 bytes, more than the 2000 bytes" in p.stderr and "overloaded" not in p.stderr
    # The library, retrying RESOURCE_EXHAUSTED, still gives up at once on gRPC's size error.
    with TranslatorClient(server.target, retries=5, retry_resource_exhausted=True, timeout=30) as c:
        delays = []
        retry_delay = c._retry_delay
        c._retry_delay = lambda *a: delays.append(retry_delay(*a)) or delays[-1]
        with pytest.raises(TranslatorError) as e:
            c.translate(["x" * 3000])
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.message_too_large
    assert delays == [None]


# ---- TLS failures: exit 7 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> dict[str, Path]:
    """A second CA with its own certificates: what servers of the first CA must refuse."""
    return make_pki(tmp_path_factory.mktemp("other-pki"), stems=("ca", "client"))


def test_cli_tls_failures_exit_7(start_server, tiny_bundle, tiny_server, pki, other_pki):  # noqa: F811
    server = start_server(
        tiny_bundle,
        tls_cert=str(pki["server_pem"]),
        tls_key=str(pki["server_key"]),
        tls_client_ca=str(pki["ca_pem"]),
    )
    target = ["--target", server.target, "--max-length", "3"]
    trust = [*target, "--ca-cert", str(pki["ca_pem"]), "--server-name", "localhost"]
    mine = ["--cert", str(pki["client_pem"]), "--key", str(pki["client_key"])]
    theirs = ["--cert", str(other_pki["client_pem"]), "--key", str(other_pki["client_key"])]
    ok = cli(*trust, *mine, "hello")
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr
    cases = {
        "no client certificate": ([*trust], "refused the client certificate"),
        "client certificate of another CA": ([*trust, *theirs], "refused the client certificate"),
        "the same, without the wait": ([*trust, *theirs, "--wait-s", "0"], "refused the client certificate"),
        "server certificate not verified": (
            [*target, "--ca-cert", str(other_pki["ca_pem"]), "--server-name", "localhost", *mine],
            "could not be verified",
        ),
        "wrong server name": (
            [*target, "--ca-cert", str(pki["ca_pem"]), "--server-name", "x", *mine],
            "does not name",
        ),
        "plaintext client": ([*target], "the server uses TLS"),
        "TLS client, plaintext server": (
            ["--target", tiny_server.target, "--ca-cert", str(pki["ca_pem"])],
            "does not use TLS",
        ),
    }
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(cases, pool.map(lambda a: cli(*a[0], "hello"), cases.values()), strict=True))
    for name, p in results.items():
        assert p.returncode == 7, (name, p.stderr)
        assert cases[name][1] in p.stderr and "Is it running" not in p.stderr, (name, p.stderr)

    # The library: TLSError (gRPC's UNAVAILABLE) with the problem named, sync and asyncio alike.
    tls = dict(ca_cert=pki["ca_pem"], server_name="localhost", retries=0, timeout=10)
    with TranslatorClient(server.target, **tls) as c, pytest.raises(TLSError) as e:
        c.translate(["hello"])
    assert e.value.problem == "client_cert" and e.value.code == grpc.StatusCode.UNAVAILABLE

    async def attempt() -> None:
        async with AsyncTranslatorClient(server.target, **tls) as c:
            await c.translate(["hello"])

    with pytest.raises(TLSError) as e:
        asyncio.run(attempt())
    assert e.value.problem == "client_cert"


# ---- waiting for the server ----------------------------------------------------------------------------


@pytest.fixture()
def loading_server():
    """A gRPC server whose health service answers NOT_SERVING, like a server loading its model."""
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_cli_gives_up_waiting_with_exit_3(loading_server):
    p = cli("--target", loading_server, "--wait-s", "1", "hello")
    assert p.returncode == 3
    lines = p.stderr.splitlines()
    assert lines[0] == f"waiting for the server at {loading_server} to be ready... (up to 1 s, --wait-s)"
    assert p.stderr.count("waiting for") == 1
    assert f"the server at {loading_server} was not ready within 1 s" in p.stderr
    assert "NOT_SERVING: still loading its model" in p.stderr and "--wait-s" in lines[-1]


def test_cli_waits_for_a_server_that_is_starting(server_process, tiny_bundle):
    """The CLI starts first (connection refused), the server after it (then NOT_SERVING while it
    loads): the translation comes once it is ready, after one line on stderr."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "client", "--target", target, "--wait-s", "120", "--max-length", "4", "hello"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()  # printed at the first answer that is not SERVING
        assert first == f"waiting for the server at {target} to be ready... (up to 120 s, --wait-s)\n"
        server_process({"TRANSLATOR_MODEL_DIR": str(tiny_bundle), "TRANSLATOR_PORT": str(port)})
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert len(out.splitlines()) == 1 and out.strip()
    assert "waiting" not in err


# ---- output formats --------------------------------------------------------------------------------------


def test_cli_nbest_and_score_format(tiny_server):
    args = ["--target", tiny_server.target, "--max-length", "4", "--scores"]
    p = cli(*args, "--beam-size", "3", "--num-hypotheses", "2", "Open", "Print")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert len(lines) == 7 and lines[2] == lines[5] == lines[6] == ""  # 2 lines per text, then a blank
    with TranslatorClient(tiny_server.target) as c:
        expected = c.translate(
            ["Open", "Print"], beam_size=3, num_hypotheses=2, max_length=4, return_scores=True
        )
    for group, t in zip((lines[0:2], lines[3:5]), expected, strict=True):
        assert all(SCORED.match(line) for line in group), group
        scores = [float(line.split("\t")[0]) for line in group]
        assert scores == sorted(scores, reverse=True)  # best first
        assert scores == [round(h.score, 4) for h in t.hypotheses]
        assert [line.split("\t", 1)[1] for line in group] == [
            re.sub(r"\r\n|[\r\n]", " ", h.text) for h in t.hypotheses
        ]
    one = cli(*args, "Open")
    assert one.returncode == 0 and SCORED.match(one.stdout) and len(one.stdout.splitlines()) == 1


# ---- Makefile ------------------------------------------------------------------------------------------


def make(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPO_ROOT / "Makefile"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def makefile_targets() -> tuple[set[str], set[str]]:
    """Targets of the Makefile's rules (plain names) and its .PHONY list."""
    text = (REPO_ROOT / "Makefile").read_text()
    rules = {t for m in re.finditer(r"^([a-z][\w -]*):(?!=)", text, re.M) for t in m.group(1).split()}
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())
    return rules, phony


def test_make_help_lists_every_target():
    rules, phony = makefile_targets()
    assert rules == phony
    assert {"lint", "proto", "install", "system-deps", "clean", "bench-batching", "release"} <= rules
    assert {"tune-decoding", "model-card", "data-check", "serve"} <= rules
    p = make("help")
    assert p.returncode == 0, p.stderr
    missing = [t for t in sorted(rules - {"help"}) if not re.search(rf"\bmake {re.escape(t)}\b", p.stdout)]
    assert not missing, f"make help does not list {missing}"
    assert re.search(r"make clean .*\.venv/ and bundles/", p.stdout)


NEEDS_DATA = ["tokenizer", "train", "average", "tune-decoding", "evaluate", "model-card"]


@pytest.mark.parametrize("target", NEEDS_DATA)
def test_targets_that_need_data_say_what_to_run(target, tmp_path):
    """-n: even if the check were gone, nothing would run."""
    p = make("-n", target, f"DATA={tmp_path}")
    assert p.returncode == 2
    lines = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert (
        f"{tmp_path}/ is incomplete (no manifest.json): run `make corpus DATA={tmp_path}` first" in lines[0]
    )


def test_data_check_message_from_a_clean_clone(tmp_path):
    p = make("data-check", cwd=tmp_path)  # no data/ there, default DATA
    assert p.returncode == 2
    assert p.stdout == "" and len(p.stderr.splitlines()) == 1
    assert "data/ is missing: run `make corpus` first (about 1 minute)" in p.stderr


def test_pipeline_targets_write_to_runs(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    bench = make("-n", "bench", f"DATA={tmp_path / 'no-corpus'}")  # the shipped sample: no corpus needed
    assert bench.returncode == 0 and "bench.engine_speed" in bench.stdout, bench.stderr
    tokenizer = make("-n", "tokenizer", f"DATA={tmp_path}")
    assert tokenizer.returncode == 0, tokenizer.stderr
    assert "--out runs/tokenizer" in tokenizer.stdout and "--out models/" not in tokenizer.stdout
    train = make("-n", "train", f"DATA={tmp_path}", "TOKENIZER=runs/tokenizer/tokenizer.model")
    assert "--tokenizer runs/tokenizer/tokenizer.model" in train.stdout, train.stderr
    assert "release/tokenizer.model models/en-es-small/" in make("-n", "release").stdout
    evaluate = make("-n", "evaluate", f"DATA={tmp_path}")
    assert evaluate.returncode == 0 and "--json runs/eval.json" in evaluate.stdout, evaluate.stderr
