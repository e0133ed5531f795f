"""The model store (server/store.py): which bundle the server serves, and the command it names when
there is none (it never exports). File layouts only: no model is loaded."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from server import store
from server.store import StoreError, resolve_bundle


def make_bundle(path: Path, mtime: float = 2000.0) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    os.utime(path / "manifest.json", (mtime, mtime))
    return path


def make_checkpoint(path: Path, mtime: float = 1000.0) -> Path:
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        (path / name).write_text("")
    os.utime(path / "model.safetensors", (mtime, mtime))
    return path


def test_a_given_bundle_is_served_as_it_is(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    assert resolve_bundle(str(bundle)) == bundle
    # An explicit bundle skips the freshness check against the shipped checkpoint.
    checkpoint = make_checkpoint(tmp_path / "ckpt", mtime=3000.0)
    assert resolve_bundle(bundle, tmp_path, checkpoint=checkpoint) == bundle


def test_a_checkpoint_dir_fails_with_the_export_command(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "my-model")
    with pytest.raises(StoreError) as e:
        resolve_bundle(str(checkpoint), tmp_path / "store")
    out = tmp_path / "store" / "my-model"
    message = str(e.value)
    assert "training checkpoint" in message and "does not export" in message
    assert f"`python -m export --checkpoint {checkpoint} --out {out}`" in message
    assert f"--model-dir {out}" in message
    assert not out.exists()


def test_neither_bundle_nor_checkpoint(tmp_path):
    with pytest.raises(StoreError, match="neither a model bundle"):
        resolve_bundle(str(tmp_path))


def test_default_bundle_must_exist_and_be_newer_than_the_checkpoint(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "models" / "en-es-small", mtime=1000.0)
    root = tmp_path / "bundles"
    bundle = root / "en-es-small"
    with pytest.raises(StoreError, match="no model bundle at") as e:
        resolve_bundle("", root, checkpoint=checkpoint)
    assert f"python -m export --checkpoint {checkpoint} --out {bundle}" in str(e.value)
    make_bundle(bundle, mtime=500.0)  # exported before the checkpoint's weights changed
    with pytest.raises(StoreError, match="older than the checkpoint") as e:
        resolve_bundle("", root, checkpoint=checkpoint)
    assert f"--out {bundle}" in str(e.value) and f"--model-dir {bundle}" in str(e.value)
    os.utime(bundle / "manifest.json", (1500.0, 1500.0))
    assert resolve_bundle("", root, checkpoint=checkpoint) == bundle


def test_default_bundle_without_a_checkpoint(tmp_path):
    root = tmp_path / "bundles"
    with pytest.raises(StoreError, match="no model"):
        resolve_bundle("", root, checkpoint=tmp_path / "nothing")
    bundle = make_bundle(root / "en-es-small")
    assert resolve_bundle("", root, checkpoint=tmp_path / "nothing") == bundle


def test_the_shipped_model_is_exported_with_make_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(store.REPO_ROOT)
    command = store.export_command(store.DEFAULT_CHECKPOINT_DIR, store.DEFAULT_BUNDLE_DIR)
    assert command.startswith("`make bundle` or `python -m export --checkpoint models/en-es-small ")
    monkeypatch.chdir(tmp_path)  # elsewhere: make -C the checkout, and absolute paths
    command = store.export_command(store.DEFAULT_CHECKPOINT_DIR, store.DEFAULT_BUNDLE_DIR)
    assert command.startswith(f"`make -C {store.REPO_ROOT} bundle` or ")
    assert f"--checkpoint {store.DEFAULT_CHECKPOINT_DIR} --out {store.DEFAULT_BUNDLE_DIR}`" in command
    assert "python -m export --checkpoint" in command
    # The Makefile's bundle target is that same export.
    makefile = (store.REPO_ROOT / "Makefile").read_text()
    assert "$(PY) -m export --checkpoint $(MODEL) --out $(BUNDLE)" in makefile
    assert "CORPUS_LANG ?= es\n" in makefile and "MODEL ?= models/en-$(CORPUS_LANG)-small\n" in makefile
    assert "BUNDLE ?= bundles/$(notdir $(MODEL))\n" in makefile  # so: models/en-es-small, bundles/en-es-small


def test_every_shipped_model_is_served_the_default_first(tmp_path, caplog):
    models, root = tmp_path / "models", tmp_path / "bundles"
    default = make_checkpoint(models / "en-es-small")
    french = make_checkpoint(models / "en-fr-small")
    german = make_checkpoint(models / "en-de-small")
    (models / "notes").mkdir()  # not a checkpoint: ignored
    make_bundle(root / "en-es-small")
    make_bundle(root / "en-de-small")
    with caplog.at_level(logging.WARNING, logger="server.store"):  # French is shipped but not exported
        served = store.resolve_bundles("", root, checkpoint=default)
    assert [p.name for p in served] == ["en-es-small", "en-de-small"]
    assert f"--checkpoint {french} --out {root / 'en-fr-small'}" in caplog.text
    make_bundle(root / "en-fr-small", mtime=500.0)
    with pytest.raises(StoreError, match="older than the checkpoint"):
        store.resolve_bundles("", root, checkpoint=default)
    os.utime(root / "en-fr-small" / "manifest.json", (2000.0, 2000.0))
    served = store.resolve_bundles("", root, checkpoint=default)
    assert [p.name for p in served] == ["en-es-small", "en-de-small", "en-fr-small"]  # default, then by name
    assert [p.name for p in store.store_bundles(root)] == ["en-es-small", "en-de-small", "en-fr-small"]
    assert store.shipped_checkpoints(models) == [default, german, french]
    assert store.resolve_bundles("", root, models="en-fr-small") == [root / "en-fr-small"]
