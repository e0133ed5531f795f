"""Serving by language pair (issue 31, item 3): a store of several bundles, each serving the pairs its
manifest declares, one engine and one scheduler per model, every request routed by its pair.

No model for fr/de/it/pt_BR is trained yet: the bundles here are copies of the tests' tiny random bundle
whose manifests name other pairs (a pair is data, never a branch in code). Which model answered is read
from the request log line's `model` field (written when several models are loaded).
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from runtime.bundle import BundleError, load_manifest, manifest_pairs
from server.languages import bcp47, resolve_code
from server.store import StoreError, bundle_pairs, resolve_bundles
from tests.http_helpers import call

# name -> (source, target) as the manifest spells it (pt_BR as the training side writes it).
MODELS = {"tiny-en-de": ("en", "de"), "tiny-en-es": ("en", "es"), "tiny-en-pt": ("en", "pt_BR")}
SERVED = "en -> de, en -> es, en -> pt-BR"  # the store's order (by directory name)

# (source, target) as clients send them -> the model that must answer.
ROUTES = [
    ("en", "es", "tiny-en-es"),
    ("", "", "tiny-en-es"),  # today's clients: no pair = en -> es
    ("EN", "ES", "tiny-en-es"),
    ("en", "de", "tiny-en-de"),
    ("", "de", "tiny-en-de"),
    ("en", "pt-BR", "tiny-en-pt"),
    ("en", "pt_BR", "tiny-en-pt"),
    ("en", "pt", "tiny-en-pt"),
    ("en", "PT-br", "tiny-en-pt"),
]


def make_store(bundle: Path, root: Path, models: dict[str, tuple[str, str]]) -> Path:
    """`root` holding one copy of `bundle` per model, its manifest naming the model and its pair."""
    root.mkdir(parents=True, exist_ok=True)
    for name, (source, target) in models.items():
        dst = root / name
        shutil.copytree(bundle, dst)
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest.update(name=name, source_language=source, target_language=target, pairs=[[source, target]])
        (dst / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def store(tiny_bundle, tmp_path_factory) -> Path:
    return make_store(tiny_bundle, tmp_path_factory.mktemp("store"), MODELS)


@pytest.fixture(scope="module", params=["request", "inflight"])
def routed_server(request, store, start_server):
    """The store served in each batching mode, gRPC and HTTP."""
    server = start_server(
        store, batching_mode=request.param, threads=1, http_port=free_port(), max_queue_segments=256
    )
    yield server
    server.stop(1)


def models_of(caplog, rpc: str = "Translate") -> list[str]:
    """The models named by the request log lines of `rpc` (a TranslateStream call's own line names none:
    its items' lines do)."""
    return [
        r.fields["model"]
        for r in caplog.records
        if r.name == "server.requests"
        and getattr(r, "fields", {}).get("rpc") == rpc
        and (rpc == "Translate" or "model" in r.fields)
    ]


# ---- codes, manifests, the store -------------------------------------------------------------------


def test_language_codes_resolve_as_clients_send_them():
    assert bcp47("pt_br") == "pt-BR" and bcp47("EN") == "en" and bcp47("zh_hant") == "zh-Hant"
    served = ["en", "es", "pt_BR"]
    for code in ("pt-BR", "pt_BR", "pt", "PT-br", "pt_br"):
        assert resolve_code(code, served) == "pt_BR", code
    assert resolve_code("ES", served) == "es"
    assert resolve_code("pt-PT", served) is None  # one variety never stands for another
    assert resolve_code("pt", ["pt-BR", "pt-PT"]) is None  # ambiguous
    assert resolve_code("pt-BR", ["pt"]) == "pt"  # a bare served language takes its varieties
    assert resolve_code("", served) is None and resolve_code("fr", served) is None


def test_manifest_pairs_default_to_the_manifests_languages(tiny_bundle):
    manifest = load_manifest(tiny_bundle, verify=False)
    legacy = {k: v for k, v in manifest.items() if k != "pairs"}
    assert manifest_pairs(legacy) == [(manifest["source_language"], manifest["target_language"])]
    assert manifest_pairs({**manifest, "pairs": [["en", "de"]]}) == [("en", "de")]
    for bad in ([], [["en"]], "en-de", [["en", ""]]):
        with pytest.raises(BundleError):
            manifest_pairs({**manifest, "pairs": bad})


def test_the_store_serves_every_bundle_of_a_dir_or_a_configured_list(store, tiny_bundle):
    assert [p.name for p in resolve_bundles(store)] == sorted(MODELS)
    assert [bundle_pairs(p) for p in resolve_bundles(store)] == [
        (("en", "de"),),
        (("en", "es"),),
        (("en", "pt_BR"),),
    ]
    listed = resolve_bundles(bundles_dir=store, models="tiny-en-pt, tiny-en-es")
    assert [p.name for p in listed] == ["tiny-en-pt", "tiny-en-es"]
    assert resolve_bundles(tiny_bundle) == [tiny_bundle]  # a single bundle: as before
    with pytest.raises(StoreError, match="twice"):
        resolve_bundles(bundles_dir=store, models="tiny-en-es,tiny-en-es")
    with pytest.raises(StoreError, match="neither a model bundle"):
        resolve_bundles(bundles_dir=store, models="tiny-en-fr")


def test_two_models_serving_one_pair_fail_the_load(tiny_bundle, tmp_path, start_server):
    store = make_store(tiny_bundle, tmp_path / "store", {"a": ("en", "es"), "b": ("en", "ES")})
    with pytest.raises(RuntimeError, match="en->es is served by two models"):
        start_server(store, threads=1, warmup=False)


# ---- routing -------------------------------------------------------------------------------------


def test_every_pair_routes_to_its_model_over_grpc(routed_server, caplog):
    caplog.set_level(logging.INFO, logger="server.requests")
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for source, target, _ in ROUTES:
            request = pb.TranslateRequest(
                texts=["Open the file", ""],
                options=pb.DecodingOptions(max_length=8),
                source_language=source,
                target_language=target,
            )
            response = stub.Translate(request, timeout=60)
            assert len(response.translations) == 2 and response.translations[1].hypotheses[0].text == ""
    assert models_of(caplog) == [model for _, _, model in ROUTES]


def test_list_models_and_model_info_by_pair(routed_server):
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        models = stub.ListModels(pb.ListModelsRequest(), timeout=30).models
        assert [m.name for m in models] == ["tiny-en-es", "tiny-en-de", "tiny-en-pt"]  # the default first
        pairs = {m.name: [(p.source_language, p.target_language) for p in m.pairs] for m in models}
        assert pairs == {name: [pair] for name, pair in MODELS.items()}
        for m in models:
            assert m.limits.max_beam_size > 0 and m.default_options.beam_size > 0
            assert m.batching_mode == routed_server.config.batching_mode
        assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).name == "tiny-en-es"
        info = stub.GetModelInfo(pb.GetModelInfoRequest(target_language="pt"), timeout=30)
        assert (info.name, info.target_language) == ("tiny-en-pt", "pt_BR")


def test_a_stream_mixes_pairs(routed_server, caplog):
    caplog.set_level(logging.INFO, logger="server.requests")
    items = [
        pb.TranslateStreamRequest(
            request_id=str(i),
            texts=[f"Close window {i}"],
            options=pb.DecodingOptions(max_length=6),
            source_language=source,
            target_language=target,
        )
        for i, (source, target, _) in enumerate(ROUTES * 2)
    ]
    expected = {str(i): model for i, (_, _, model) in enumerate(ROUTES * 2)}
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        responses = list(stub.TranslateStream(iter(items), timeout=120))
    assert sorted(r.request_id for r in responses) == sorted(expected)
    assert all(r.status.code == 0 and len(r.translations) == 1 for r in responses)
    answered = {
        r.fields["id"]: r.fields["model"]
        for r in caplog.records
        if r.name == "server.requests"
        and getattr(r, "fields", {}).get("rpc") == "TranslateStream"
        and "model" in r.fields
    }
    assert answered == expected


def test_an_unsupported_pair_names_the_served_pairs(routed_server):
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for source, target, side in (
            ("en", "fr", "fr is not supported as target"),
            ("de", "en", "de is not supported as source"),
            ("en", "pt-PT", "pt-PT is not supported as target"),
        ):
            with pytest.raises(grpc.RpcError) as e:
                stub.Translate(
                    pb.TranslateRequest(texts=["Open"], source_language=source, target_language=target),
                    timeout=30,
                )
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == f"{side}: the models translate {SERVED}"
        # In a stream: that item fails, the others are answered.
        items = [
            pb.TranslateStreamRequest(request_id="bad", texts=["Open"], target_language="it"),
            pb.TranslateStreamRequest(request_id="good", texts=["Open"], target_language="de"),
        ]
        codes = {r.request_id: r.status.code for r in stub.TranslateStream(iter(items), timeout=60)}
        assert codes == {"bad": grpc.StatusCode.INVALID_ARGUMENT.value[0], "good": 0}
    status, _, body = call(routed_server, "translate", {"q": "Open", "source": "en", "target": "fr"})
    assert (status, body["error"]) == (400, f"fr is not supported as target: the models translate {SERVED}")


def test_http_routes_by_source_and_target(routed_server, caplog):
    caplog.set_level(logging.INFO, logger="server.requests")
    status, _, languages = call(routed_server, "languages")
    assert status == 200
    assert languages == [
        {"code": "en", "name": "English", "targets": ["de", "es", "pt-BR"]},
        {"code": "de", "name": "German", "targets": []},
        {"code": "es", "name": "Spanish", "targets": []},
        {"code": "pt-BR", "name": "Portuguese (Brazil)", "targets": []},
    ]
    routes = [(s or "auto", t, m) for s, t, m in ROUTES if t]
    for source, target, _ in routes:
        status, _, body = call(routed_server, "translate", {"q": "Open", "source": source, "target": target})
        assert status == 200 and isinstance(body["translatedText"], str), body
        if source == "auto":
            assert body["detectedLanguage"]["language"] == "en"
    assert models_of(caplog) == [m for _, _, m in routes]


# ---- fairness across models ----------------------------------------------------------------------


def test_a_flood_on_one_pair_leaves_another_its_latency(routed_server):
    """A flood of German (more than its queue holds: some of it is refused) while Spanish requests keep
    coming: Spanish waits in its own queue and runs in its own batch, so its latency stays close to a
    quiet run's (the bound is generous: the models share the CPU)."""
    spanish = pb.TranslateRequest(texts=["Open the file"], options=pb.DecodingOptions(max_length=8))
    german = pb.TranslateRequest(
        texts=[f"Save the document number {i} now" for i in range(8)],
        options=pb.DecodingOptions(beam_size=4, max_length=64),
        target_language="de",
    )
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)

        def timed(n: int) -> list[float]:
            out = []
            for _ in range(n):
                t0 = time.monotonic()
                stub.Translate(spanish, timeout=60)
                out.append(time.monotonic() - t0)
            return out

        timed(2)  # warm
        quiet = timed(10)
        stop = threading.Event()
        outcomes = {"ok": 0, "exhausted": 0}

        def flood() -> None:
            while not stop.is_set():
                try:
                    stub.Translate(german, timeout=60)
                    outcomes["ok"] += 1
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                    outcomes["exhausted"] += 1
                    time.sleep(0.01)

        with ThreadPoolExecutor(48) as pool:
            floods = [pool.submit(flood) for _ in range(48)]
            deadline = time.monotonic() + 30
            while routed_server.total("translator_queue_segments") < 64 and time.monotonic() < deadline:
                time.sleep(0.05)
            busy = timed(10)
            # A deadline on the quiet pair holds: the German queue is not in front of it.
            stub.Translate(spanish, timeout=5)
            stop.set()
            for f in floods:
                f.result(120)
    q50, b50 = statistics.median(quiet), statistics.median(busy)
    print(
        f"\n[{routed_server.config.batching_mode}] en->es alone: p50 {q50 * 1000:.0f} ms, max "
        f"{max(quiet) * 1000:.0f} ms; during the en->de flood: p50 {b50 * 1000:.0f} ms, max "
        f"{max(busy) * 1000:.0f} ms; flood: {outcomes['ok']} answered, {outcomes['exhausted']} refused"
    )
    # Back-pressure per model: German past its queue is refused, Spanish never is (timed() would raise).
    assert outcomes["ok"] > 0 and outcomes["exhausted"] > 0
    assert b50 < 10 * q50 + 1.0, (quiet, busy)


# ---- the client --------------------------------------------------------------------------------------


def test_the_cli_takes_a_pair(routed_server, capsys, caplog):
    from client.__main__ import EXIT_INVALID, EXIT_OK, main

    caplog.set_level(logging.INFO, logger="server.requests")
    base = ["--target", routed_server.target, "--wait-s", "0", "--max-length", "6"]
    assert main([*base, "--to", "pt", "Open the file"]) == EXIT_OK
    assert models_of(caplog) == ["tiny-en-pt"]
    assert main([*base, "--from", "en", "--to", "de", "--info"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "tiny-en-de" in out and "en -> de" in out
    assert main([*base, "--info"]) == EXIT_OK  # every model, the default first
    out = capsys.readouterr().out
    assert [out.index(name) for name in ("tiny-en-es", "tiny-en-de", "tiny-en-pt")] == sorted(
        out.index(name) for name in MODELS
    )
    assert main([*base, "--to", "fr", "Open"]) == EXIT_INVALID
    assert f"fr is not supported as target: the models translate {SERVED}" in capsys.readouterr().err


def _catalog(path: Path, language: str) -> Path:
    path.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n'
        f'"Language: {language}\\n"\n\n'
        'msgid "Open the file"\nmsgstr ""\n\n'
        'msgid "One file"\nmsgid_plural "%d files"\nmsgstr[0] ""\nmsgstr[1] ""\n',
        encoding="utf-8",
    )
    return path


def test_the_po_command_takes_each_catalogs_language_or_to(routed_server, tmp_path, capsys, caplog):
    import polib

    from client.po import main as po_main

    caplog.set_level(logging.INFO, logger="server.requests")
    base = ["--target", routed_server.target, "--wait-s", "0", "--no-progress"]
    german = _catalog(tmp_path / "de.po", "de")
    assert po_main([*base, str(german), "-o", str(tmp_path / "de.out.po")]) == 0
    assert set(models_of(caplog, "TranslateStream")) == {"tiny-en-de"}
    out = polib.pofile(str(tmp_path / "de.out.po"))
    assert out.metadata["Language"] == "de" and out.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    caplog.clear()
    template = _catalog(tmp_path / "app.pot", "")
    assert po_main([*base, str(template), "--to", "pt-BR", "-o", str(tmp_path / "pt.po")]) == 0
    assert set(models_of(caplog, "TranslateStream")) == {"tiny-en-pt"}
    out = polib.pofile(str(tmp_path / "pt.po"))
    assert (
        out.metadata["Language"] == "pt_BR" and out.metadata["Plural-Forms"] == "nplurals=2; plural=(n > 1);"
    )
    for entry in out:  # every form filled or left out with a reason, and the whole file msgfmt -c clean
        assert (
            entry.msgstr
            or all(entry.msgstr_plural.values())
            or "machine translation left out" in entry.tcomment
        )
    subprocess.run(["msgfmt", "-c", "-o", "/dev/null", str(tmp_path / "pt.po")], check=True, timeout=60)
    caplog.clear()
    capsys.readouterr()
    french = _catalog(tmp_path / "fr.po", "fr")  # no French model here: nothing is sent, the error says why
    assert po_main([*base, str(french), "-o", str(tmp_path / "fr.out.po")]) == 1
    err = capsys.readouterr().err
    assert "its Language header ('fr') is a language the server does not serve" in err and SERVED in err
    assert not set(models_of(caplog, "TranslateStream")) and not (tmp_path / "fr.out.po").exists()


def test_the_po_command_does_not_import_the_cli_module():
    """client/po.py and client/__main__.py no longer import each other: both use client/cli.py."""
    import subprocess
    import sys

    code = "import sys, client.po; assert 'client.__main__' not in sys.modules, sorted(sys.modules)"
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=60)


# ---- metrics -----------------------------------------------------------------------------------------


def test_scheduler_metrics_carry_the_model(routed_server):
    """Every loaded model's scheduler reports under its own name; the values come from the store only."""
    with grpc.insecure_channel(routed_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for target in ("es", "de", "pt"):
            stub.Translate(pb.TranslateRequest(texts=["Open"], target_language=target), timeout=60)
    for name in MODELS:
        assert routed_server.total("translator_segments_total", model=name, outcome="translated") >= 1, name
        assert routed_server.total("translator_queue_capacity_segments", model=name) == 256
        assert routed_server.total("translator_model_duration_seconds_count", model=name) >= 1, name
    labelled = {
        s.labels["model"]
        for family in routed_server.server.metrics.registry.collect()
        for s in family.samples
        if "model" in s.labels
    }
    assert labelled == set(MODELS)
    info = {
        s.labels["name"]: (s.labels["source_language"], s.labels["target_language"])
        for family in routed_server.server.metrics.registry.collect()
        for s in family.samples
        if s.name == "translator_model_info"
    }
    assert info == MODELS


def test_the_dashboard_selects_a_model():
    from deploy.promstack import grafana_to_promql, panel_targets

    root = Path(__file__).resolve().parents[1]
    dashboard = json.loads((root / "deploy/grafana/dashboards/translator.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "model"]
    assert variable["query"]["query"] == "label_values(translator_model_info, name)"
    filtered = [t["expr"] for _, t in panel_targets(dashboard) if 'model=~"$model"' in t["expr"]]
    assert any("translator_queue_segments" in e for e in filtered)
    assert any("translator_queue_wait_seconds" in e for e in filtered)
    assert 'model=~"en-de"' in grafana_to_promql(filtered[0], model="en-de")


def test_python_m_server_serves_the_configured_models(store, server_process):
    """TRANSLATOR_MODELS as an operator sets it: those bundles of the bundles dir, in that order; a name
    that is no bundle stops the start before a port opens."""
    from client import TranslatorClient
    from tests.conftest import wait_serving

    env = {"TRANSLATOR_BUNDLES_DIR": str(store), "TRANSLATOR_THREADS": "1", "TRANSLATOR_WARMUP": "false"}
    proc = server_process({**env, "TRANSLATOR_MODELS": "tiny-en-pt,tiny-en-de"})
    wait_serving(proc.target, timeout=60)
    with TranslatorClient(proc.target, timeout=30) as c:
        models = c.list_models()
        # No en -> es here: the default is the first model, and an empty pair is its pair.
        assert [m.name for m in models] == ["tiny-en-pt", "tiny-en-de"]
        assert c.model_info().name == "tiny-en-pt"
        assert len(c.translate(["Open"], target_language="de", max_length=4)) == 1
    bad = server_process({**env, "TRANSLATOR_MODELS": "tiny-en-pt,tiny-en-fr"})
    assert bad.proc.wait(60) == 1
    assert any("tiny-en-fr" in line.get("msg", "") + str(line) for line in bad.log_lines())
