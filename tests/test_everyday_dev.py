"""The everyday development set (bench/data/everyday-dev.jsonl): hand-written everyday inputs with their
accepted Spanish translations, used to choose training and decoding settings so that the evaluation set
(bench/data/everyday.jsonl) stays untouched for final reporting. These tests check its shape and that no
development source repeats an evaluation source or another development source (after the judge's
normalisation)."""

import json
import re
from collections import Counter

import pytest

from bench.everyday import CATEGORIES, DEFAULT_SET, load_items, normalise

DEV_SET = DEFAULT_SET.with_name("everyday-dev.jsonl")
EXPECTED_COUNTS = {"greeting": 28, "politeness": 24, "app": 70, "sentence": 50, "multi": 20}
ID_FORM = re.compile(r"dev-(?P<category>[a-z]+)-(?P<number>\d{3})")


@pytest.fixture(scope="module")
def dev_rows() -> list[dict]:
    lines = DEV_SET.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def eval_rows() -> list[dict]:
    lines = DEFAULT_SET.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_the_set_has_192_items_in_the_stated_categories(dev_rows):
    assert len(dev_rows) == 192
    assert set(EXPECTED_COUNTS) == set(CATEGORIES)
    assert Counter(row["category"] for row in dev_rows) == EXPECTED_COUNTS


def test_every_row_has_the_evaluation_set_s_fields(dev_rows, eval_rows):
    fields = set(eval_rows[0])
    assert fields == {"id", "category", "source", "accepted"}
    assert all(set(row) == fields for row in dev_rows)


def test_ids_are_unique_and_numbered_from_001_within_each_category(dev_rows):
    ids = [row["id"] for row in dev_rows]
    assert len(set(ids)) == len(ids)
    numbers: dict[str, list[int]] = {}
    for row in dev_rows:
        match = ID_FORM.fullmatch(row["id"])
        assert match, row["id"]
        assert match["category"] == row["category"], row["id"]
        numbers.setdefault(row["category"], []).append(int(match["number"]))
    for category, found in numbers.items():
        assert sorted(found) == list(range(1, EXPECTED_COUNTS[category] + 1)), category


def test_every_item_has_a_source_and_stripped_accepted_translations(dev_rows):
    for row in dev_rows:
        assert isinstance(row["source"], str) and row["source"].strip(), row["id"]
        assert row["source"] == row["source"].strip(), row["id"]
        assert isinstance(row["accepted"], list) and row["accepted"], row["id"]
        for accepted in row["accepted"]:
            assert isinstance(accepted, str), row["id"]
            assert accepted and accepted == accepted.strip(), (row["id"], accepted)


def test_no_dev_source_repeats_an_evaluation_source(dev_rows, eval_rows):
    evaluation = {normalise(row["source"]): row["id"] for row in eval_rows}
    clashes = [
        (row["id"], evaluation[key]) for row in dev_rows if (key := normalise(row["source"])) in evaluation
    ]
    assert clashes == []


def test_no_dev_source_repeats_another_dev_source(dev_rows):
    counts = Counter(normalise(row["source"]) for row in dev_rows)
    assert [source for source, n in counts.items() if n > 1] == []


def test_the_set_loads_through_bench_everyday(dev_rows):
    items = load_items(DEV_SET)
    assert [item.id for item in items] == [row["id"] for row in dev_rows]
    assert [item.source for item in items] == [row["source"] for row in dev_rows]
    assert all(item.category in CATEGORIES and item.accepted for item in items)
