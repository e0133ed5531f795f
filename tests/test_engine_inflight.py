"""server/engine's in-flight batching (RunningBatch over DecodeBatch) on a tiny exported bundle: every
sentence's output is exactly (bit for bit) what it gets alone, whatever joins or leaves, with K/V in host
memory or on the device (IOBinding)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from server.engine import BatchItem, BundleError, DecodingOptions, Engine
from server.engine.cache import BoundCache, NumpyCache
from server.engine.rows import DeviceRows, grow
from tests.conftest import copy_without_kv_rows
from tests.test_engine import same
from tests.test_export import TEXTS, TinyBundle, build_tiny_bundle

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    return build_tiny_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(tiny: TinyBundle) -> Engine:
    return Engine(tiny.bundle, intra_op_threads=1)


# ------------------------------------------------------------------- in-flight batching (RunningBatch)
# Every sentence's output is exactly (bit for bit) what it gets alone, whatever joins or leaves.

MORE = [
    "Save changes?",
    "Print",
    "  Open the file.  ",
    "",
    "Delete the selected messages permanently?",
    "The printer is out of paper.",
]
OPTIONS = [
    DecodingOptions(beam_size=1, num_hypotheses=1),
    DecodingOptions(beam_size=2, num_hypotheses=2),
    DecodingOptions(beam_size=4, num_hypotheses=1),
    DecodingOptions(beam_size=3, num_hypotheses=3, length_penalty=1.0),
    DecodingOptions(beam_size=5, num_hypotheses=2, max_length=7),
    DecodingOptions(beam_size=1, max_length=3),
    DecodingOptions(beam_size=4, num_hypotheses=2, length_penalty=0.0),  # the settled() stop fires
]


@pytest.fixture(scope="module")
def solo(engine: Engine) -> dict:
    """(text, options) -> the result of translating that text alone."""
    out = {}
    for text in TEXTS + MORE:
        for opts in OPTIONS:
            out[text, opts] = engine.translate([text], opts)[0]
    return out


def test_graph_takes_per_row_positions(engine: Engine):
    assert engine.supports_inflight
    assert len(engine.running_batch()) == 0


@pytest.fixture(scope="module")
def bound_engine(tiny: TinyBundle) -> Engine:
    """IOBinding on the CPU provider: the in-flight batch keeps K/V as OrtValues and changes them with
    the bundle's kv_rows graph, as on CUDA (where it saves copying the cache over the bus each step)."""
    return Engine(tiny.bundle, intra_op_threads=1, io_binding=True)


@pytest.mark.parametrize("storage", ["host", "device"])
@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_and_drops_match_solo(
    engine: Engine, bound_engine: Engine, solo: dict, seed: int, storage: str
):
    rng = random.Random(seed)
    pending = [(text, rng.choice(OPTIONS)) for text in rng.sample(TEXTS + MORE, 10)]
    pending += [(rng.choice(TEXTS), rng.choice(OPTIONS)) for _ in range(6)]
    rb = (engine if storage == "host" else bound_engine).running_batch()
    assert rb.batch(2).on_device == (storage == "device") == rb.batch(1).on_device
    items = {}
    results = {}
    dropped = set()
    key = 0
    steps = 0
    max_rows = 0
    while pending or len(rb):
        if pending and (not len(rb) or rng.random() < 0.3):
            n = rng.randint(1, 3)
            batch = []
            for text, opts in pending[:n]:
                items[key] = (text, opts)
                batch.append(BatchItem(key, text, opts))
                key += 1
            del pending[:n]
            for f in rb.admit(batch):
                assert f.error is None
                results[f.key] = f.hypotheses
        if len(rb) > 1 and rng.random() < 0.05:
            victim = rng.choice(rb.keys)
            assert rb.drop([victim]) == 1
            dropped.add(victim)
        max_rows = max(max_rows, rb.rows)
        for f in rb.step():
            assert f.key not in results
            results[f.key] = f.hypotheses
        steps += 1
        assert steps < 2000
    assert set(results) | dropped == set(items) and not set(results) & dropped
    for k, hyps in results.items():
        same(hyps, solo[items[k]])
    assert max_rows > 4  # the batch really mixed sentences


def test_mixed_beams_join_a_running_long_decode(engine: Engine):
    """Short sentences (greedy and beam 2) admitted while a beam-5 one decodes leave before it; all
    match their solo translations."""
    rb = engine.running_batch()
    long_opts = DecodingOptions(beam_size=5, num_hypotheses=2)
    rb.admit([BatchItem("long", TEXTS[1], long_opts)])
    for _ in range(3):
        assert rb.step() == []
    greedy, beam2 = DecodingOptions(beam_size=1, max_length=3), DecodingOptions(beam_size=2, max_length=4)
    wanted = {"long": (TEXTS[1], long_opts)}
    items = []
    for i, t in enumerate(TEXTS[:4]):
        wanted[i] = (t, greedy if i % 2 else beam2)
        items.append(BatchItem(i, *wanted[i]))
    rb.admit(items)
    # every beam size runs apart: the beam-2 sentences take 2 rows each, not the long one's 5
    assert rb.rows == 5 + 2 * 2 + 2
    assert sorted(rb._batches) == [1, 2, 5] and rb.batch(2).kc == 2
    order = []
    while len(rb):
        for f in rb.step():
            order.append(f.key)
            same(f.hypotheses, engine.translate([wanted[f.key][0]], wanted[f.key][1])[0])
    assert order[-1] == "long" and len(order) == 5
    assert rb.rows == 0


@pytest.mark.parametrize("storage", ["host", "device"])
def test_settled_sentences_leave_the_running_batch(
    engine: Engine, bound_engine: Engine, solo: dict, storage: str
):
    """The settled() stop in flight: sentences joining every other step, some with alpha 0 (where it
    fires most), each leaves as soon as its n-best is settled, with its solo result."""
    rb = (engine if storage == "host" else bound_engine).running_batch()
    alpha0, beam4 = OPTIONS[-1], OPTIONS[2]
    plan = [(i, t, alpha0 if i % 2 else beam4) for i, t in enumerate(TEXTS + MORE[:2])]
    pending = list(plan)
    results = {}
    while pending or len(rb):
        if pending:
            i, text, opts = pending.pop(0)
            rb.admit([BatchItem(i, text, opts)])
        for f in rb.step():
            results[f.key] = f.hypotheses
    assert rb.settled > 0
    for i, text, opts in plan:
        same(results[i], solo[text, opts])


def test_admit_refuses_bad_items_and_passes_blank(engine: Engine):
    rb = engine.running_batch()
    out = rb.admit(
        [
            BatchItem(1, "  ", DecodingOptions(beam_size=2)),
            BatchItem(2, "word " * 200, DecodingOptions(beam_size=2)),
            BatchItem(3, "Open", DecodingOptions(beam_size=2, num_hypotheses=3)),
        ]
    )
    by = {f.key: f for f in out}
    assert by[1].hypotheses[0].text == "  " and by[1].error is None
    assert "max_source_tokens" in str(by[2].error)
    assert isinstance(by[3].error, ValueError)
    assert len(rb) == 0


def test_old_graph_is_refused(engine: Engine, monkeypatch):
    monkeypatch.setattr(engine.generator, "row_positions", False)
    with pytest.raises(BundleError, match="per-row positions"):
        engine.running_batch()


def test_device_storage_needs_iobinding_and_both_kv_graphs(engine: Engine):
    """K/V on the device need the IOBinding cache and both the kv_rows and kv_step graphs: a bundle with
    one of them only is refused (the engine then keeps the in-flight cache on the host)."""
    graphs = engine.generator.graphs
    bound = BoundCache(graphs, "cpu", 0)
    assert DeviceRows(graphs, bound).source_width == 0
    for missing in ("kv_rows", "kv_step"):
        with pytest.raises(BundleError, match="kv_rows/kv_step graphs"):
            DeviceRows(dataclasses.replace(graphs, **{missing: None}), bound)
    with pytest.raises(BundleError, match="IOBinding"):
        DeviceRows(graphs, NumpyCache(graphs))


def test_storage_grows_only_past_its_capacity():
    """An exact fit keeps the buffers (no re-layout of the cache); past it, room for twice the need."""
    assert grow(0, 0) == 0 and grow(3, 4) == 4 and grow(4, 4) == 4
    assert grow(5, 4) == 10 and grow(5, 4, headroom=1.5) == 7


@pytest.mark.parametrize("storage", ["host", "device"])
def test_cache_is_compacted(engine: Engine, bound_engine: Engine, storage: str):
    rb = (engine if storage == "host" else bound_engine).running_batch()
    opts = DecodingOptions(beam_size=3)
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS)])
    assert rb.rows == 3 * len(TEXTS)
    rb.step()
    rb.drop([0, 1, 2])
    assert rb.rows == 3 * (len(TEXTS) - 3)
    past = [p if isinstance(p, np.ndarray) else p.numpy() for p in rb.batch(3).past]
    assert past[0].shape[0] == rb.rows and past[0].shape[2] % 16 == 0
    assert np.isfinite(past[0]).all()
    if storage == "device":  # exactly the live sentences on the device, nothing spare
        bias, cross = rb.batch(3)._store.sources(len(rb))
        assert cross[0].shape()[0] == bias.shape[0] == len(rb)
    while len(rb):
        rb.step()
    assert rb.batch(3).past == []


def test_bundle_without_kv_rows_graph_keeps_the_cache_on_the_host(
    engine: Engine, tiny: TinyBundle, tmp_path: Path
):
    """Bundles exported before the kv_rows graph still batch in flight with IOBinding, from host memory."""
    old = Engine(copy_without_kv_rows(tiny.bundle, tmp_path / "bundle"), intra_op_threads=1, io_binding=True)
    rb = old.running_batch()
    assert old.generator.kv_rows_graph is None and not rb.batch(2).on_device
    opts = DecodingOptions(beam_size=2, num_hypotheses=2)
    rb.admit([BatchItem(0, TEXTS[1], opts)])
    while len(rb):
        out = rb.step()
    same(out[0].hypotheses, engine.translate([TEXTS[1]], opts)[0])


@pytest.mark.parametrize("storage", ["host", "device"])
def test_leaving_sentences_cost_a_row_move_not_a_cache_copy(
    engine: Engine, bound_engine: Engine, solo: dict, storage: str
):
    """Greedy group: a sentence leaving (dropped here) is replaced by the last live one (on the host in
    place: the cache storage is not re-laid out); the source axis shrinks once the widest sentence has
    left; the others' results are unchanged."""
    rb = (engine if storage == "host" else bound_engine).running_batch()
    greedy = OPTIONS[0]
    wide = "Delete the selected messages permanently? " * 4
    texts = [wide, TEXTS[0], TEXTS[2], "Print", "Save changes?"]  # 24 source tokens vs <= 4
    rb.admit([BatchItem(i, t, greedy) for i, t in enumerate(texts)])
    g = rb.batch(1)
    results: dict = {}
    before = list(g.keys)
    assert before[-1] == 0  # admitted in order of source width: the widest joins last
    kv, width = g._store.kv[0], g.source_width
    assert rb.drop([before[0]]) == 1  # position 0: the last sentence moves into its place
    assert (g._store.kv[0] is kv) == (storage == "host")  # host: rows moved in place
    assert g.keys == [before[-1], *before[1:-1]] and g.rows == len(before) - 1
    assert g.source_width == width
    assert rb.drop([0]) == 1  # the widest leaves: the source axis shrinks
    assert g.source_width < width  # 24 -> 8 positions
    while len(rb):
        for f in rb.step():
            results[f.key] = f.hypotheses
    for key, hyps in results.items():
        same(hyps, solo[texts[key], greedy])
    assert set(results) == set(range(1, len(texts))) - {before[0]}
