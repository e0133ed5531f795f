"""The GPU session's main call (bench/gpu_session.sh) run end to end on the CPU: the ort part kept, the
check in its CPU mode, two tiny trainings side by side in the time left, and at most 8 files back."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.test_gpu_train import corpus, pack  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]


def test_the_session_checks_trains_side_by_side_and_packs_what_comes_back(shipped_bundle, pack, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    part = tmp_path / "part-2"
    part.mkdir()
    (part / "ort-site.tar.xz.02").write_bytes(b"x")
    (part / "ort-part-2.json").write_text(json.dumps({"archive": "ort-site.tar.xz", "parts": 2}))
    tiny = (
        f"{pack} --config tiny --device cpu --threads 1 --max-steps 2 --valid-every 0 "
        "--valid-bleu-sentences 2 --max-tokens 60 --max-sentences 4 --warmup 1"
    )
    check = (
        f"--cpu-only --bundle {shipped_bundle} --sentences 2 --speed-sentences 1 --reps 1 --grpc-seconds 1"
    )
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "GPU_RUN_SITE": "none",
        "GPU_RUN_ORT_PARTS": str(tmp_path / "ort-parts"),
        "GPU_RUN_ORT_SITE": str(tmp_path / "ort-site"),
    }
    done = subprocess.run(
        ["bash", "bench/gpu_session.sh", "--seconds", "400", "--ort", str(part), "--check-args", check,
         "--train", f"one {tiny}", "--train", f"two {tiny} --encoder-layers 2 --norm-first"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    back = sorted(p.name for p in out.iterdir())
    assert len(back) <= 8 and {"gpu-check.json", "gpu-check.log", "session.log"} <= set(back), back
    assert (tmp_path / "ort-parts" / "ort-site.tar.xz.02").exists()  # the part was kept for the join
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["mode"] == "cpu-only" and report["stages"]["speed"]["status"] == "ok"
    log = (out / "session.log").read_text()
    assert "check: exit 0" in log and "2 run(s) side by side" in log and log.count("done: 2 steps") == 2

    parts = sorted(out.glob("train.tar.part-*"))
    assert parts
    whole = tmp_path / "train.tar"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(whole) as tar:
        names = set(tar.getnames())
    assert {"./one/model.safetensors", "./two/config.json", "./one.log", "./two.log", "./smi.log"} <= names
