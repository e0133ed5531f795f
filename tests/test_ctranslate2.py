"""The CTranslate2 conversion (export/ctranslate2_spec.py) reproduces the PyTorch model exactly:
greedy outputs equal the reference decoder's and teacher-forced log-probabilities agree."""

import json
from pathlib import Path

import pytest
import torch

from model.decode import greedy_decode, max_output_length
from model.model import Transformer, TransformerConfig, label_smoothed_loss

ctranslate2 = pytest.importorskip("ctranslate2")

from export.ctranslate2_spec import (  # noqa: E402
    CT2Translator,
    convert_model,
    pad_batch,
    torch_token_log_probs,
    vocabulary_pieces,
)

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"
VOCAB = 40


pytestmark = pytest.mark.usefixtures("torch_single_thread")


def tiny_model(seed: int = 0, layers: tuple[int, int] = (2, 2), norm_first: bool = False) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_encoder_layers=layers[0],
        n_decoder_layers=layers[1],
        dropout=0.0,
        max_positions=128,
        norm_first=norm_first,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        # Non-trivial LayerNorm parameters and biases from the start, so a misplaced one cannot go unnoticed.
        for name, p in model.named_parameters():
            if ".ln" in name or "_ln." in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model


def train_briefly(model: Transformer, steps: int = 40, seed: int = 0) -> Transformer:
    """A few Adam steps on a reverse-copy task, so greedy outputs are varied and some stop at EOS
    (a random model just repeats one token up to the length limit)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(1, 9, (32,), generator=g).tolist()
        src = torch.zeros(32, max(lengths), dtype=torch.long)
        tgt_in = torch.zeros(32, max(lengths) + 1, dtype=torch.long)
        tgt_out = torch.zeros_like(tgt_in)
        for row, n in enumerate(lengths):
            s = torch.randint(4, VOCAB, (n,), generator=g)
            src[row, :n] = s
            tgt_in[row, 0], tgt_in[row, 1 : n + 1] = 1, s.flip(0)
            tgt_out[row, :n], tgt_out[row, n] = s.flip(0), 2
        loss_sum, n_tok = label_smoothed_loss(model(src, tgt_in), tgt_out, 0, 0.0)
        opt.zero_grad()
        (loss_sum / n_tok).backward()
        opt.step()
    return model.eval()


def pieces() -> list[str]:
    return ["<blank>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]


def sources(n: int = 8, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 3, 5, 8, 13, 2, 21, 6][:n]
    return [torch.randint(4, VOCAB, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    model = train_briefly(tiny_model())
    out = convert_model(model, pieces(), tmp_path_factory.mktemp("ct2") / "model")
    return model, CT2Translator(out, compute_type="float32", intra_threads=1)


def test_greedy_matches_reference(converted):
    model, ct2 = converted
    src = sources()
    limits = [max_output_length(len(s)) for s in src]
    ref = greedy_decode(model, pad_batch(src), torch.tensor(limits))
    batched = [h[0].tokens for h in ct2.translate_ids(src, beam_size=1, max_len=limits)]
    single = [
        ct2.translate_ids([s], beam_size=1, max_len=[n])[0][0].tokens
        for s, n in zip(src, limits, strict=True)
    ]
    assert batched == ref
    assert single == ref
    # The case is not degenerate: outputs of several lengths, some stopped by EOS.
    assert any(len(r) < n for r, n in zip(ref, limits, strict=True)) and len({len(r) for r in ref}) > 2


def test_short_limit_and_empty_output(converted):
    model, ct2 = converted
    src = sources()[:4]
    ref = greedy_decode(model, pad_batch(src), 2)
    assert [h[0].tokens for h in ct2.translate_ids(src, beam_size=1, max_len=2)] == ref


def test_scores_agree(converted):
    model, ct2 = converted
    src = sources()
    ref = greedy_decode(model, pad_batch(src), torch.tensor([max_output_length(len(s)) for s in src]))
    # Score the greedy outputs and a few arbitrary targets.
    tgt = ref + [[5, 6, 7], [9] * 12]
    src2 = src + src[:2]
    got = ct2.score_ids(src2, tgt)
    want = torch_token_log_probs(model, src2, tgt)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w)
        assert torch.allclose(torch.tensor(g), torch.tensor(w), atol=1e-4, rtol=0)
    # Greedy's reported score is the sum of its token log-probs (EOS included when it stopped on EOS).
    hyps = ct2.translate_ids(src, beam_size=1)
    for h, w, r, s in zip(hyps, want[: len(src)], ref, src, strict=True):
        if len(r) < max_output_length(len(s)):
            assert h[0].score == pytest.approx(sum(w), abs=1e-3)


def test_a_pre_norm_model_converts_exactly(tmp_path):
    """Pre-norm (norm_first): CTranslate2's pre_norm layers with the final encoder/decoder LayerNorms."""
    model = train_briefly(tiny_model(seed=2, layers=(4, 1), norm_first=True))
    ct2 = CT2Translator(convert_model(model, pieces(), tmp_path / "model"), "float32", intra_threads=1)
    src = sources()
    limits = [max_output_length(len(s)) for s in src]
    ref = greedy_decode(model, pad_batch(src), torch.tensor(limits))
    assert [h[0].tokens for h in ct2.translate_ids(src, beam_size=1, max_len=limits)] == ref
    assert len({len(r) for r in ref}) > 2
    for got, want in zip(ct2.score_ids(src, ref), torch_token_log_probs(model, src, ref), strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=0)
    assert json.loads((ct2.path / "config.json").read_text())["layer_norm_epsilon"] == pytest.approx(1e-5)


def test_model_config(converted):
    # A wrong epsilon (CTranslate2 otherwise assumes 1e-6) moves log-probs by only ~5e-5 here.
    _, ct2 = converted
    config = json.loads((ct2.path / "config.json").read_text())
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5)
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert not config["add_source_bos"] and not config["add_source_eos"]


@pytest.mark.skipif(not TOKENIZER.exists(), reason="no tokenizer.model")
def test_vocabulary_ids_line_up():
    p = vocabulary_pieces(TOKENIZER)
    assert p[:4] == ["<blank>", "<s>", "</s>", "<unk>"]
    assert len(set(p)) == len(p)
