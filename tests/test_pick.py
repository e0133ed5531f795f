"""model.pick: the recipe ships the run's best step or the average, whichever scores higher on valid."""

import json

import pytest

from model.pick import main, pick


def release(tmp_path, name: str, **best) -> object:
    path = tmp_path / name
    path.mkdir()
    (path / "training.json").write_text(json.dumps({"best": best, "history": []}))
    return path


def test_the_higher_novel_valid_bleu_wins_and_a_tie_goes_to_the_lower_loss(tmp_path):
    best = release(tmp_path, "release", valid_bleu=34.88, valid_loss=1.7484, valid_bleu_all=40.08)
    averaged = release(tmp_path, "averaged", valid_bleu=34.82, valid_loss=1.7840)
    winner, lines = pick([best, averaged])
    assert winner == best
    assert lines[0].startswith(f"* {best}: novel valid BLEU 34.88, valid loss 1.7484, all valid BLEU 40.08")
    assert lines[1].startswith(f"  {averaged}: novel valid BLEU 34.82")

    better = release(tmp_path, "better", valid_bleu=35.30, valid_loss=1.80)
    assert pick([best, better])[0] == better
    tie = release(tmp_path, "tie", valid_bleu=34.85, valid_loss=1.70)
    assert pick([best, tie])[0] == tie


def test_the_command_prints_the_winner_and_refuses_a_release_without_scores(tmp_path, capsys):
    best = release(tmp_path, "release", valid_bleu=30.0, valid_loss=2.0)
    averaged = release(tmp_path, "averaged", valid_bleu=31.0, valid_loss=2.1)
    assert main([str(best), str(averaged)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(averaged) and "* " + str(averaged) in out.err

    empty = release(tmp_path, "empty")
    assert main([str(best), str(empty)]) == 2
    assert "has no best record" in capsys.readouterr().err
    assert main([str(best), str(tmp_path / "missing")]) == 2


def test_no_candidates_is_a_usage_error():
    with pytest.raises(SystemExit):
        main([])
