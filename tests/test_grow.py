"""model.grow: a release grown to other layer counts in rounds, each from the previous round's mean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.grow import main, rounds_of
from tests.test_train import _run, tiny_data, tiny_model  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("torch_single_thread")

SETTINGS = [
    "--config", "small", "--max-tokens", "40", "--max-sentences", "4", "--valid-every", "1",
    "--valid-bleu-sentences", "2", "--warmup", "2", "--threads", "1", "--keep-snapshots", "2",
]  # fmt: skip


def test_rounds_parse_and_refuse_nonsense():
    assert rounds_of("8000,8000,4000") == [8000, 8000, 4000]
    for bad in ("", "8000,x", "0", "-5,10"):
        with pytest.raises(Exception, match="--rounds"):
            rounds_of(bad)


def test_a_release_grows_in_rounds_and_a_finished_recipe_runs_nothing(
    tiny_data,  # noqa: F811
    tiny_model,  # noqa: F811
    tmp_path,
    capsys,
):
    start = tmp_path / "start"
    _run(tiny_data, start, "--max-steps", "2", "--valid-every", "1")  # a 1+1 release in start/rel
    run = tmp_path / "grow"
    argv = [
        "--from", str(start / "rel"), "--data", str(tiny_data), "--run-dir", str(run),
        "--encoder-layers", "2", "--decoder-layers", "1", "--rounds", "2,2", "--last", "2", "--", *SETTINGS,
    ]  # fmt: skip
    assert main(argv) == 0
    winner = capsys.readouterr().out.strip().splitlines()[-1]
    assert winner in (str(run / "round-2" / "release"), str(run / "round-2" / "averaged"))
    for n in (1, 2):
        config = json.loads((run / f"round-{n}" / "averaged" / "config.json").read_text())
        assert (config["n_encoder_layers"], config["n_decoder_layers"]) == (2, 1)
    # Round 2 started from round 1's mean (its step), cooled down over its own 2 steps.
    first = json.loads((run / "round-1" / "averaged" / "training.json").read_text())
    second = json.loads((run / "round-2" / "averaged" / "training.json").read_text())
    begun = json.loads((start / "rel" / "training.json").read_text())["best"]["step"]
    assert first["best"]["step"] == begun + 2 and second["best"]["step"] == begun + 2 + 2
    assert second["train_config"]["cooldown"] == 2
    # Again, against the release it grew from: every round is done, nothing trains, the same winner; the
    # choice file names it only if it beats that release on valid (model.pick).
    from model.pick import pick

    choice = tmp_path / "choice"
    assert main([*argv[: argv.index("--")], "--against", str(start / "rel"), "--choice", str(choice),
                 *argv[argv.index("--") :]]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == winner
    assert "round 1/2: done" in out.err and "round 2/2: done" in out.err and "cooldown:" not in out.err
    best, _ = pick([start / "rel", run / "round-2" / Path(winner).name])
    assert choice.read_text() == (f"{winner}\n" if str(best) == winner else "")


def test_the_recipe_sets_its_own_flags(tmp_path):
    argv = ["--from", str(tmp_path), "--data", str(tmp_path), "--run-dir", str(tmp_path / "g")]
    argv += ["--encoder-layers", "6", "--decoder-layers", "2", "--", "--cooldown", "5"]
    with pytest.raises(SystemExit):
        main(argv)
