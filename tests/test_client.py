"""Client library (sync and asyncio), CLI and load generator against real servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest

from client import AsyncTranslatorClient, StreamItem, TranslatorClient, TranslatorError
from client.load import load_sentences, percentile, run_load
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.conftest import REPO_ROOT, free_port

LINES = [
    "Open the file",
    "Save changes to the document before closing?",
    "",
    "Do you want to continue?",
    "First line\\nsecond line",  # escaped newline inside one segment (--escaped)
    "Print",
]


def cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=timeout,
    )


def test_cli_arguments(tiny_server):
    p = cli("--target", tiny_server.target, "--max-length", "6", "--scores", "Open the file", "Print")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 2
    score, text = lines[0].split("\t")
    assert float(score) <= 0 and text


def test_cli_stdin_keeps_order_in_batches(tiny_server):
    lines = LINES * 7  # 42 lines, 7 per request, 3 requests in flight
    p = cli(
        "--target",
        tiny_server.target,
        "--max-length",
        "6",
        "--batch-size",
        "7",
        "--parallel",
        "3",
        "--escaped",
        stdin="\n".join(lines) + "\n",
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    with TranslatorClient(tiny_server.target) as c:
        expected = c.translate([t.replace("\\n", "\n") for t in LINES], max_length=6)
    for i, line in enumerate(out):
        assert line == expected[i % len(LINES)].text.replace("\\", "\\\\").replace("\n", "\\n")
    assert out[2] == ""  # empty line -> empty translation


def test_cli_info(tiny_server):
    p = cli("--target", tiny_server.target, "--info")
    assert p.returncode == 0, p.stderr
    rows = dict(line.split(":", 1) for line in p.stdout.splitlines())
    assert list(rows) == ["model", "languages", "batching", "memory", "limits", "defaults"]
    assert rows["model"].split()[0] == "tiny-test" and "fp32 on CPUExecutionProvider" in rows["model"]
    assert rows["languages"].strip() == "en -> es"
    assert rows["batching"].strip() in ("inflight", "request", "off", "on")
    assert rows["memory"].strip() == "off"  # the tiny bundle has no translation memory
    assert "16 texts and 4194304 bytes per request" in rows["limits"]
    assert all(k in rows["defaults"] for k in ("beam size ", "n-best ", "length penalty ", "max length "))


# 16 distinct texts: a request decodes a repeated text once.
DISTINCT_NOUNS = "file folder page image table chart note list map song video book menu tab form card".split()


def test_cli_exit_codes(tiny_server, start_server, tiny_bundle):
    down = cli("--target", f"127.0.0.1:{free_port()}", "--wait-s", "0.5", "hello")
    assert down.returncode == 3 and "not ready within 0.5 s" in down.stderr
    no_wait = cli("--target", f"127.0.0.1:{free_port()}", "--wait-s", "0", "--retries", "1", "hello")
    assert no_wait.returncode == 3 and "cannot reach" in no_wait.stderr
    bad = cli("--target", tiny_server.target, "--beam-size", "99", "hello")
    assert bad.returncode == 4 and "beam_size=99" in bad.stderr
    slow = cli(
        "--target",
        tiny_server.target,
        "--beam-size",
        "8",
        "--max-length",
        "256",
        "--batch-size",
        "16",
        "--timeout",
        "0.3",
        stdin="\n".join(f"Open the {w} and save it" for w in DISTINCT_NOUNS),
    )
    assert slow.returncode == 5 and "deadline" in slow.stderr
    secured = start_server(tiny_bundle, auth_token="abc")
    denied = cli("--target", secured.target, "hello")
    assert denied.returncode == 7 and "--token" in denied.stderr
    ok = cli("--target", secured.target, "--token", "abc", "--max-length", "4", "hello")
    assert ok.returncode == 0 and ok.stdout.strip()


def test_retries_back_off_on_unavailable():
    t0 = time.monotonic()
    with TranslatorClient(f"127.0.0.1:{free_port()}", retries=3, backoff=0.1, timeout=20) as c:
        with pytest.raises(TranslatorError) as e:
            c.translate(["hello"])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - t0 >= 0.35  # 0.05-0.1 + 0.1-0.2 + 0.2-0.4 s of backoff


def test_async_client(tiny_server):
    async def main():
        async with AsyncTranslatorClient(tiny_server.target, timeout=30) as c:
            assert await c.health() == "SERVING"
            info = await c.model_info()
            one = await c.translate_text("Open the file", max_length=6)
            many = await asyncio.gather(*(c.translate([t], max_length=6) for t in ["Open the file", "Print"]))
            stream = [
                r
                async for r in c.translate_stream(
                    [
                        StreamItem("x", ["Open the file"], max_length=6),
                        StreamItem("y", ["Print"], beam_size=99),
                    ]
                )
            ]
            with pytest.raises(TranslatorError) as e:
                await c.translate(["x"], num_hypotheses=5, beam_size=2)
            return info, one, many, stream, e.value

    info, one, many, stream, error = asyncio.run(main())
    assert info.name == "tiny-test"
    assert one == many[0][0].text
    by_id = {r.request_id: r for r in stream}
    assert by_id["x"].ok and by_id["x"].translations[0].text == one
    assert by_id["y"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


def test_percentile():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 95) == 95 and percentile(values, 99) == 99
    assert percentile([3.0], 99) == 3.0


def test_load_generator(tiny_server):
    sentences = load_sentences()
    assert len(sentences) >= 10 and all(s.strip() for s in sentences)

    async def main():
        async with AsyncTranslatorClient(tiny_server.target, timeout=30) as c:
            closed = await run_load(c, sentences, duration=1.0, concurrency=4, options={"max_length": 8})
            opened = await run_load(c, sentences, duration=1.0, rate=20, options={"max_length": 8})
            return closed, opened

    closed, opened = asyncio.run(main())
    for report in (closed, opened):
        assert report.ok > 0 and not report.errors
        lat = report.latency_ms
        assert lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert 10 <= opened.requests <= 21


def test_load_cli_json_compares_targets(tiny_server):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "client.load",
            "--target",
            tiny_server.target,
            "--target",
            tiny_server.target,
            "--label",
            "a",
            "--label",
            "b",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--concurrency",
            "2",
            "--max-length",
            "6",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    reports = json.loads(p.stdout)
    assert [r["label"] for r in reports] == ["a", "b"]
    assert all(r["ok"] > 0 and r["throughput_rps"] > 0 and "p99" in r["latency_ms"] for r in reports)


def test_cli_reports_notes_and_sends_the_glossary(tiny_server, tmp_path):
    # The tiny random model cannot keep placeholders: the text layer keeps the source and says so.
    text = "Copy %s to %s and then %d more"
    p = cli("--target", tiny_server.target, "--beam-size", "1", text)
    assert p.returncode == 0, p.stderr
    notes = [line for line in p.stderr.splitlines() if line.startswith("note: text 1:")]
    assert notes and all("kept untranslated" in n or "repaired" in n for n in notes), p.stderr
    out = p.stdout.rstrip("\n")
    assert [out.count(x) for x in ("%s", "%d")] == [2, 1]
    quiet = cli("--target", tiny_server.target, "--beam-size", "1", "--no-notes", text)
    assert "note:" not in quiet.stderr and quiet.stdout == p.stdout
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("# terms\nproxy server\tpasarela\nfile\n", encoding="utf-8")
    g = cli(
        "--target",
        tiny_server.target,
        "--glossary",
        str(glossary),
        "--keep",
        "Inkscape",
        "proxy server",
        "Inkscape",
    )
    assert g.returncode == 0 and g.stdout == "pasarela\nInkscape\n", (g.stdout, g.stderr)
    bad = glossary.with_name("bad.tsv")
    bad.write_text("File\tArchivo\nfile\tFichero\n", encoding="utf-8")
    refused = cli("--target", tiny_server.target, "--glossary", str(bad), "hello")
    assert refused.returncode == 4 and "repeats glossary[0]" in refused.stderr


# ---- retries, against a scripted server ------------------------------------------------------------


class ScriptedTranslator(pb_grpc.TranslatorServicer):
    """Answers Translate with the next failure of `script` ((code, details, retry-after-ms or None)),
    then OK once the script is spent; records when each attempt came."""

    def __init__(self, script: list[tuple[grpc.StatusCode, str, int | None]]) -> None:
        self.script = list(script)
        self.attempts: list[float] = []

    def Translate(self, request, context):
        self.attempts.append(time.monotonic())
        if self.script:
            code, details, retry_after = self.script.pop(0)
            if retry_after is not None:
                context.set_trailing_metadata((("retry-after-ms", str(retry_after)),))
            context.abort(code, details)
        return pb.TranslateResponse(
            translations=[pb.Translation(hypotheses=[pb.Hypothesis(text=t[::-1])]) for t in request.texts]
        )


@pytest.fixture()
def scripted():
    """scripted(script) -> (target, servicer): a plain grpc server on 127.0.0.1 (no model)."""
    servers = []

    def start(script):
        servicer = ScriptedTranslator(script)
        server = grpc.server(futures.ThreadPoolExecutor(2))
        pb_grpc.add_TranslatorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", servicer

    yield start
    for server in servers:
        server.stop(0)


UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, "the model is loading; retry shortly", None)
BUSY = (grpc.StatusCode.RESOURCE_EXHAUSTED, "server busy: 9 segments queued (capacity 8)", 300)


def test_unavailable_is_retried_with_doubling_backoff(scripted):
    target, servicer = scripted([UNAVAILABLE, UNAVAILABLE, UNAVAILABLE])
    with TranslatorClient(target, retries=3, backoff=0.1, max_backoff=5, timeout=20) as c:
        assert c.translate(["abc"])[0].text == "cba"
    gaps = [b - a for a, b in zip(servicer.attempts, servicer.attempts[1:], strict=False)]
    assert len(servicer.attempts) == 4  # 3 failures, then the answer
    # backoff x 2^attempt x jitter in [0.5, 1]: 0.05-0.1, 0.1-0.2, 0.2-0.4 s
    for gap, (low, high) in zip(gaps, [(0.05, 0.1), (0.1, 0.2), (0.2, 0.4)], strict=True):
        assert low - 0.01 <= gap <= high + 0.15, gaps


def test_retries_stop_after_the_count_and_max_backoff_caps_the_wait(scripted):
    target, servicer = scripted([UNAVAILABLE] * 5)
    with TranslatorClient(target, retries=2, backoff=1.0, max_backoff=0.1, timeout=20) as c:
        with pytest.raises(TranslatorError) as e:
            c.translate(["abc"])
    assert (
        e.value.code == grpc.StatusCode.UNAVAILABLE
        and e.value.details == "the model is loading; retry shortly"
    )
    assert len(servicer.attempts) == 3
    gaps = [b - a for a, b in zip(servicer.attempts, servicer.attempts[1:], strict=False)]
    assert all(0.04 <= gap <= 0.25 for gap in gaps), gaps  # max_backoff (0.1 s) x jitter, not 1-2 s


def test_resource_exhausted_is_not_retried_unless_asked(scripted):
    target, servicer = scripted([BUSY, BUSY])
    with TranslatorClient(target, retries=3, backoff=0.01, timeout=20) as c:
        with pytest.raises(TranslatorError) as e:
            c.translate(["abc"])
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.retry_after_ms == 300
    assert len(servicer.attempts) == 1


def test_resource_exhausted_is_retried_after_the_servers_hint(scripted):
    target, servicer = scripted([BUSY, BUSY])
    with TranslatorClient(target, retries=3, backoff=0.01, retry_resource_exhausted=True, timeout=20) as c:
        assert c.translate(["abc"])[0].text == "cba"
    assert len(servicer.attempts) == 3
    gaps = [b - a for a, b in zip(servicer.attempts, servicer.attempts[1:], strict=False)]
    assert all(0.29 <= gap <= 0.6 for gap in gaps), gaps  # retry-after-ms (300) x jitter in [1, 1.5]


def test_async_client_retries_resource_exhausted_after_the_hint(scripted):
    target, servicer = scripted([BUSY])

    async def main():
        async with AsyncTranslatorClient(target, retries=2, retry_resource_exhausted=True, timeout=20) as c:
            return await c.translate(["abc"])

    assert asyncio.run(main())[0].text == "cba"
    assert len(servicer.attempts) == 2 and servicer.attempts[1] - servicer.attempts[0] >= 0.29


def test_retries_never_outlast_the_deadline(scripted):
    target, servicer = scripted([BUSY] * 10)
    t0 = time.monotonic()
    with TranslatorClient(target, retries=10, retry_resource_exhausted=True, timeout=0.5) as c:
        with pytest.raises(TranslatorError) as e:
            c.translate(["abc"])
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert time.monotonic() - t0 < 0.9 and len(servicer.attempts) == 2  # a third would start past 0.5 s


def test_other_errors_and_oversized_messages_are_not_retried(scripted):
    too_large = (grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 4)", None)
    invalid = (grpc.StatusCode.INVALID_ARGUMENT, "texts is empty", None)
    for failure in (too_large, invalid):
        target, servicer = scripted([failure, failure])
        with TranslatorClient(
            target, retries=3, backoff=0.01, retry_resource_exhausted=True, timeout=10
        ) as c:
            with pytest.raises(TranslatorError) as e:
                c.translate(["abc"])
        assert e.value.code == failure[0] and len(servicer.attempts) == 1
