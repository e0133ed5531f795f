"""model.debs.download_packages against a stand-in `apt-get` on PATH: batches of DOWNLOAD_BATCH packages
a call, a failed batch retried one package at a time (after one `apt-get update`), the cache reused."""

import os
import stat
from pathlib import Path

import pytest

from model import debs

FAKE_APT = """#!/bin/sh
# apt-get as `download` uses it: every name must be known, or the whole call fails and writes nothing
echo "$*" >> "$APT_CALLS"
[ "$1" = update ] && exit 0
shift 2  # download -q
for p in "$@"; do
  case " $APT_UNKNOWN " in *" $p "*) echo "E: Unable to locate package $p" >&2; exit 100;; esac
done
for p in "$@"; do : > "${p}_1.0_all.deb"; done
"""


@pytest.fixture
def fake_apt(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(FAKE_APT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("APT_CALLS", str(calls))
    monkeypatch.setenv("APT_UNKNOWN", "")
    monkeypatch.setattr(debs, "DOWNLOAD_BATCH", 3)
    return calls


def test_packages_come_in_batches_and_the_cache_is_reused(tmp_path, fake_apt):
    cache = tmp_path / "cache"
    packages = [f"pkg{i}" for i in range(7)]
    found = debs.download_packages(packages, cache)
    assert sorted(found) == packages and all(found[p].name == f"{p}_1.0_all.deb" for p in packages)
    calls = fake_apt.read_text().splitlines()
    assert calls == ["download -q pkg0 pkg1 pkg2", "download -q pkg3 pkg4 pkg5", "download -q pkg6"]
    fake_apt.unlink()
    assert debs.download_packages(packages, cache) == found and not fake_apt.exists()  # all cached


def test_a_failed_batch_is_retried_one_by_one_and_the_unknown_left_out(tmp_path, fake_apt, monkeypatch):
    monkeypatch.setenv("APT_UNKNOWN", "pkg1")
    packages = [f"pkg{i}" for i in range(4)]
    found = debs.download_packages(packages, tmp_path / "cache")
    assert sorted(found) == ["pkg0", "pkg2", "pkg3"]
    calls = fake_apt.read_text().splitlines()
    assert calls == [
        "download -q pkg0 pkg1 pkg2",  # fails as a whole
        "download -q pkg0",
        "download -q pkg1",  # fails: the lists may be stale
        "update -qq",
        "download -q pkg1",  # still unknown: left out
        "download -q pkg2",
        "download -q pkg3",
    ]
