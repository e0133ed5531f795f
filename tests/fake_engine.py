"""A deterministic pure-Python translation engine for the scheduler's tests: fast, no ONNX.

`FakeEngine` satisfies `server.contract.TranslationEngine` and its running batch `InFlightBatch`, so the
scheduler runs against it unchanged. It "translates" by reversing a text's words (a text's tokens are its
words) and decodes every item to its generation budget, `max_output_length` (the options' max_length, else
1.5 x source words + 10, capped), one step per output token, each step sleeping `step_s`: like the tests'
tiny random model, decode time is predictable and long options keep it busy. An item's n-best list is the
same alone, in any request-level batch and in any running batch. It honours `cancelled()` (checked before
every step) and `drop()`, refuses what the real engine refuses (InvalidOptionsError, InputTooLongError),
fails on demand (`fail_on`), and records what it ran for the tests to inspect.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime import decoding
from server.contract import (
    BatchItem,
    BundleError,
    DecodingOptions,
    Finished,
    Hypothesis,
    InputTooLongError,
    Prepared,
)


def split_whitespace(text: str) -> tuple[str, str, str]:
    """(leading whitespace, stripped text, trailing whitespace): only the middle is translated."""
    core = text.strip()
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    return text[:start], core, text[end:]


def word_id(word: str) -> int:
    return 4 + zlib.crc32(word.encode()) % 30_000  # stable across runs (unlike hash())


@dataclass
class _Item:
    key: Hashable
    text: str
    options: DecodingOptions
    budget: int  # steps to run (= output tokens at most)
    left: int


class FakeEngine:
    """A TranslationEngine that reverses words; see the module docstring."""

    def __init__(
        self,
        *,
        step_s: float = 0.002,
        max_source_tokens: int = 64,
        max_beam_size: int = 8,
        max_length_cap: int = 256,
        supports_inflight: bool = True,
        fail_on: str | None = None,
    ) -> None:
        self.name = "fake-en-es"
        self.version = "1"
        self.source_language = "en"
        self.target_language = "es"
        self.max_source_tokens = max_source_tokens
        self.max_beam_size = max_beam_size
        self.max_length_cap = max_length_cap
        self.default_options = DecodingOptions(beam_size=4, num_hypotheses=1, length_penalty=0.6)
        self.providers = ["FakeExecutionProvider"]
        self.memory_entries = 0
        self.step_s = step_s
        self.fail_on = fail_on  # decoding a text with this core raises RuntimeError (an engine failure)
        self._supports_inflight = supports_inflight
        self.last_stats: dict[str, Any] = {}  # like server.engine.Engine's: read by the scheduler's metrics
        self.accelerators_seen: list[bool] = []  # prepare(accelerators=...) per call
        self.batches: list[tuple[list[str], DecodingOptions]] = []  # every translate() call
        self.running: list[FakeRunningBatch] = []  # every running_batch()
        self._lock = threading.Lock()  # one batch at a time, like the real engine

    # ---- the contract ---------------------------------------------------------------------------------

    @property
    def supports_inflight(self) -> bool:
        return self._supports_inflight

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    def too_long(self, n_tokens: int, segment: str = "segment") -> InputTooLongError | None:
        if n_tokens <= self.max_source_tokens:
            return None
        return InputTooLongError(
            f"{segment} has {n_tokens} source tokens, over the limit of {self.max_source_tokens}"
        )

    def check_options(self, options: DecodingOptions) -> None:
        decoding.check_options(
            options,
            max_beam_size=self.max_beam_size,
            max_length_cap=max(self.max_length_cap, options.max_length),
        )

    def max_output_length(self, src_len: int, options: DecodingOptions) -> int:
        if options.max_length > 0:
            return min(options.max_length, self.max_length_cap)
        return decoding.max_output_length(src_len, cap=self.max_length_cap)

    def warmup(self) -> None:
        self.translate(["Hello world."], self.default_options)

    def prepare(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        glossary: Mapping[str, str] | None = None,
        *,
        accelerators: bool = True,
    ) -> Prepared:
        """No text layer: each text is one segment, refused when over max_source_tokens; what the
        server asked for is kept for tests (`accelerators_seen`)."""
        self.accelerators_seen.append(accelerators)
        counts = self.count_tokens(list(texts))
        for i, n in enumerate(counts):
            if error := self.too_long(n, f"texts[{i}]"):
                raise error
        return Prepared(list(texts), counts, options, None)

    def finish(
        self, prepared: Prepared, results: Sequence[list[Hypothesis] | None]
    ) -> list[list[Hypothesis]]:
        return [list(r or []) for r in results]

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis] | None]:
        options = self.default_options if options is None else options
        self.check_options(options)
        results: list[list[Hypothesis] | None] = [None] * len(texts)
        running: dict[int, _Item] = {}
        for i, text in enumerate(texts):
            item = self._item(i, text, options)
            if isinstance(item, Finished):
                results[i] = item.hypotheses
            elif (error := self.too_long(len(split_whitespace(text)[1].split()), f"segment {i}")) is not None:
                raise error
            else:
                running[i] = item
        dropped = [False] * len(texts)

        def poll() -> None:
            if cancelled is None:
                return
            flags = list(cancelled())
            if len(flags) != len(texts):
                raise ValueError(f"cancelled() returned {len(flags)} flags for {len(texts)} texts")
            for i, flag in enumerate(flags):
                if flag:
                    dropped[i] = True
                    running.pop(i, None)

        with self._lock:
            self.batches.append((list(texts), options))
            start = time.perf_counter()
            steps = row_steps = 0
            poll()
            while running:
                self._maybe_fail(item.text for item in running.values())
                time.sleep(self.step_s)
                steps += 1
                row_steps += options.beam_size * len(running)
                for i, item in list(running.items()):
                    item.left -= 1
                    if item.left == 0:
                        results[i] = self.result(item.text, item.options)
                        del running[i]
                if running:
                    poll()
            self.last_stats = {
                "steps": steps,
                "row_steps": row_steps,
                "encoder_s": 0.0,
                "decoder_s": time.perf_counter() - start,
            }
        return [None if gone else r for r, gone in zip(results, dropped, strict=True)]

    def running_batch(self) -> FakeRunningBatch:
        if not self._supports_inflight:
            raise BundleError("fake bundle: the decoder graph lacks per-row positions")
        batch = FakeRunningBatch(self)
        self.running.append(batch)
        return batch

    # ---- the fake's translation ------------------------------------------------------------------------

    def result(self, text: str, options: DecodingOptions) -> list[Hypothesis]:
        """The n-best list of `text`, whatever batch it is in: its words reversed, cut to the budget."""
        prefix, core, suffix = split_whitespace(text)
        if not core:
            return [Hypothesis(text=text, score=0.0, tokens=[])]
        words = core.split()
        out = list(reversed(words))[: self.max_output_length(len(words), options)]
        hyps = []
        for k in range(options.num_hypotheses):
            tokens = [word_id(w) for w in out] + ([k] if k else [])
            logprob = -0.25 * len(tokens) - k
            score = logprob / decoding.gnmt_length_penalty(len(tokens), options.length_penalty)
            text_k = " ".join(out) + (f" ({k})" if k else "")
            hyps.append(Hypothesis(text=prefix + text_k + suffix, score=score, tokens=tokens))
        return hyps

    def _item(self, key: Hashable, text: str, options: DecodingOptions) -> _Item | Finished:
        """A running item, or Finished for a blank text."""
        core = split_whitespace(text)[1]
        if not core:
            return Finished(key, self.result(text, options))
        budget = self.max_output_length(len(core.split()), options)
        return _Item(key, text, options, budget, budget)

    def _maybe_fail(self, texts: Any) -> None:
        if self.fail_on is not None and any(split_whitespace(t)[1] == self.fail_on for t in texts):
            raise RuntimeError(f"fake engine failure on {self.fail_on!r}")


class FakeRunningBatch:
    """The fake's InFlightBatch: items join at the next step and leave when their budget is spent.

    Records, for the tests, the decoder rows of every step (`step_rows`), the beam sizes that shared
    each step (`step_beams`) and every dropped key (`dropped`)."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self._items: dict[Hashable, _Item] = {}  # joining order
        self.step_rows: list[int] = []
        self.step_beams: list[set[int]] = []
        self.dropped: list[Hashable] = []

    def __len__(self) -> int:
        return len(self._items)

    @property
    def rows(self) -> int:
        return sum(item.options.beam_size for item in self._items.values())

    @property
    def keys(self) -> list[Any]:
        return list(self._items)

    def cost(self, source_tokens: int, options: DecodingOptions) -> int:
        out = self.engine.max_output_length(source_tokens, options)
        return max(1, options.beam_size) * (max(1, source_tokens) + out)

    def admit(self, items: Sequence[BatchItem]) -> list[Finished]:
        e = self.engine
        done: list[Finished] = []
        for it in items:
            if it.key in self._items:
                raise ValueError(f"key {it.key!r} is already running")
            try:
                e.check_options(it.options)
            except ValueError as err:
                done.append(Finished(it.key, error=err))
                continue
            item = e._item(it.key, it.text, it.options)
            if isinstance(item, Finished):
                done.append(item)
            elif (error := e.too_long(len(split_whitespace(it.text)[1].split()))) is not None:
                done.append(Finished(it.key, error=error))
            else:
                self._items[it.key] = item
        return done

    def step(self) -> list[Finished]:
        e = self.engine
        e._maybe_fail(item.text for item in self._items.values())
        with e._lock:
            time.sleep(e.step_s)
        self.step_rows.append(self.rows)
        self.step_beams.append({item.options.beam_size for item in self._items.values()})
        finished = []
        for key, item in list(self._items.items()):
            item.left -= 1
            if item.left == 0:
                del self._items[key]
                finished.append(Finished(key, e.result(item.text, item.options)))
        return finished

    def drop(self, keys: Sequence[Any]) -> int:
        n = 0
        for key in keys:
            if self._items.pop(key, None) is not None:
                self.dropped.append(key)
                n += 1
        return n


class GatedEngine(FakeEngine):
    """A FakeEngine whose decoding steps wait while `gate` is closed (`gate.clear()`), in both batching
    modes: a test holds requests in flight, queued or mid-decode for as long as it needs, whatever the
    machine's speed, then opens the gate (`gate.set()`). `steps` counts the steps that ran.

    A closed gate holds the worker thread, so cancellations and deadlines are acted on once it opens (at
    the next step boundary, like the real engine's)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.steps = 0
        self.waiting = threading.Event()  # set while a step waits at the closed gate

    def wait_gate(self) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            opened = self.gate.wait(60)
            self.waiting.clear()
            if not opened:  # never hang a test run: fail the batch instead
                raise RuntimeError("GatedEngine: the gate stayed closed for 60 s")
        self.steps += 1

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis] | None]:
        def gated() -> Sequence[bool]:  # the fake polls before every step
            self.wait_gate()
            return cancelled() if cancelled is not None else [False] * len(texts)

        return super().translate(texts, options, cancelled=gated)

    def running_batch(self) -> FakeRunningBatch:
        if not self._supports_inflight:
            raise BundleError("fake bundle: the decoder graph lacks per-row positions")
        batch = GatedRunningBatch(self)
        self.running.append(batch)
        return batch


class GatedRunningBatch(FakeRunningBatch):
    engine: GatedEngine

    def step(self) -> list[Finished]:
        self.engine.wait_gate()
        return super().step()
