"""Weblate's own LibreTranslate machinery (weblate.machinery.libretranslate, `pip install weblate`) against
a real server with the shipped model: its configuration check, suggestions for units with placeholders,
and a burst of suggestions beyond the queue that must not make Weblate mark the service rate-limited
(it does so for 30 minutes on any 429 or 503: docs/deploy.md "Weblate").

Weblate pins dependencies this project's environment has newer (translate-toolkit, lxml, requests, ...),
so it lives in an environment of its own: `make weblate` installs it into .venv-weblate/ (the `weblate`
extra of pyproject.toml), or WEBLATE_PYTHON names an interpreter that has it. tests/weblate_driver.py
runs there; this test starts the server and reads what Weblate saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from client.load import free_port
from runtime.languages import normalise_code
from tests.conftest import REPO_ROOT, RunningServer, base_config

DRIVER = Path(__file__).with_name("weblate_driver.py")
SETTINGS = '''"""Minimal Django settings for Weblate's machinery: its example settings, no services."""
from weblate.settings_example import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SECRET_KEY = "weblate machinery test"
'''
# Units as translators meet them: printf, Qt, Python and brace placeholders, which Weblate masks as
# [X7X] before sending and puts back in the suggestion.
PLACEHOLDER_UNITS = [
    {"source": "Delete %d selected images?", "flags": "c-format", "keep": ["%d"]},
    {"source": "Delete %1 selected images?", "flags": "qt-format", "keep": ["%1"]},
    {
        "source": "Copied %(count)s files to %(dir)s",
        "flags": "python-format",
        "keep": ["%(count)s", "%(dir)s"],
    },
    {"source": "Save {name} as {format}", "flags": "python-brace-format", "keep": ["{name}", "{format}"]},
]
BURST_SENTENCES = [
    "Open the file",
    "Save changes to the document before closing?",
    "The file could not be found.",
    "Check for updates",
    "Connection to the server failed.",
    "Do you want to continue?",
    "Print the document",
    "Close the window",
    "Show hidden files",
    "Select a folder",
]


def weblate_python() -> str | None:
    """An interpreter that imports weblate: WEBLATE_PYTHON, else .venv-weblate/bin/python."""
    candidate = os.environ.get("WEBLATE_PYTHON") or str(REPO_ROOT / ".venv-weblate" / "bin" / "python")
    if not Path(candidate).is_file():
        return None
    probe = subprocess.run([candidate, "-c", "import weblate"], capture_output=True, timeout=120)
    return candidate if probe.returncode == 0 else None


@pytest.fixture(scope="module")
def weblate(tmp_path_factory):
    """run(plan) -> what Weblate's machinery saw (tests/weblate_driver.py in Weblate's interpreter)."""
    python = weblate_python()
    if python is None:
        pytest.skip(
            "weblate is not installed: `make weblate` puts it in .venv-weblate/ (the pyproject `weblate` "
            "extra, ~3 min on 2 cores; needs `make system-deps` for its C builds), or set WEBLATE_PYTHON"
        )
    home = tmp_path_factory.mktemp("weblate")
    (home / "weblate_test_settings.py").write_text(SETTINGS)
    env = {
        **os.environ,
        "PYTHONPATH": str(home),
        "DJANGO_SETTINGS_MODULE": "weblate_test_settings",
    }

    def start(plan: dict) -> subprocess.Popen:
        path = home / f"plan-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(plan))
        return subprocess.Popen(
            [python, str(DRIVER), str(path)],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err.decode()[-3000:]
        return json.loads(out.decode().strip().splitlines()[-1])

    start.finish = finish  # type: ignore[attr-defined]
    return start


def run(weblate, plan: dict) -> dict:
    return weblate.finish(weblate(plan))


def url(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.server.http_port}/"


def burst_units(n: int) -> list[dict]:
    """n distinct units (Weblate caches suggestions per text): sentences and placeholder units."""
    units = []
    for i in range(n):
        if i % 3 == 0:
            unit = PLACEHOLDER_UNITS[(i // 3) % len(PLACEHOLDER_UNITS)]
            units.append({**unit, "source": f"{unit['source']} ({i})"})
        else:
            units.append({"source": f"{BURST_SENTENCES[i % len(BURST_SENTENCES)]} ({i})"})
    return units


def test_configuration_check_and_placeholder_suggestions(weblate, start_server, shipped_bundle):
    server = start_server(shipped_bundle, http_port=free_port(), threads=1)
    seen = run(weblate, {"url": url(server), "validate": True, "units": PLACEHOLDER_UNITS})
    assert seen["languages"] == ["en", "es"]
    # Weblate's check translates English -> German, whatever the server serves (machinery/base.py
    # validate_settings): without a German model it is the 400 naming the served pairs, which Weblate
    # shows when the configuration is saved (docs/deploy.md "Weblate" says what to do).
    assert seen["validate"] == (
        f"Could not fetch translation: 400 Client Error: Bad Request for url: {url(server)}translate: "
        "de is not supported as target: the model translates en -> es"
    )
    for unit, got in zip(PLACEHOLDER_UNITS, seen["units"], strict=True):
        assert "error" not in got, got
        (suggestion,) = got["suggestions"]
        assert suggestion and suggestion != unit["source"], (unit, suggestion)
        assert all(p in suggestion for p in unit["keep"]), (unit, suggestion)
        assert "[X" not in suggestion, suggestion  # Weblate's masks came back and were put back
    assert seen["rate_limited"] is False


def test_a_burst_beyond_the_queue_never_makes_weblate_give_up(weblate, start_server, shipped_bundle):
    """The issue's queue of 8: 24 suggestions asked at once. Each request waits its turn (no 429), so
    Weblate gets every suggestion and keeps the service on; the same burst with waiting off (what the
    server did before) gets 429s and Weblate turns the service off for 30 minutes."""
    small = dict(http_port=free_port(), threads=1, max_queue_segments=8, max_texts=8)
    # Request-level batches of 2: the queue, not the running batch, takes the burst.
    small.update(batching_mode="request", max_batch_segments=2, max_wait_ms=1)
    server = start_server(shipped_bundle, **small)
    units = burst_units(24)
    seen = run(weblate, {"url": url(server), "units": units})
    errors = [u for u in seen["units"] if "error" in u]
    assert errors == [] and seen["rate_limited"] is False
    assert all(u["suggestions"] and u["suggestions"][0] for u in seen["units"])
    assert server.total("translator_requests_total", code="RESOURCE_EXHAUSTED", transport="http") == 0
    assert server.total("translator_admissions_total", outcome="admitted") >= 1  # it did overflow
    assert server.total("translator_requests_total", code="OK", transport="http") == len(units)

    before = start_server(shipped_bundle, **{**small, "http_port": free_port(), "http_queue_wait_s": 0})
    seen = run(weblate, {"url": url(before), "units": units})
    assert before.total("translator_requests_total", code="RESOURCE_EXHAUSTED", transport="http") >= 1
    assert seen["rate_limited"] is True
    assert any("error" in u or not u["suggestions"] for u in seen["units"])


def test_a_suggestion_asked_while_the_model_loads_waits_for_it(weblate, server_loop, shipped_bundle):
    """Start-up: Weblate asks while the model is still loading; the request waits for it (within the
    wait bound) instead of a 503, which would turn the service off for 30 minutes."""
    from server.app import default_engine_factory

    gate = threading.Event()

    def slow_load(bundle_dir, config):
        gate.wait(60)
        return default_engine_factory(bundle_dir, config)

    config = base_config(shipped_bundle, http_port=free_port(), threads=1, warmup=False)
    server = RunningServer(server_loop, config)
    server.server.engine_factory = slow_load
    server.start(wait_ready=False)
    try:
        proc = weblate({"url": url(server), "units": [{"source": "Open the file"}]})
        end = time.monotonic() + 120
        while server.total("translator_requests_in_flight") < 1:
            assert proc.poll() is None and time.monotonic() < end, "Weblate's request never arrived"
            time.sleep(0.05)
        time.sleep(0.5)
        gate.set()
        seen = weblate.finish(proc)
        assert seen["units"] == [
            {"suggestions": ["Abrir el archivo"], "seconds": seen["units"][0]["seconds"]}
        ]
        assert seen["rate_limited"] is False
        assert server.total("translator_model_wait_seconds_count") == 1
    finally:
        gate.set()
        server.stop(1)


def test_the_configuration_saves_against_what_make_run_serves(weblate, start_server, shipped_store):
    """Weblate's check translates "test" English -> German (validate_settings): the shipped German model
    answers it, so the settings form, `install_machinery` and the API save the service."""
    server = start_server(shipped_store, http_port=free_port(), threads=1)
    seen = run(weblate, {"url": url(server), "validate": True, "units": [{"source": "Save", "target": "de"}]})
    assert seen["validate"] == "ok"
    assert {"es", "de"} <= set(seen["languages"])
    (suggestion,) = seen["units"][0]["suggestions"]
    assert suggestion == "Speichern"


def test_suggestions_come_in_every_shipped_language(weblate, start_server, shipped_store):
    """Weblate asks for the unit's own target language: every model `make run` serves answers its units."""
    server = start_server(shipped_store, http_port=free_port(), threads=1)
    targets = sorted(
        json.loads((bundle / "manifest.json").read_text())["target_language"]
        for bundle in shipped_store.iterdir()
    )
    units = [{**unit, "target": target} for target in targets for unit in PLACEHOLDER_UNITS]
    seen = run(weblate, {"url": url(server), "units": units})
    # The manifests spell a code as the corpus does (pt_BR), /languages as BCP-47 (pt-BR): one language.
    assert {normalise_code(t) for t in targets} <= {normalise_code(c) for c in seen["languages"]}
    for unit, got in zip(units, seen["units"], strict=True):
        assert "error" not in got, (unit, got)
        (suggestion,) = got["suggestions"]
        assert suggestion and suggestion != unit["source"], (unit, suggestion)
        assert all(p in suggestion for p in unit["keep"]), (unit, suggestion)
    assert seen["rate_limited"] is False
