"""What the engine takes from its bundle's manifest (server/engine/text.py): the decoding defaults tuned
for the model (`make tune-decoding` writes them; GetModelInfo reports them; every request that leaves an
option unset gets them) and the do-not-translate list. A copy of the tiny test bundle with its manifest
changed; no PyTorch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from server.contract import DecodingOptions

TUNED = {
    "beam_size": 3,
    "num_hypotheses": 2,
    "length_penalty": 1.3,
    "repetition_penalty": 1.2,
    "no_repeat_ngram_size": 2,
    "max_length_ratio": 2.0,
    "max_length_extra": 5,
}


def bundle_copy(tiny_bundle: Path, out: Path, files: dict[str, str] | None = None, **manifest) -> Path:
    shutil.copytree(tiny_bundle, out)
    data = json.loads((out / "manifest.json").read_text())
    data.update(manifest)
    (out / "manifest.json").write_text(json.dumps(data))
    for name, text in (files or {}).items():
        (out / name).write_text(text)
    return out


def engine(bundle: Path):
    from server.engine import Engine

    return Engine(bundle, intra_op_threads=1)


def test_the_decoding_defaults_are_the_bundles(tiny_bundle, tmp_path):
    e = engine(bundle_copy(tiny_bundle, tmp_path / "tuned", decoding=TUNED))
    assert e.default_options == DecodingOptions(
        beam_size=3,
        num_hypotheses=2,
        max_length=0,
        length_penalty=1.3,
        repetition_penalty=1.2,
        no_repeat_ngram_size=2,
    )
    # The generation budget of a request without max_length: ratio x source tokens + extra, capped.
    assert e.max_output_length(10, e.default_options) == 25
    assert e.max_output_length(1000, e.default_options) == e.max_length_cap
    assert e.max_output_length(10, DecodingOptions(max_length=7)) == 7


def test_defaults_missing_from_an_old_manifest_are_the_documented_ones(tiny_bundle, tmp_path):
    e = engine(bundle_copy(tiny_bundle, tmp_path / "old", decoding={}))
    assert e.default_options == DecodingOptions(
        beam_size=4,
        num_hypotheses=1,
        max_length=0,
        length_penalty=0.6,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
    )
    assert e.max_output_length(10, e.default_options) == 25  # 1.5 x 10 + 10


@pytest.mark.parametrize("listed", [True, False])
def test_the_keep_terms_of_the_bundle_are_not_translated(tiny_bundle, tmp_path, listed):
    files = {"keep_terms.txt": "# do not translate\nwidgetron\n"}
    extra = {"keep_terms": "keep_terms.txt"} if listed else {}
    e = engine(bundle_copy(tiny_bundle, tmp_path / "terms", files=files, **extra))
    prepared = e.prepare(["widgetron", "Open widgetron now"], e.default_options)
    if not listed:  # a word like any other: the model gets it
        assert prepared.segments == ["widgetron", "Open widgetron now"]
        return
    assert prepared.segments == ["Open widgetron now"]  # a term alone leaves nothing for the model
    step = prepared
    while not isinstance(step, list):
        step = e.finish(step, e.translate(step.segments, step.options))
    alone = step[0][0]
    assert alone.text == "widgetron" and [n.action for n in alone.notes] == ["passed_through"]


def test_batch_stats_count_rows_and_time_of_this_batch(tiny_bundle, tmp_path):
    """What the scheduler's metrics read after a request-level batch (translator_batch_rows: decoder rows
    per step, sentences x beam; translator_time_to_first_step: encoder and decoder time)."""
    import time

    e = engine(tiny_bundle)
    texts, beam = ["Open the file", "Save it", "Print the page now"], 4
    t0 = time.perf_counter()
    e.translate(texts, DecodingOptions(beam_size=beam, num_hypotheses=1, max_length=6))
    elapsed = time.perf_counter() - t0
    st = e.last_stats
    steps, row_steps = st["steps"], st["row_steps"]
    assert 1 <= steps <= 6
    assert row_steps % beam == 0 and beam * steps <= row_steps <= beam * len(texts) * steps
    assert 0 < st["encoder_s"] < elapsed and 0 < st["decoder_s"] < elapsed
