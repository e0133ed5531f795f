"""Decoding options, their defaults and their one validation; the length rules shared by all decoders.

Every decoder (the PyTorch reference in `model.decode`, the ONNX engine, CTranslate2 in the benchmarks)
uses `max_output_length` and `gnmt_length_penalty` from here, and every entry point (gRPC, the engine's
own check, the CLI tools) validates options with `resolve_options`, so a rule is written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Generation budget when a request does not set one: min(cap, floor(src_len * ratio) + extra).
MAX_LENGTH_RATIO = 1.5
MAX_LENGTH_EXTRA = 10
MAX_LENGTH_CAP = 256
# Upper bounds that keep the scores finite for any sentence (((5 + 256) / 6) ** 10 is about 2e16; larger
# alphas overflow a float, and one request would fail its whole batch).
MAX_LENGTH_PENALTY = 10.0
MAX_REPETITION_PENALTY = 10.0
MAX_NO_REPEAT_NGRAM_SIZE = 16


@dataclass(frozen=True)
class DecodingOptions:
    beam_size: int = 4  # 1 = greedy
    num_hypotheses: int = 1  # n-best size, <= beam_size
    max_length: int = 0  # 0 = derived from the source length: min(cap, int(1.5 * src_len) + 10)
    length_penalty: float = 0.6  # GNMT alpha: score = sum logprob / ((5 + len) / 6) ** alpha
    repetition_penalty: float = 1.0  # 1.0 = off; > 1: log-prob * penalty for tokens the hypothesis has
    no_repeat_ngram_size: int = 0  # 0 = off; n >= 1: no n-gram of target ids occurs twice in a hypothesis


class InvalidOptionsError(ValueError):
    """Options a model cannot run with; the message says which field and what to change."""


def max_output_length(
    src_len: int, ratio: float = MAX_LENGTH_RATIO, extra: int = MAX_LENGTH_EXTRA, cap: int = MAX_LENGTH_CAP
) -> int:
    """Generation budget for a source of `src_len` tokens: min(cap, floor(src_len * ratio) + extra)."""
    return min(cap, int(src_len * ratio) + extra)


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp = ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def resolve_options(
    defaults: DecodingOptions,
    *,
    max_beam_size: int,
    max_length_cap: int,
    beam_size: int = 0,
    num_hypotheses: int = 0,
    max_length: int = 0,
    length_penalty: float | None = None,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
) -> DecodingOptions:
    """Requested options (0 / None = the model's default) -> complete options, or InvalidOptionsError.

    The n-best default is clipped to the beam (a greedy request with a model default of 2 hypotheses gets
    one); an explicit n-best above the beam is an error. length_penalty and repetition_penalty are
    rounded to 6 decimals: float32 on the wire turns 0.6 into 0.60000002. The decoding guards
    (repetition_penalty, no_repeat_ngram_size: None = the model's default) are CTranslate2's options.
    """
    if beam_size < 0:
        raise InvalidOptionsError(
            f"options.beam_size must be >= 0 (0 = model default {defaults.beam_size}), got {beam_size}"
        )
    beam = beam_size or defaults.beam_size
    if beam < 1 or beam > max_beam_size:
        raise InvalidOptionsError(f"options.beam_size={beam} is above the maximum beam size {max_beam_size}")
    if num_hypotheses < 0:
        raise InvalidOptionsError(
            f"options.num_hypotheses must be >= 0 (0 = model default), got {num_hypotheses}"
        )
    n_best = num_hypotheses or min(defaults.num_hypotheses, beam)
    if n_best > beam:
        raise InvalidOptionsError(
            f"options.num_hypotheses={n_best} is larger than the beam size {beam}; "
            f"raise options.beam_size to at least {n_best} or ask for fewer hypotheses"
        )
    if max_length < 0:
        raise InvalidOptionsError(
            f"options.max_length must be >= 0 (0 = derived from the source length), got {max_length}"
        )
    if max_length > max_length_cap:
        raise InvalidOptionsError(
            f"options.max_length={max_length} is above the model's cap of {max_length_cap} tokens"
        )
    if length_penalty is None:
        alpha = defaults.length_penalty
    else:
        alpha = float(length_penalty)
        if not math.isfinite(alpha) or not 0 <= alpha <= MAX_LENGTH_PENALTY:
            raise InvalidOptionsError(
                f"options.length_penalty must be a number from 0 to {MAX_LENGTH_PENALTY:g} "
                f"(GNMT alpha; 0.6-2 are usual), got {alpha}"
            )
        alpha = round(alpha, 6)
    return DecodingOptions(
        beam_size=beam,
        num_hypotheses=n_best,
        max_length=max_length or defaults.max_length,
        length_penalty=alpha,
        repetition_penalty=_repetition_penalty(
            defaults.repetition_penalty if repetition_penalty is None else repetition_penalty
        ),
        no_repeat_ngram_size=_no_repeat_ngram_size(
            defaults.no_repeat_ngram_size if no_repeat_ngram_size is None else no_repeat_ngram_size
        ),
    )


def _repetition_penalty(value: float) -> float:
    penalty = float(value)
    if not math.isfinite(penalty) or not 1.0 <= penalty <= MAX_REPETITION_PENALTY:
        raise InvalidOptionsError(
            f"options.repetition_penalty must be a number from 1.0 to {MAX_REPETITION_PENALTY:g} (1.0 = off, "
            f"e.g. 1.2 to discourage repeated tokens), got {penalty}"
        )
    return round(penalty, 6)


def _no_repeat_ngram_size(value: int) -> int:
    try:
        integral = not isinstance(value, bool) and float(value).is_integer()
    except (TypeError, ValueError):
        integral = False
    if not integral:
        raise InvalidOptionsError(
            f"options.no_repeat_ngram_size must be a whole number (0 = off), got {value!r}"
        )
    size = int(value)
    if not 0 <= size <= MAX_NO_REPEAT_NGRAM_SIZE:
        raise InvalidOptionsError(
            f"options.no_repeat_ngram_size must be between 0 (off) and {MAX_NO_REPEAT_NGRAM_SIZE} "
            f"(e.g. 3 forbids any 3 tokens from repeating), got {size}"
        )
    return size


def check_options(options: DecodingOptions, *, max_beam_size: int, max_length_cap: int) -> None:
    """Complete options (as the engine receives them) -> None, or InvalidOptionsError. Same rules as
    `resolve_options`, applied to options that have no defaults left to fill in."""
    if options.beam_size < 1:
        raise InvalidOptionsError(f"options.beam_size must be >= 1, got {options.beam_size}")
    if options.num_hypotheses < 1:
        raise InvalidOptionsError(f"options.num_hypotheses must be >= 1, got {options.num_hypotheses}")
    resolve_options(
        options,
        max_beam_size=max_beam_size,
        max_length_cap=max_length_cap,
        beam_size=options.beam_size,
        num_hypotheses=options.num_hypotheses,
        max_length=options.max_length,
        length_penalty=options.length_penalty,
        repetition_penalty=options.repetition_penalty,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
    )
