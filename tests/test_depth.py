"""model/depth.py: a model with other layer counts warm-started from a trained one (deep encoder, shallow
decoder), and model.train's --encoder-layers/--decoder-layers with --init-from."""

import json

import pytest
import torch

from model.depth import deepen, layer_map
from model.model import Transformer, TransformerConfig
from model.train import OTHER_DEPTH_RUN, load_release, loss_windows
from tests.test_train import _run, tiny_data  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_layer_maps():
    assert layer_map("repeat", 3, 6) == [0, 0, 1, 1, 2, 2]
    assert layer_map("stack", 3, 6) == [0, 1, 2, 0, 1, 2]
    assert layer_map("spread", 3, 2) == [0, 2]
    assert layer_map("spread", 3, 1) == [2]
    assert layer_map("spread", 2, 4) == [0, 0, 1, 1]
    for kind in ("repeat", "stack", "spread"):
        assert layer_map(kind, 3, 3) == [0, 1, 2]  # the same depth: the same model
    with pytest.raises(ValueError, match="unknown layer map"):
        layer_map("shuffle", 3, 2)


def test_deepen_copies_every_parameter_from_the_mapped_layer():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    old = Transformer(config).eval()
    new = deepen(old, 6, 2, "stack", "spread").eval()
    assert (new.config.n_encoder_layers, new.config.n_decoder_layers) == (6, 2)
    assert old.config.n_encoder_layers == 3  # the old model's config is not touched
    o, n = old.state_dict(), new.state_dict()
    assert torch.equal(n["embed.weight"], o["embed.weight"])
    for i, j in enumerate([0, 1, 2, 0, 1, 2]):
        assert torch.equal(n[f"encoder_layers.{i}.ffn.fc1.weight"], o[f"encoder_layers.{j}.ffn.fc1.weight"])
    for i, j in enumerate([0, 2]):
        assert torch.equal(n[f"decoder_layers.{i}.ln3.bias"], o[f"decoder_layers.{j}.ln3.bias"])
    n["embed.weight"].add_(1.0)  # copies, not shared storage
    assert not torch.equal(n["embed.weight"], o["embed.weight"])
    # The same depth with any map is the same function.
    src, tgt = torch.randint(3, 50, (2, 5)), torch.randint(3, 50, (2, 4))
    same = deepen(old, 3, 3, "repeat", "spread").eval()
    with torch.no_grad():
        assert torch.equal(same(src, tgt), old(src, tgt))


def test_init_from_with_other_layer_counts_trains_the_deepened_model(tiny_data, tmp_path, capsys):  # noqa: F811
    _run(tiny_data, tmp_path / "base", "--max-steps", "2")
    release = tmp_path / "base" / "rel"
    run = tmp_path / "deep"
    _run(tiny_data, run, "--init-from", str(release), "--encoder-layers", "4", "--decoder-layers", "2",
         "--max-steps", "4")  # fmt: skip
    assert "layers 3+3 -> 4+2: encoder stack, decoder spread" in capsys.readouterr().err
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["step"] == 4
    assert (state["model_config"]["n_encoder_layers"], state["model_config"]["n_decoder_layers"]) == (4, 2)
    assert (
        "encoder_layers.3.ln2.weight" in state["model"]
        and "decoder_layers.2.ln1.weight" not in state["model"]
    )
    parent = json.loads((release / "training.json").read_text())["history"]
    assert [r.get("run") for r in state["history"][: len(parent)]] == [OTHER_DEPTH_RUN] * len(parent)
    _run(tiny_data, run, "--max-steps", "5", "--resume")  # a resume keeps the run's own model
    again = tmp_path / "again"  # a continuation of the grown model keeps the label
    _run(tiny_data, again, "--init-from", str(run / "rel"), "--max-steps", "6")
    history = torch.load(again / "last.pt", weights_only=False)["history"]
    assert [r.get("run") for r in history[: len(parent)]] == [OTHER_DEPTH_RUN] * len(parent)
    assert torch.load(run / "last.pt", weights_only=False)["model_config"]["n_encoder_layers"] == 4
    deep = load_release(run / "rel")
    assert (deep.config.n_encoder_layers, deep.config.n_decoder_layers) == (4, 2)
    assert json.loads((run / "rel" / "config.json").read_text())["n_decoder_layers"] == 2


def test_the_convergence_rule_ignores_the_validations_of_the_model_grown_from():
    """A grown model's losses start above its parent's: counting the parent's rows, the rule would
    call it converged at once (the 6+2 Spanish run stopped 500 steps before its cooldown's end)."""
    parent = [{"step": i, "valid_loss": 0.5, "run": OTHER_DEPTH_RUN} for i in range(20)]
    own = [{"step": 20 + i, "valid_loss": 1.0 - 0.1 * i} for i in range(3)]
    assert loss_windows(parent + own, 2) == (1.0, 0.8)
    assert loss_windows(parent + own, 3) is None  # not more own validations than the window
