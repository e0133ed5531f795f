"""Checks of exported graphs: the ONNX checker, node counts, and ONNX Runtime against PyTorch on real
sources (encoder outputs, per-step log-probs with the graph's own KV cache, greedy top-1 agreement)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from export.onnx_export import cross_names, past_names
from model.decode import greedy_decode, max_output_length
from model.model import Transformer


def node_count(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def check_graph(path: Path) -> None:
    onnx.checker.check_model(str(path), full_check=True)


def _cpu_session(path: Path, threads: int = 1):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def pad_batch(seqs: list[list[int]], pad_id: int = 0) -> np.ndarray:
    out = np.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def parity(
    model: Transformer, encoder_path: Path, decoder_path: Path, sources: list[list[int]], threads: int = 1
) -> dict[str, Any]:
    """ORT vs PyTorch on a batch of real sources, teacher-forced with PyTorch's own greedy outputs.

    Returns max abs differences: encoder memory and cross K/V; per-step log-probs of the ORT decoder (its
    own KV cache) vs `Transformer.decode_step` (PyTorch KV cache) and vs a full `Transformer.decode` pass
    over the whole prefix (cache == recompute); plus the greedy-token agreement on the top-1 candidate.
    """
    cfg = model.config
    n = cfg.n_decoder_layers
    enc, dec = _cpu_session(encoder_path, threads), _cpu_session(decoder_path, threads)
    src = pad_batch(sources, cfg.pad_id)
    src_t = torch.from_numpy(src)
    with torch.no_grad():
        limits = torch.tensor([max_output_length(len(s)) for s in sources])
        hyps = greedy_decode(model, src_t, limits)
        memory_t, pad_mask_t = model.encode(src_t)
        cross_t = model.cross_kv(memory_t)
        steps = max(len(h) for h in hyps) + 1
        tgt_in = torch.full((len(sources), steps), cfg.pad_id, dtype=torch.long)
        tgt_in[:, 0] = cfg.bos_id
        for i, h in enumerate(hyps):
            tgt_in[i, 1 : len(h) + 1] = torch.tensor(h, dtype=torch.long)
        full = F.log_softmax(model.decode(tgt_in, memory_t, pad_mask_t).float(), dim=-1)  # (B, T, V)

    fp16_io = any(i.type == "tensor(float16)" for i in dec.get_inputs())
    kv_dtype = np.float16 if fp16_io else np.float32
    enc_out = enc.run(None, {"src_ids": src})
    memory, src_bias, cross = enc_out[0], enc_out[1], enc_out[2:]
    diff_mem = float(np.abs(memory.astype(np.float32) - memory_t.numpy()).max())
    diff_cross = max(
        float(np.abs(c.astype(np.float32) - ref.numpy()).max())
        for c, ref in zip(cross, [t for kv in cross_t for t in kv], strict=True)
    )
    dh = cfg.d_model // cfg.n_heads
    past = [np.zeros((len(sources), cfg.n_heads, 0, dh), dtype=kv_dtype) for _ in range(2 * n)]
    past_t = [(torch.zeros(len(sources), cfg.n_heads, 0, dh),) * 2 for _ in range(n)]
    d_step = d_full = 0.0
    top1_agree = top1_total = 0
    beam_scores = np.zeros((len(sources), 1), dtype=np.float32)
    for t in range(steps):
        feed = {"input_ids": tgt_in[:, t : t + 1].numpy(), "position": np.array([t], dtype=np.int64)}
        feed["src_bias"] = src_bias
        feed.update(zip(cross_names(n), cross, strict=True))
        feed.update(zip(past_names(n), past, strict=True))
        feed["beam_scores"] = beam_scores
        feed["num_candidates"] = np.array([1], dtype=np.int64)
        out = dec.run(None, feed)
        lp, new, top_idx = out[0], out[1 : 1 + 2 * n], out[-1]
        past = [np.concatenate([p, x], axis=2) for p, x in zip(past, new, strict=True)]
        with torch.no_grad():
            lp_t, new_kv = model.decode_step(
                tgt_in[:, t : t + 1], torch.tensor([t]), past_t, cross_t, pad_mask_t
            )
        past_t = new_kv
        live = [i for i, h in enumerate(hyps) if t <= len(h)]  # rows still producing their hypothesis
        d_step = max(d_step, float(np.abs(lp[live] - lp_t.numpy()[live]).max()))
        d_full = max(d_full, float(np.abs(lp[live] - full[live, t].numpy()).max()))
        ref_top = lp_t.argmax(-1).numpy()
        top1_agree += int((top_idx[live, 0] == ref_top[live]).sum())
        top1_total += len(live)
    return {
        "sentences": len(sources),
        "steps": steps,
        "encoder_memory_max_abs": diff_mem,
        "cross_kv_max_abs": diff_cross,
        "step_logprob_max_abs": d_step,
        "step_vs_full_pass_logprob_max_abs": d_full,
        "top1_agreement": top1_agree / max(top1_total, 1),
    }
