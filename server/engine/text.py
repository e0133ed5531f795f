"""The text layer: Engine (a bundle's tokenizer, limits and request-level translation) and RunningBatch
(its in-flight batch of texts). Both satisfy server.contract's TranslationEngine / InFlightBatch.

Around the id-level Generator and DecodeBatch, this layer tokenizes, keeps each text's leading and
trailing whitespace around its translation, passes blank texts through (score 0), applies the model's
limits (max_source_tokens: InputTooLongError; beam size, length cap: runtime.decoding's option checks)
and serialises the generator behind one lock (`Engine.lock`). Long inputs: a segment longer than
`max_source_tokens` raises InputTooLongError (callers should split long text into sentences or
paragraphs first; `count_tokens` gives the lengths without translating).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.bundle import BundleError, load_manifest
from runtime.decoding import DecodingOptions
from runtime.decoding import check_options as _check_options
from runtime.decoding import max_output_length as _max_output_length
from runtime.faithful.dictionary import read_dictionary_terms
from runtime.faithful.lexicon import read_lexicon
from runtime.faithful.memory import read_memory
from runtime.faithful.terms import read_term_list
from runtime.tokenizer import Tokenizer
from server.contract import BatchItem, Finished, Hypothesis, InputTooLongError, Prepared
from server.engine.cache import BoundCache
from server.engine.decode_batch import DecodeBatch, DecodeItem
from server.engine.faithful import TextLayer
from server.engine.generator import Generator
from server.engine.search import NBest

__all__ = ["Engine", "RunningBatch", "blank_result", "split_whitespace"]

LISTS = ("keep_terms", "source_words")  # the bundle's word lists for the text layer (manifest keys)


def split_whitespace(text: str) -> tuple[str, str, str]:
    """(leading whitespace, stripped text, trailing whitespace): only the middle is translated."""
    core = text.strip()
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    return text[:start], core, text[end:]


def blank_result(text: str) -> list[Hypothesis]:
    """A blank text comes back unchanged, score 0."""
    return [Hypothesis(text=text, score=0.0, tokens=[])]


class Engine:
    """Translation engine over an export bundle (see docs/engine-contract.md)."""

    def __init__(
        self,
        bundle_dir: str | Path,
        *,
        variant: str = "fp32",
        device: str = "auto",
        intra_op_threads: int = 0,
        io_binding: bool | None = None,
        memory: bool = True,
        lexical_guard: bool = True,
        dictionary_terms: bool = True,
        cuda_tf32: bool = True,
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir, variant)
        m = self.manifest
        self.variant = variant
        self.name: str = m["name"]
        self.version: str = str(m["version"])
        self.source_language: str = m["source_language"]
        self.target_language: str = m["target_language"]
        self.max_source_tokens: int = int(m["max_source_tokens"])
        self.max_beam_size: int = int(m["max_beam_size"])
        self.max_length_cap: int = int(m["max_length_cap"])
        dec = m["decoding"]
        self.default_options = DecodingOptions(
            beam_size=int(dec.get("beam_size", 4)),
            num_hypotheses=int(dec.get("num_hypotheses", 1)),
            max_length=int(dec.get("max_length", 0)),
            length_penalty=float(dec.get("length_penalty", 0.6)),
            repetition_penalty=float(dec.get("repetition_penalty", 1.0)),
            no_repeat_ngram_size=int(dec.get("no_repeat_ngram_size", 0)),
        )
        self._ratio = float(dec.get("max_length_ratio", 1.5))
        self._extra = int(dec.get("max_length_extra", 10))
        tok_path = self.bundle_dir / m["tokenizer"]
        try:
            self.tokenizer = Tokenizer(tok_path)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError
            raise BundleError(f"{tok_path}: cannot load tokenizer: {e}") from e
        if self.tokenizer.vocab_size != int(m["vocab_size"]):
            raise BundleError(
                f"{tok_path}: {self.tokenizer.vocab_size} pieces, manifest vocab_size is {m['vocab_size']}"
            )
        ids = m["special_ids"]
        files = m["variants"][variant]
        self.generator = Generator(
            self.bundle_dir / files["encoder"],
            self.bundle_dir / files["decoder"],
            self.bundle_dir / files["cache"],
            *(self.bundle_dir / files[g] if g in files else None for g in ("kv_rows", "kv_step")),
            device=device,
            intra_op_threads=intra_op_threads,
            io_binding=io_binding,
            cuda_tf32=cuda_tf32,
            pad_id=int(ids["pad"]),
            bos_id=int(ids["bos"]),
            eos_id=int(ids["eos"]),
            max_positions=int(m["dims"].get("max_positions", 0)) or None,
        )
        if self.generator.vocab_size != int(m["vocab_size"]):
            raise BundleError(
                f"{self.bundle_dir / files['decoder']}: vocabulary {self.generator.vocab_size}, "
                f"manifest says {m['vocab_size']}"
            )
        self.providers: list[str] = list(self.generator.providers)
        lists = {k: read_term_list(self.bundle_dir / m[k]) if m.get(k) else [] for k in LISTS}
        self.memory = {}
        if memory and m.get("memory"):
            try:
                self.memory = read_memory(self.bundle_dir / m["memory"])
            except (OSError, EOFError, ValueError) as e:
                raise BundleError(f"cannot read the translation memory: {e}") from e
        # The lexical guard's word list (a bundle without one has no guard; off: not even loaded).
        self.lexicon = None
        if lexical_guard and m.get("lexicon"):
            try:
                self.lexicon = read_lexicon(self.bundle_dir / m["lexicon"])
            except (OSError, EOFError, ValueError) as e:
                raise BundleError(f"cannot read the lexicon: {e}") from e
        # Words the catalogs seldom hold, translated as the dictionaries do (off: not even loaded).
        self.dictionary_terms = None
        if dictionary_terms and m.get("dictionary_terms"):
            try:
                self.dictionary_terms = read_dictionary_terms(self.bundle_dir / m["dictionary_terms"])
            except (OSError, UnicodeDecodeError, ValueError) as e:
                raise BundleError(f"cannot read the dictionary terms: {e}") from e
        self.text_layer = TextLayer(
            self.tokenizer,
            self.max_source_tokens,
            **lists,
            memory=self.memory,
            lexicon=self.lexicon,
            dictionary=self.dictionary_terms,
            max_beam_size=self.max_beam_size,
        )
        self.last_stats: dict[str, Any] = {}
        self._lock = threading.Lock()  # one batch at a time: the generator reuses its cache buffers

    # ---------------------------------------------------------------------------------------- public

    @property
    def memory_entries(self) -> int:
        """Texts the text layer answers from the translation memory (0: off or none in the bundle)."""
        return len(self.memory)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Source tokens per text as translate() would feed them (0 for blank texts)."""
        cores = [t.strip() for t in texts]
        encoded = self.encode_texts([c for c in cores if c])
        it = iter(encoded)
        return [len(next(it)) if c else 0 for c in cores]

    def prepare(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        glossary: Mapping[str, str] | None = None,
        *,
        accelerators: bool = True,
    ) -> Prepared:
        """The text layer's first half: the segments to translate (see server.engine.faithful)."""
        return self.text_layer.prepare(texts, options, glossary, accelerators=accelerators)

    def finish(
        self, prepared: Prepared, results: Sequence[list[Hypothesis] | None]
    ) -> list[list[Hypothesis]] | Prepared:
        """The text layer's second half: the texts rebuilt from their segments' n-best lists, or the next
        round's Prepared (decode it and call finish again)."""
        return self.text_layer.finish(prepared, results)

    def translate_texts(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        glossary: Mapping[str, str] | None = None,
    ) -> list[list[Hypothesis]]:
        """prepare -> translate -> finish (-> translate -> finish) in one call, as the service does
        through its scheduler."""
        options = self.default_options if options is None else options
        self.check_options(options)
        step: Prepared | list[list[Hypothesis]] = self.prepare(texts, options, glossary)
        while isinstance(step, Prepared):
            step = self.finish(step, self.translate(step.segments, step.options))
        return step

    # One text at a time on purpose: sentencepiece's list calls start a thread pool per call (about 4 ms
    # of wall time even for one sentence, 50x the work itself on a busy machine); same ids and texts.
    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Source ids (no BOS/EOS) of each (already stripped) text."""
        encode = self.tokenizer.encode
        return [encode(t) for t in texts]

    def decode_ids(self, seqs: list[list[int]]) -> list[str]:
        """Text of each target id list."""
        decode = self.tokenizer.decode
        return [decode(s) for s in seqs]

    @property
    def lock(self) -> threading.Lock:
        """Held while the generator runs (request or in-flight): it reuses its cache buffers."""
        return self._lock

    def warmup(self) -> None:
        """Run both graphs once (first runs allocate memory and pick kernels)."""
        self.translate(["Hello world."], self.default_options)
        self.translate(["Hello world.", "Open the file."], DecodingOptions(beam_size=1))

    @property
    def on_cuda(self) -> bool:
        """Whether the sessions run on the CUDA execution provider."""
        return bool(self.generator.on_cuda)

    @property
    def supports_inflight(self) -> bool:
        """Whether the bundle's decoder takes per-row positions (needed by running_batch())."""
        return bool(self.generator.row_positions)

    @property
    def inflight_copies_cache(self) -> bool:
        """Whether the in-flight batch's K/V cross the bus at every step: the sessions bind their cache
        on the device (CUDA) but the bundle predates the kv_rows/kv_step graphs, so the batch runs from host
        memory."""
        g = self.generator
        return isinstance(g.cache, BoundCache) and not g.inflight_on_device

    def running_batch(self) -> RunningBatch:
        """A step-level in-flight batch over this engine (see RunningBatch); BundleError if the bundle's
        decoder graph is too old for it (re-export)."""
        return RunningBatch(self)

    def max_output_length(self, src_len: int, options: DecodingOptions) -> int:
        if options.max_length > 0:
            return min(options.max_length, self.max_length_cap)
        return _max_output_length(src_len, self._ratio, self._extra, self.max_length_cap)

    def check_options(self, options: DecodingOptions) -> None:
        """InvalidOptionsError (a ValueError) unless this model can run `options` (runtime.decoding's rules;
        a max_length over the cap is clipped, not refused)."""
        _check_options(
            options,
            max_beam_size=self.max_beam_size,
            max_length_cap=max(self.max_length_cap, options.max_length),
        )

    def too_long(self, n_tokens: int, segment: str = "segment") -> InputTooLongError | None:
        """The error for a segment of n_tokens source tokens, or None when it is within the limit."""
        if n_tokens <= self.max_source_tokens:
            return None
        return InputTooLongError(
            f"{segment} has {n_tokens} source tokens, over the limit of {self.max_source_tokens} "
            "(max_source_tokens); split long text into sentences or paragraphs before translating"
        )

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis] | None]:
        """Translate a batch; one entry per text: the n-best list (best first) or None if cancelled.

        Blank texts come back unchanged (score 0.0). Leading/trailing whitespace of each text is kept
        around its translation. A row reported by `cancelled()` at any step boundary is dropped from the
        batch and returns None (even if it had already finished). Raises InputTooLongError (nothing is
        translated) if a segment is over max_source_tokens, ValueError for invalid options.
        """
        t_start = time.perf_counter()
        options = self.default_options if options is None else options
        self.check_options(options)
        results: list[list[Hypothesis] | None] = [None] * len(texts)
        segments: list[tuple[int, str, str]] = []  # (index, prefix, suffix)
        cores: list[str] = []
        for i, text in enumerate(texts):
            prefix, core, suffix = split_whitespace(text)
            if not core:
                results[i] = blank_result(text)
                continue
            segments.append((i, prefix, suffix))
            cores.append(core)
        sources = self.encode_texts(cores)
        for (i, _, _), ids in zip(segments, sources, strict=True):
            if error := self.too_long(len(ids), f"segment {i}"):
                raise error
        t_tok = time.perf_counter()
        seg_index = np.array([i for i, _, _ in segments], dtype=np.int64)
        cancel_fn = None
        if cancelled is not None:
            n_texts = len(texts)

            def cancel_fn() -> np.ndarray:
                flags = np.asarray(cancelled(), dtype=bool)
                if flags.shape != (n_texts,):
                    raise ValueError(f"cancelled() returned {flags.size} flags for {n_texts} texts")
                cancelled_rows[flags] = True
                return flags[seg_index]

            cancelled_rows = np.zeros(n_texts, dtype=bool)
        with self._lock:
            decoded = self.generator.generate(
                sources,
                beam_size=options.beam_size,
                num_hypotheses=options.num_hypotheses,
                length_penalty=options.length_penalty,
                repetition_penalty=options.repetition_penalty,
                no_repeat_ngram_size=options.no_repeat_ngram_size,
                max_lengths=[self.max_output_length(len(s), options) for s in sources],
                cancelled=cancel_fn,
            )
            gen_stats = dict(self.generator.last_stats)
        t_dec = time.perf_counter()
        flat = [h for nbest in decoded if nbest is not None for h, _ in nbest]
        texts_out = iter(self.decode_ids(flat))
        for (i, prefix, suffix), nbest in zip(segments, decoded, strict=True):
            if nbest is None:
                continue
            results[i] = [
                Hypothesis(text=prefix + next(texts_out) + suffix, score=score, tokens=tokens)
                for tokens, score in nbest
            ]
        if cancelled is not None:
            for i in np.flatnonzero(cancelled_rows):
                results[i] = None
        stats = gen_stats | {
            "texts": len(texts),
            "segments": len(segments),
            "source_tokens": int(sum(len(s) for s in sources)),
            "output_tokens": int(sum(len(h[0].tokens) for h in results if h)),
            "tokenize_s": t_tok - t_start,
            "detokenize_s": time.perf_counter() - t_dec,
            "total_s": time.perf_counter() - t_start,
        }
        self.last_stats = stats
        return results


class RunningBatch:
    """Text-level in-flight batch over an Engine (see DecodeBatch): admit(items), step(), drop(keys).

    Items may have any decoding options. Each item's result is the one `Engine.translate([text],
    options)` gives it alone, bit for bit. Every beam size runs in its own DecodeBatch, and a step with
    several running makes one decoder call each:

    * a DecodeBatch gives every sentence as many rows as its largest beam, so one beam-8 sentence (the
      lexical guard's second round doubles the requested beam) among fourteen beam-4 ones would make
      64 rows 120, 56 of them dead (in the server at beam 4 under load: 96 rows a step on average where
      the scheduler counted at most 64); a second decoder call for the wide one costs far less.
      Letting narrower beams join a wider batch instead (their own dead rows for one call fewer) was
      within noise for beam 2 among beam 4 and let one beam 8 widen the beam-4 sentences admitted
      with it, so sizes stay apart;
    * greedy sentences apart from beam rows: ONNX Runtime's MatMul takes another kernel for one query
      row per sentence than for several, so a greedy sentence next to beam rows would differ in the last
      bits from greedy alone.

    Not thread-safe: one caller thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._batches: dict[int, DecodeBatch] = {}  # beam size -> its batch, kept (with its buffers)
        self._affixes: dict[Any, tuple[str, str]] = {}
        self.batch(1)  # now: an old decoder graph (one shared position) is refused here, not at admission

    def batch(self, beam_size: int) -> DecodeBatch:
        """The DecodeBatch of this beam size (made on first use)."""
        b = self._batches.get(beam_size)
        if b is None:
            b = self._batches[beam_size] = DecodeBatch(self.engine.generator)
        return b

    def _running(self) -> list[DecodeBatch]:
        return [self._batches[k] for k in sorted(self._batches) if len(self._batches[k])]

    def __len__(self) -> int:
        return sum(len(b) for b in self._batches.values())

    @property
    def rows(self) -> int:
        """Decoder rows a step runs: every running sentence's beam size."""
        return sum(b.rows for b in self._batches.values())

    @property
    def keys(self) -> list[Any]:
        return [k for b in self._running() for k in b.keys]

    @property
    def settled(self) -> int:
        """Sentences retired by the settled() stop, in all batches."""
        return sum(b.settled for b in self._batches.values())

    def cost(self, source_tokens: int, options: DecodingOptions) -> int:
        """KV-cache slots an item can occupy at most: beam x (source tokens + generation budget)."""
        out = self.engine.max_output_length(source_tokens, options)
        return max(1, options.beam_size) * (max(1, source_tokens) + out)

    def admit(self, items: Sequence[BatchItem]) -> list[Finished]:
        """Tokenize and encode `items` (one encoder batch per source width) and merge them into the batch.
        Returns the items that are already done: blank texts, zero length budgets, and refused ones
        (invalid options, over max_source_tokens: `error` set)."""
        e = self.engine
        done: list[Finished] = []
        todo: list[tuple[BatchItem, str]] = []
        for it in items:
            try:
                e.check_options(it.options)
            except ValueError as err:
                done.append(Finished(it.key, error=err))
                continue
            prefix, core, suffix = split_whitespace(it.text)
            if not core:
                done.append(Finished(it.key, blank_result(it.text)))
                continue
            todo.append((it, core))
            self._affixes[it.key] = (prefix, suffix)
        sources = e.encode_texts([core for _, core in todo])
        admit: list[DecodeItem] = []
        for (it, _), ids in zip(todo, sources, strict=True):
            if error := e.too_long(len(ids)):
                self._affixes.pop(it.key)
                done.append(Finished(it.key, error=error))
                continue
            o = it.options
            admit.append(
                DecodeItem(
                    it.key,
                    ids,
                    o.beam_size,
                    o.num_hypotheses,
                    o.length_penalty,
                    e.max_output_length(len(ids), o),
                    o.repetition_penalty,
                    o.no_repeat_ngram_size,
                )
            )
        by_beam: dict[int, list[DecodeItem]] = {}
        for it in admit:
            by_beam.setdefault(int(it.beam_size), []).append(it)
        now: list[tuple[Any, NBest]] = []
        with e.lock:
            for k in sorted(by_beam):
                now += self.batch(k).admit(by_beam[k])
        return done + self._texts(now)

    def step(self) -> list[Finished]:
        """One decoding step of every running item; returns those that finished (and left)."""
        out: list[tuple[Any, NBest]] = []
        with self.engine.lock:
            for b in self._running():
                out += b.step()
        return self._texts(out)

    def drop(self, keys: Sequence[Any]) -> int:
        """Remove running items (cancelled, expired) at this step boundary; returns how many ran."""
        n = sum(b.drop(keys) for b in self._running())
        for k in keys:
            self._affixes.pop(k, None)
        return n

    def _texts(self, out: list[tuple[Any, NBest]]) -> list[Finished]:
        res = []
        for key, nbest in out:
            prefix, suffix = self._affixes.pop(key, ("", ""))
            texts = self.engine.decode_ids([h for h, _ in nbest])
            res.append(
                Finished(
                    key,
                    [
                        Hypothesis(text=prefix + t + suffix, score=score, tokens=tokens)
                        for t, (tokens, score) in zip(texts, nbest, strict=True)
                    ],
                )
            )
        return res
