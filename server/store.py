"""The model store: which bundle the server serves (docs/service.md, "Model store").

The server serves exported bundles (a directory with manifest.json, written by `python -m export`) and
nothing else:

* --model-dir / TRANSLATOR_MODEL_DIR set: that bundle, as it is;
* not set: <bundles-dir>/en-es-small (--bundles-dir / TRANSLATOR_BUNDLES_DIR, default <repo>/bundles),
  the bundle `make bundle` exports from the shipped checkpoint models/en-es-small, and beside it the
  bundle of every other model shipped in models/ that is exported there (models/en-fr-small ->
  <bundles-dir>/en-fr-small; `make run` exports them all; one not exported is left out, with a
  warning). The default checkpoint's bundle must exist, and every bundle served must be at least as new
  as its checkpoint's weights (model.safetensors).

Several models (docs/service.md, "Several models"): --models / TRANSLATOR_MODELS (comma-separated bundle
dirs, or names of bundles in the bundles dir) serves those; a --model-dir that is not a bundle but holds
bundles in its subdirectories serves all of them. `resolve_bundles` returns the list; each bundle's
manifest declares the language pairs it serves (runtime.bundle.manifest_pairs).

The server never exports at start-up (that needs PyTorch, which the runtime does not install, and takes
minutes): a training checkpoint (config.json + model.safetensors) given as the model dir, a missing
default bundle or one older than the shipped checkpoint stop the start with a StoreError whose message
is the command that makes the bundle. Resolving reads file metadata only.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

from runtime.bundle import BundleError, manifest_pairs
from runtime.faithful.dictionary import DICTIONARY_FILE
from runtime.faithful.lexicon import LEXICON_FILE
from runtime.faithful.memory import MEMORY_FILE

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLES_DIR = REPO_ROOT / "bundles"
DEFAULT_MODEL_NAME = "en-es-small"
DEFAULT_BUNDLE_DIR = DEFAULT_BUNDLES_DIR / DEFAULT_MODEL_NAME
DEFAULT_CHECKPOINT_DIR = REPO_ROOT / "models" / DEFAULT_MODEL_NAME

MANIFEST = "manifest.json"
log = logging.getLogger("server.store")
CHECKPOINT_FILES = ("config.json", "model.safetensors")


class StoreError(Exception):
    """No bundle to serve; the message says what to run to make one."""


def is_bundle(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def is_checkpoint(path: Path) -> bool:
    return all((path / name).is_file() for name in CHECKPOINT_FILES)


# Checkpoint files a bundle is exported from: a newer one makes the bundle stale.
EXPORTED_FROM = (
    "model.safetensors",
    "decoding.json",
    "keep_terms.txt",
    "source_words.txt",
    MEMORY_FILE,
    LEXICON_FILE,
    DICTIONARY_FILE,
)


def bundle_is_stale(bundle: Path, checkpoint: Path) -> bool:
    """True when the checkpoint's weights, decoding defaults or do-not-translate list are newer than the
    bundle's manifest."""
    built = (bundle / MANIFEST).stat().st_mtime
    sources = [checkpoint / name for name in EXPORTED_FROM]
    return any(p.is_file() and p.stat().st_mtime > built for p in sources)


def _shown(path: Path) -> str:
    """`path` as an operator would type it: relative to the working directory when inside it."""
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        text = str(path)
    return shlex.quote(text)


def export_command(checkpoint: Path, out: Path) -> str:
    """The command that exports `checkpoint` to the bundle `out` (run where the `train` extra, with
    PyTorch, is installed: `make install` or `pip install -e ".[train]"`)."""
    command = f"python -m export --checkpoint {_shown(checkpoint)} --out {_shown(out)}"
    if checkpoint.resolve() == DEFAULT_CHECKPOINT_DIR and out.resolve() == DEFAULT_BUNDLE_DIR:
        here = REPO_ROOT == Path.cwd().resolve()
        make = "make bundle" if here else f"make -C {shlex.quote(str(REPO_ROOT))} bundle"
        return f"`{make}` or `{command}`"
    return f"`{command}`"


def resolve_bundle(
    model_dir: str | Path = "", bundles_dir: str | Path = "", checkpoint: Path = DEFAULT_CHECKPOINT_DIR
) -> Path:
    """The bundle dir to serve for --model-dir `model_dir` ("" = the default bundle in `bundles_dir`,
    checked against the shipped `checkpoint`); raises StoreError when there is none to serve as is."""
    root = Path(bundles_dir) if bundles_dir else DEFAULT_BUNDLES_DIR
    if not model_dir:
        return _default_bundle(root / DEFAULT_MODEL_NAME, checkpoint)
    path = Path(model_dir)
    if is_bundle(path):
        return path
    if is_checkpoint(path):
        out = root / path.resolve().name
        raise StoreError(
            f"{path} is a training checkpoint (config.json + model.safetensors), not a model bundle, and "
            f"the server does not export at start-up: export it with {export_command(path, out)}, then "
            f"serve --model-dir {_shown(out)}"
        )
    raise StoreError(
        f"{path} is neither a model bundle ({MANIFEST}) nor a checkpoint (config.json + model.safetensors)"
    )


def bundle_pairs(bundle: Path) -> tuple[tuple[str, str], ...]:
    """The language pairs `bundle`'s manifest declares; () when it names no languages at all (the
    engine's own source/target languages then stand for it). StoreError for malformed pairs."""
    try:
        manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
        return tuple(manifest_pairs(manifest))
    except KeyError:
        return ()
    except (OSError, ValueError, BundleError) as e:
        raise StoreError(f"{bundle / MANIFEST}: {e}") from e


def _default_first(path: Path) -> tuple[bool, str]:
    """Sort key: the default model (en-es-small, which serves requests that name no pair) first, then by
    name."""
    return (path.name != DEFAULT_MODEL_NAME, path.name)


def store_bundles(path: Path) -> list[Path]:
    """The bundles in the subdirectories of `path`, the default model first, then by name; [] when it
    holds none."""
    if not path.is_dir():
        return []
    return sorted((p for p in path.iterdir() if p.is_dir() and is_bundle(p)), key=_default_first)


def shipped_checkpoints(models_dir: Path) -> list[Path]:
    """The checkpoints in the subdirectories of `models_dir` (the repository's models/), the default
    model first, then by name."""
    if not models_dir.is_dir():
        return []
    return sorted((p for p in models_dir.iterdir() if p.is_dir() and is_checkpoint(p)), key=_default_first)


def resolve_bundles(
    model_dir: str | Path = "",
    bundles_dir: str | Path = "",
    models: str = "",
    checkpoint: Path = DEFAULT_CHECKPOINT_DIR,
) -> list[Path]:
    """The bundle dirs to serve, in order: `models` (comma-separated paths or names in `bundles_dir`),
    else every bundle under a `model_dir` that is a store of bundles, else `resolve_bundle`'s one; with
    neither set, the default bundle and the bundle of every other checkpoint shipped beside `checkpoint`
    (models/*) that is exported to `bundles_dir` (fresh, as the default one must be; one not exported is
    left out with a warning naming its export command), the default model first."""
    root = Path(bundles_dir) if bundles_dir else DEFAULT_BUNDLES_DIR
    names = [m.strip() for m in models.split(",") if m.strip()]
    if names:
        out = []
        for name in names:
            path = Path(name)
            if not is_bundle(path) and is_bundle(root / name):
                path = root / name
            out.append(resolve_bundle(path, root, checkpoint))
        if len({p.resolve() for p in out}) != len(out):
            raise StoreError(f"models lists a bundle twice: {models}")
        return out
    if model_dir and not is_bundle(Path(model_dir)) and not is_checkpoint(Path(model_dir)):
        found = store_bundles(Path(model_dir))
        if found:
            return found
    if not model_dir and is_checkpoint(checkpoint):
        others = [c for c in shipped_checkpoints(checkpoint.parent) if c.name != checkpoint.name]
        missing = [c for c in others if not is_bundle(root / c.name)]
        for c in missing:  # served once exported; the default model alone must be there
            log.warning(
                "not serving %s: it has no bundle in %s; export it with %s",
                c.name,
                _shown(root),
                export_command(c, root / c.name),
            )
        shipped = [checkpoint, *(c for c in others if c not in missing)]
        return [_default_bundle(root / c.name, c) for c in shipped]
    return [resolve_bundle(model_dir, bundles_dir, checkpoint)]


def _default_bundle(bundle: Path, checkpoint: Path) -> Path:
    if not is_checkpoint(checkpoint):
        if is_bundle(bundle):
            return bundle
        raise StoreError(
            f"no model: {bundle} has no {MANIFEST} and {checkpoint} has no config.json + "
            "model.safetensors; train a model (make train) and export it (make bundle), or pass "
            "--model-dir BUNDLE"
        )
    if not is_bundle(bundle):
        raise StoreError(
            f"no model bundle at {_shown(bundle)} (the server serves bundles and does not export at "
            f"start-up): export the checkpoint {_shown(checkpoint)} with {export_command(checkpoint, bundle)}"
        )
    if bundle_is_stale(bundle, checkpoint):
        raise StoreError(
            f"the bundle {_shown(bundle)} is older than the checkpoint {_shown(checkpoint)} (its "
            f"model.safetensors changed after the export): re-export it with "
            f"{export_command(checkpoint, bundle)}, or serve the old bundle explicitly with "
            f"--model-dir {_shown(bundle)}"
        )
    return bundle
