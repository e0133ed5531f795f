"""The benchmarks of bench/ (they may import everything; these tests are the only importers): the
engine-level ones on a tiny exported bundle, the batching modes benchmark's arithmetic on made-up runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.batching import markdown, merge, metric_total, plot, summarize, sustained
from tests.test_export import TinyBundle, build_tiny_bundle


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    """The tiny bundle of test_export.py (exported once per session, whichever module asks first)."""
    return build_tiny_bundle(tmp_path_factory)


# ---- bench.step_cost and bench.saturation ---------------------------------------------------------------


@pytest.mark.usefixtures("torch_single_thread")
def test_step_cost_times_both_cache_placements(tiny: TinyBundle, tmp_path: Path, capsys):
    from bench import step_cost

    out = tmp_path / "cost.json"
    argv = ["--bundle", str(tiny.bundle), "--rows", "1,3", "--capacities", "16", "--iters", "2"]
    argv += ["--reps", "1"]
    assert step_cost.main([*argv, "--cache", "both", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["cache"]) == {"host", "device"} and report["providers"][0] == "CPUExecutionProvider"
    for where in ("host", "device"):
        ms = report["cache"][where]["ms_per_step"]["16"]
        assert set(ms) == {"1", "3"} and all(v > 0 for v in ms.values())
        assert {"fixed_ms", "per_row_ms"} <= set(report["cache"][where]["fit"]["16"])
    assert "Summary (device cache)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        step_cost.main([*argv, "--cache", "gpu"])


@pytest.mark.usefixtures("torch_single_thread")
def test_saturation_modes_run_the_same_row_steps(tiny: TinyBundle, tmp_path: Path, capsys):
    """Finished sentences leave the batch in every mode, so request-level and in-flight batching run the
    same decoder row-steps for the same sentences; only what a row-step costs differs."""
    from bench import saturation

    out = tmp_path / "saturation.json"
    argv = ["--bundle", str(tiny.bundle), "--data", str(tmp_path), "--sentences", "12", "--beams", "1,3"]
    assert saturation.main([*argv, "--batch", "5", "--rows", "9", "--reps", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sentences"] == 12 and report["inflight_kv"] == "host"
    capsys.readouterr()
    assert saturation.main([*argv, "--io-binding", "--reps", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["inflight_kv"] == "device"
    for beam, modes in report["beams"].items():
        assert set(modes) == set(saturation.MODES)
        assert len({r["row_steps"] for r in modes.values()}) == 1  # the invariant
        assert modes["inflight"]["mean_rows"] <= 9 and modes["request-arrival"]["mean_rows"] <= 5 * int(beam)
        assert modes["inflight"]["steps"] < modes["request-arrival"]["steps"]
        for r in modes.values():  # the graph runs were timed: host time is the rest
            assert 0 < r["ort_seconds"] < r["seconds"] and r["host_ms_per_step"] > 0
            host_ms = 1000 * (r["seconds"] - r["ort_seconds"])
            assert r["host_ms_per_sentence"] == pytest.approx(host_ms / 12)
    assert "inflight / request-sorted" in capsys.readouterr().out.splitlines()[-1]


# ---- bench.batching: the summary's arithmetic ----------------------------------------------------------


def _run(mode: str, kind: str, sent_s: float, p95: float, **extra) -> dict:
    return {"mode": mode, "beam": 1, "kind": kind, "sentences_per_s": sent_s, "p95_ms": p95, "n": 100} | extra


def test_bench_batching_merges_repetitions_into_medians():
    def rep(sent_s, p95, errors=None, short_p95=None):
        r = {"elapsed_s": 10.0, "sentences": int(sent_s * 10), "n": int(sent_s * 10), "errors": errors or {}}
        r |= {"sentences_per_s": sent_s, "p50_ms": p95 / 2, "p95_ms": p95, "p99_ms": p95, "mean_ms": p95 / 2}
        if short_p95 is not None:
            r["by_class"] = {
                "short": {"n": 5, "p50_ms": 1.0, "p95_ms": short_p95, "p99_ms": 1.0, "mean_ms": 1.0}
            }
        return r

    m = merge([rep(90.0, 300.0, short_p95=50.0), rep(120.0, 900.0, short_p95=70.0), rep(100.0, 400.0)])
    assert m["repeats"] == 3 and m["sentences_per_s"] == 100.0 and m["p95_ms"] == 400.0  # medians
    assert (m["sentences_per_s_min"], m["sentences_per_s_max"]) == (90.0, 120.0)
    assert (m["p95_ms_min"], m["p95_ms_max"]) == (300.0, 900.0)
    assert m["sentences"] == 3100 and m["elapsed_s"] == 30.0 and m["errors"] == {}
    assert m["by_class"]["short"] == {"n": 10, "p50_ms": 1.0, "p95_ms": 60.0, "p99_ms": 1.0, "mean_ms": 1.0}
    # Sustained at 100/s offered: 3100 of 3000 answered, median p95 400 within 500 (one rep was not).
    assert sustained({"rate": 100.0} | m, 500.0)
    assert not sustained({"rate": 110.0} | m, 500.0)  # 3100 of 3300 offered: under 95%
    refused = merge([rep(100.0, 300.0), rep(100.0, 300.0, errors={"RESOURCE_EXHAUSTED": 2})])
    assert refused["errors"] == {"RESOURCE_EXHAUSTED": 2} and not sustained({"rate": 100.0} | refused, 500.0)


def test_bench_batching_summary_objective_and_sustained_rates(tmp_path):
    def opened(mode, rate, got, p95, errors=None, kind="open"):
        answered = int(got * 10)  # over 10 s
        return _run(mode, kind, got, p95, rate=rate, elapsed_s=10.0, sentences=answered, errors=errors or {})

    runs = [
        _run("request", "closed", 80.0, 300.0, concurrency=4),
        _run("request", "closed", 100.0, 500.0, concurrency=16),  # saturation: the p95 objective is 500
        _run("inflight", "closed", 130.0, 650.0, concurrency=16),
        opened("request", 80.0, 80.0, 200.0),
        opened("request", 100.0, 97.0, 900.0),  # over the objective
        opened("inflight", 100.0, 100.0, 150.0)
        | {"sentences_per_s_min": 95.0, "sentences_per_s_max": 101.0}
        | {"p95_ms_min": 120.0, "p95_ms_max": 210.0},  # with the spread of its repetitions
        opened("inflight", 120.0, 119.0, 450.0, kind="search"),
        opened("inflight", 140.0, 120.0, 400.0),  # fell behind: 86% of the offered rate
        opened("inflight", 130.0, 129.0, 300.0, errors={"RESOURCE_EXHAUSTED": 1}),  # refused some
        _run("inflight", "mixed", 50.0, 600.0, concurrency=16, by_class={"short": {"p95_ms": 90.0}}),
    ]
    s = summarize(runs, [1], ["request", "inflight"])["beam1"]
    assert s["p95_objective_ms"] == 500.0
    assert s["request"]["sustained_sentences_per_s_within_objective"] == 80.0
    assert s["inflight"]["sustained_sentences_per_s_within_objective"] == 119.0
    assert s["inflight"]["sustained_vs_request_within_objective"] == pytest.approx(119.0 / 80.0)
    assert s["inflight"]["closed_max_vs_request"] == pytest.approx(1.3)
    assert s["inflight"]["mixed_short_p95_ms"] == 90.0 and s["request"]["mixed_short_p95_ms"] is None
    assert s["objective_at_concurrency"] == 16
    # A deeper level on the plateau (within 5% of the best) is where request-level batching is
    # saturated: its p95 becomes the objective, whichever level happened to measure fastest.
    plateau = [*runs, _run("request", "closed", 96.0, 900.0, concurrency=48)]
    deeper = summarize(plateau, [1], ["request", "inflight"])["beam1"]
    assert deeper["p95_objective_ms"] == 900.0 and deeper["objective_at_concurrency"] == 48
    assert deeper["request"]["sustained_sentences_per_s_within_objective"] == 97.0  # p95 900: now within
    assert deeper["inflight"]["sustained_sentences_per_s_within_objective"] == 119.0
    table = markdown({"beam1": s})
    assert "| 1 (objective 500 ms) | inflight | 130.0 (16) | 650 | 119.0 | 1.49 | 90 | - |" in table
    report = {"config": {"beams": [1], "modes": ["request", "inflight"], "title": "t"}, "runs": runs}
    report["summary"] = {"beam1": s}
    plot(report, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


# ---- bench.engine_speed ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("torch_single_thread")
def test_engine_speed_runs_on_the_shipped_sample_without_a_corpus(tiny: TinyBundle, tmp_path: Path, capsys):
    """`make bench` from a clean clone: no data/ directory, the shipped sentences, the CPU named."""
    from bench import engine_speed
    from bench.machine import sample_texts

    texts = sample_texts()
    assert len(texts) == 64 and len(set(texts)) == 64
    assert sum(len(t.split()) > 15 for t in texts) >= 24 and sum(len(t.split()) <= 6 for t in texts) >= 24
    out = tmp_path / "speed.json"
    argv = ["--model", str(tiny.checkpoint), "--bundle", str(tiny.bundle), "--sentences", "6", "--reps", "1"]
    argv += ["--threads", "1", "--systems", "engine-fp32,engine-int8,peer-fp32"]
    argv += ["--settings", "b1-greedy,b32-beam4"]
    argv += ["--max-source-tokens", "20"]  # the tiny bundle takes 24
    argv += ["--peer-bundle", str(tiny.bundle)]  # a candidate model's bundle; here the same one
    engine_speed.main([*argv, "--profile", "--json", str(out)])
    report = json.loads(out.read_text())
    # --profile: every engine system at every setting, with its time per decoder step
    steps = {(r["system"], r["setting"]): r["per_step"] for r in report["profile"]}
    assert set(steps) == {(s, f"batch {b}, beam {k}") for s in ("engine-fp32", "engine-int8", "peer-fp32")
                          for b, k in ((1, 1), (32, 4))}  # fmt: skip
    assert all(p["steps"] > 0 and p["decoder_us"] > 0 and p["host_us"] >= 0 for p in steps.values())
    assert report["meta"]["texts"].endswith("speed.en") and report["meta"]["sentences"] == 6
    cpu = report["meta"]["cpu"]
    assert cpu["model"] and isinstance(cpu["vector_extensions"], list) and cpu["logical_cpus"] >= 1
    assert {r["system"] for r in report["results"]} == {"engine-fp32", "engine-int8", "peer-fp32"}
    assert set(report["ratios_tokens_per_s"]["peer-fp32 / engine-fp32"]) == {"b1-greedy", "b32-beam4"}
    paired = report["paired_ratios_tokens_per_s"]["peer-fp32 / engine-fp32"]
    assert set(paired) == {"b1-greedy", "b32-beam4"}
    assert all(p["min"] <= p["median"] <= p["max"] for p in paired.values())
    assert report["batch1_vs_batch32_differences"] == {} or all(
        v == 0 for v in report["batch1_vs_batch32_differences"].values()
    )
    printed = capsys.readouterr().out
    assert f"CPU: {cpu['model']}" in printed and "| engine-int8 | batch 32, beam 4 |" in printed


def test_paired_ratios_cancel_a_machine_that_slows_down_between_repetitions():
    """Each repetition times the systems back to back: when the whole machine runs 2x slower in the
    second repetition, the ratio of medians drifts, the repetitions' own ratios do not."""
    from bench.engine_speed import Cell, paired_ratio

    a = Cell("engine-int8", "b1-greedy", totals=[1.0, 2.0, 1.1], tokens=1000)
    b = Cell("ct2-int8", "b1-greedy", totals=[0.5, 1.0, 0.55], tokens=1000)
    assert paired_ratio(a, b) == {"median": 0.5, "min": 0.5, "max": 0.5}
    b.totals = [0.5, 1.0, 0.44]  # b was faster in the third repetition
    assert paired_ratio(a, b) == {"median": 0.5, "min": 0.4, "max": 0.5}
    b.tokens = 2000  # tokens/s, not seconds: twice the tokens in the same time is twice as fast
    assert paired_ratio(a, b)["median"] == 0.25


@pytest.mark.usefixtures("torch_single_thread")
def test_a_peer_runs_in_its_own_process_with_the_same_outputs(tiny: TinyBundle):
    """bench.engine_speed times PyTorch and each CTranslate2 compute type in a process of its own
    (CTranslate2 slows down several-fold in a process where another OpenMP user has run): the same
    tokens as in-process, a pass timed in the child, and the child ends."""
    from bench.engine_speed import ProcessSystem, TorchSystem
    from model.tokenizer import Tokenizer
    from model.train import load_release

    texts = ["Open the file", "Save the document before closing?", "Settings"]
    tok = Tokenizer(tiny.checkpoint / "tokenizer.model")
    here = TorchSystem("torch-kv", load_release(tiny.checkpoint), tok, cache=True)
    child = ProcessSystem("torch", "torch-kv", tiny.checkpoint, "kv", 1, tiny.checkpoint / "tokenizer.model")
    try:
        assert child.process.pid != os.getpid() and child.process.is_alive()
        for beam in (1, 4):
            assert child.translate(texts, beam) == here.translate(texts, beam)
        total, latencies, outputs = child.run_pass(texts, 2, 4)
        assert outputs == here.translate(texts, 4) and len(latencies) == 2 and total >= sum(latencies) > 0
    finally:
        child.close()
    assert not child.process.is_alive()


@pytest.mark.usefixtures("torch_single_thread")
def test_ctranslate2_runs_in_its_own_process_with_the_same_outputs(tiny: TinyBundle, tmp_path: Path):
    pytest.importorskip("ctranslate2")
    from bench.engine_speed import CT2System, ProcessSystem
    from export.ctranslate2_spec import convert_model, vocabulary_pieces
    from model.tokenizer import Tokenizer
    from model.train import load_release

    tokenizer = tiny.checkpoint / "tokenizer.model"
    ct2_dir = convert_model(load_release(tiny.checkpoint), vocabulary_pieces(tokenizer), tmp_path / "ct2")
    texts = ["Open the file", "Settings"]
    here = CT2System("ct2-int8", ct2_dir, "int8", Tokenizer(tokenizer), 1)
    child = ProcessSystem("ct2", "ct2-int8", ct2_dir, "int8", 1, tokenizer)
    try:
        assert child.translate(texts, 4) == here.translate(texts, 4)
    finally:
        child.close()


def test_models_loaded_starts_a_server_and_measures_it(tiny_bundle):
    """bench.models_loaded on the tiny bundle: a real server subprocess, its memory, start-up and latency."""
    from bench.models_loaded import measure

    row = measure([tiny_bundle], requests=2, warmup=0, threads=1)
    assert row["models"] == 1 and row["rss_mb"] > 50 and 0 < row["load_s"] < 300
    assert list(row["p50_ms"]) == ["es"] and row["p50_ms"]["es"] > 0


def test_bench_batching_reads_metrics_with_and_without_labels():
    text = (
        "# TYPE translator_batch_rows histogram\n"
        'translator_batch_rows_sum{model="en-es-small"} 120.0\n'
        'translator_batch_rows_sum{model="en-fr-small"} 30.0\n'
        'translator_batch_rows_count{model="en-es-small"} 4.0\n'
        "translator_generated_tokens_total 7.0\n"
        "translator_generated_tokens_created 1.7e9\n"
    )
    assert metric_total(text, "translator_batch_rows_sum") == 150.0
    assert metric_total(text, "translator_batch_rows_count") == 4.0
    assert metric_total(text, "translator_generated_tokens_total") == 7.0
    assert metric_total(text, "translator_missing") == 0.0


def test_server_threads_runs_both_pools_through_real_servers(tiny_bundle):
    """bench.server_threads on the tiny bundle: two real server subprocesses (shared pool, pool per
    session), each measured through the gRPC client; medians and per-session / shared ratios."""
    from bench.server_threads import CONFIGS, run

    texts = ["Open the file", "Save", "Print the page", "Close the window"]
    report = run(tiny_bundle, threads=2, texts=texts, repeats=1)
    assert set(report["medians"]) == set(CONFIGS)
    for medians in report["medians"].values():
        assert set(medians) == {
            f"beam{b} {k}" for b in (1, 4) for k in ("one_caller_s", "one_caller_p50_ms", "8_callers_s")
        }
        assert all(v > 0 for v in medians.values())
    assert all(r > 0 for r in report["speedup_shared"].values())
