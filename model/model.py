"""Encoder-decoder Transformer from "Attention Is All You Need" (Vaswani et al., 2017), post-norm, or
pre-norm with `norm_first` (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture").

Shape legend used in the comments:
    B batch, S source length, T target length, T_past cached target length,
    D d_model, H heads, Dh = D // H, F d_ff, V vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KV = tuple[Tensor, Tensor]  # (K, V), each (B, H, T, Dh)


@dataclass
class TransformerConfig:
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    dropout: float = 0.1
    max_positions: int = 512
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    layer_norm_eps: float = 1e-5
    # False: the paper's post-norm, LN(x + Sublayer(x)). True: pre-norm, x + Sublayer(LN(x)), plus a final
    # LayerNorm at the end of the encoder and of the decoder (fairseq's --encoder/decoder-normalize-before).
    # Deep post-norm stacks (a 12-layer encoder) fail to train without special initialisation; pre-norm ones
    # do (Xiong et al. 2020; Wang et al. 2019). Configs written before the key existed load as post-norm.
    norm_first: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2 != 0:
            raise ValueError("d_model must be even for the sin/cos position table")

    @classmethod
    def small(cls, vocab_size: int) -> TransformerConfig:
        return cls(
            vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3
        )

    @classmethod
    def base(cls, vocab_size: int) -> TransformerConfig:
        """The paper's base model."""
        return cls(
            vocab_size=vocab_size, d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TransformerConfig keys: {sorted(unknown)}")
        return cls(**d)


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """Fixed position table (n_positions, d_model), interleaved as in the paper:
    PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)), pos from 0."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, D/2)
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()  # computed in float64 so large positions stay accurate


def key_padding_attn_mask(src_pad_mask: Tensor) -> Tensor:
    """Boolean SDPA mask (B, 1, 1, S), True = may attend, from a pad mask (B, S), True = pad.

    A source that is entirely padding would mask every key and softmax would return NaN; such rows
    attend to all (pad) positions instead, which keeps everything finite without data-dependent branching.
    """
    all_pad = src_pad_mask.all(dim=-1, keepdim=True)  # (B, 1)
    masked = src_pad_mask & ~all_pad  # (B, S)
    return (~masked)[:, None, None, :]  # (B, 1, 1, S)


class MultiHeadAttention(nn.Module):
    """Self-attention (fused `qkv`) or cross-attention (`q` plus fused `kv`), followed by `out`."""

    def __init__(self, config: TransformerConfig, cross: bool) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.d_model = d
        self.cross = cross
        if cross:
            self.q = nn.Linear(d, d)
            self.kv = nn.Linear(d, 2 * d)
        else:
            self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def reset_parameters(self) -> None:
        # Fused projections are initialised block by block, as if q, k and v were separate Linears.
        for lin in (self.q, self.kv) if self.cross else (self.qkv,):
            for block in lin.weight.split(self.d_model, dim=0):
                nn.init.xavier_uniform_(block)
            nn.init.zeros_(lin.bias)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections of x (B, T, D) -> q, k, v each (B, H, T, Dh)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, D)
        return self._heads(q), self._heads(k), self._heads(v)

    def project_kv(self, memory: Tensor) -> KV:
        """Cross-attention keys/values of the encoder memory (B, S, D) -> k, v each (B, H, S, Dh)."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # 2 x (B, S, D)
        return self._heads(k), self._heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        return self._heads(self.q(x))  # (B, T, D) -> (B, H, T, Dh)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        # q (B, H, T, Dh), k/v (B, H, S, Dh), attn_mask broadcastable to (B, H, T, S), True = may attend
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)  # (B, H, T, Dh)
        y = y.transpose(1, 2).flatten(2)  # (B, T, D)
        return self.out(y)  # (B, T, D)


class FeedForward(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))  # (B, T, D) -> (B, T, F) -> (B, T, D)


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config, cross=False)
        self.ln1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ln2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def _self_attention(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        q, k, v = self.self_attn.project_qkv(x)  # (B, H, S, Dh) each
        return self.self_attn.attend(q, k, v, attn_mask)  # (B, S, D)

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        # x (B, S, D), attn_mask (B, 1, 1, S)
        if self.norm_first:  # x + Sublayer(LN(x))
            x = x + self.dropout(self._self_attention(self.ln1(x), attn_mask))  # (B, S, D)
            x = x + self.dropout(self.ffn(self.ln2(x)))  # (B, S, D)
        else:  # LN(x + Sublayer(x))
            x = self.ln1(x + self.dropout(self._self_attention(x, attn_mask)))  # (B, S, D)
            x = self.ln2(x + self.dropout(self.ffn(x)))  # (B, S, D)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config, cross=False)
        self.ln1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(config, cross=True)
        self.ln2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ln3 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def _self_attention(self, x: Tensor, past_kv: KV | None) -> tuple[Tensor, KV]:
        """Causal self-attention of x (B, T, D) -> (B, T, D), and its K/V each (B, H, T_past+T, Dh)."""
        q, k, v = self.self_attn.project_qkv(x)  # (B, H, T, Dh) each
        if past_kv is None:
            a = self.self_attn.attend(q, k, v, is_causal=True)  # (B, T, D)
        else:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, H, T_past+1, Dh)
            v = torch.cat([past_kv[1], v], dim=2)  # (B, H, T_past+1, Dh)
            a = self.self_attn.attend(q, k, v)  # the single new query may see every cached position
        return a, (k, v)

    def _cross_attention(self, x: Tensor, cross_kv: KV, src_attn_mask: Tensor) -> Tensor:
        q = self.cross_attn.project_q(x)  # (B, H, T, Dh)
        return self.cross_attn.attend(q, cross_kv[0], cross_kv[1], src_attn_mask)  # (B, T, D)

    def forward(
        self, x: Tensor, cross_kv: KV, src_attn_mask: Tensor, past_kv: KV | None = None
    ) -> tuple[Tensor, KV]:
        """Full causal pass when past_kv is None (x is (B, T, D)); one incremental step otherwise
        (x is (B, 1, D), past_kv each (B, H, T_past, Dh)). Returns (x, this layer's self-attention K/V)."""
        if self.norm_first:  # x + Sublayer(LN(x))
            a, kv = self._self_attention(self.ln1(x), past_kv)
            x = x + self.dropout(a)  # (B, T, D)
            x = x + self.dropout(self._cross_attention(self.ln2(x), cross_kv, src_attn_mask))  # (B, T, D)
            x = x + self.dropout(self.ffn(self.ln3(x)))  # (B, T, D)
        else:  # LN(x + Sublayer(x))
            a, kv = self._self_attention(x, past_kv)
            x = self.ln1(x + self.dropout(a))  # (B, T, D)
            x = self.ln2(x + self.dropout(self._cross_attention(x, cross_kv, src_attn_mask)))  # (B, T, D)
            x = self.ln3(x + self.dropout(self.ffn(x)))  # (B, T, D)
        return x, kv


def final_layer_norm(config: TransformerConfig) -> nn.Module:
    """The LayerNorm that ends a pre-norm stack; Identity for post-norm."""
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else nn.Identity()


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        # One matrix for source embedding, target embedding and the (tied) output projection.
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.register_buffer(
            "pe", sinusoidal_positions(config.max_positions, config.d_model), persistent=False
        )
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList([EncoderLayer(config) for _ in range(config.n_encoder_layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.n_decoder_layers)])
        # Pre-norm leaves each stack's output un-normalised: a final LayerNorm ends each. Post-norm's last
        # sublayer already ends in one (Identity: no parameters, the state dict keeps its keys).
        self.encoder_ln = final_layer_norm(config)
        self.decoder_ln = final_layer_norm(config)
        self.embed_scale = math.sqrt(config.d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, MultiHeadAttention):
                m.reset_parameters()
        # Scaled by sqrt(d_model) on lookup, so embedded tokens start with unit variance.
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.config.d_model**-0.5)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        # tokens (B, T), positions (T,) or (B, 1) -> (B, T, D)
        x = self.embed(tokens) * self.embed_scale + self.pe[positions]
        return self.embed_dropout(x)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> (memory (B, S, D), src_pad_mask (B, S) bool, True = pad)."""
        src_pad_mask = src.eq(self.config.pad_id)  # (B, S)
        attn_mask = key_padding_attn_mask(src_pad_mask)  # (B, 1, 1, S)
        x = self._embed(src, torch.arange(src.size(1), device=src.device))  # (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)  # (B, S, D)
        return self.encoder_ln(x), src_pad_mask

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Per decoder layer, the cross-attention (K, V) of the memory, each (B, H, S, Dh)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]

    def _logits(self, x: Tensor) -> Tensor:
        return F.linear(x, self.embed.weight)  # (B, T, D) -> (B, T, V), tied output projection

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor) -> Tensor:
        """Teacher-forced causal pass: tgt_in (B, T) (BOS-prefixed) -> logits (B, T, V)."""
        attn_mask = key_padding_attn_mask(src_pad_mask)  # (B, 1, 1, S)
        x = self._embed(tgt_in, torch.arange(tgt_in.size(1), device=tgt_in.device))  # (B, T, D)
        for layer, kv in zip(self.decoder_layers, self.cross_kv(memory), strict=True):
            x, _ = layer(x, kv, attn_mask)  # (B, T, D)
        return self._logits(self.decoder_ln(x))  # (B, T, V)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_pad_mask)

    def decode_step(
        self,
        tokens: Tensor,
        position: Tensor,
        self_kv: list[KV],
        cross_kv: list[KV],
        src_pad_mask: Tensor,
    ) -> tuple[Tensor, list[KV]]:
        """One KV-cached decoder step (trace-friendly: no data-dependent Python control flow).

        tokens (B, 1); position (B,) or (1,), the 0-based position of these tokens; self_kv one (K, V)
        per layer, each (B, H, T_past, Dh) (T_past may be 0); cross_kv from `cross_kv`; src_pad_mask (B, S).
        Returns (log_probs (B, V) float32, new self_kv each (B, H, T_past+1, Dh)).
        """
        attn_mask = key_padding_attn_mask(src_pad_mask)  # (B, 1, 1, S)
        x = self._embed(tokens, position.unsqueeze(-1))  # (B, 1, D)
        new_kv: list[KV] = []
        for layer, ckv, skv in zip(self.decoder_layers, cross_kv, self_kv, strict=True):
            x, kv = layer(x, ckv, attn_mask, past_kv=skv)  # (B, 1, D), each (B, H, T_past+1, Dh)
            new_kv.append(kv)
        logits = self._logits(self.decoder_ln(x[:, 0]))  # (B, V)
        return F.log_softmax(logits.float(), dim=-1), new_kv


def label_smoothed_loss(
    logits: Tensor, target: Tensor, pad_id: int, smoothing: float
) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy over non-pad targets.

    logits (B, T, V), target (B, T). Returns (summed loss over non-pad tokens, number of non-pad tokens),
    both 0-dim tensors (no host sync), so the caller can normalise across accumulated batches.
    """
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        target.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )
    n_tokens = target.ne(pad_id).sum()
    return loss_sum, n_tokens
