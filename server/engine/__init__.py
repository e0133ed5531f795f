"""ONNX Runtime inference engine: bundle loading, batched greedy / beam search with a KV cache, in-flight
batching. The contract is server/contract.py (TranslationEngine, InFlightBatch) and
docs/engine-contract.md. This package is the only code that touches ONNX Runtime; it needs numpy,
onnxruntime and sentencepiece (through runtime.tokenizer) and imports only runtime/ and server.contract,
never torch, grpc, model/ or export/.

Package map, bottom up (each module imports only those above it):

    sessions.py      ONNX Runtime session options, loading on a device (CUDA or CPU), physical_cores,
                     Graphs: the sessions plus the model interface read from the decoder graph
    cache.py         the request path's KV-cache back-ends: NumpyCache (CPU, spare time capacity)
                     and BoundCache (IOBinding: K/V stay on the device, the bundle's cache graph)
    search.py        one step's selection rules, vectorised and pure: select_candidates (beam),
                     select_greedy, greedy_endings / beam_endings, settled (the early stop)
    generator.py     Generator: id-level request decoding of a batch (generate), cancellation
    rows.py          HostRows / DeviceRows: where the in-flight batch's tensors live between steps
    decode_batch.py  DecodeBatch: id-level in-flight batch (admit / step / drop at step boundaries)
    text.py          Engine (tokenizer, whitespace, blank texts, limits, translate) and RunningBatch
                     (the text-level in-flight batch); they satisfy the server.contract protocols

Decoding reproduces model/decode.py token for token, and every sentence's output is the same alone,
inside any request batch, or in flight with any batch mates, bit for bit.
"""

from __future__ import annotations

from runtime.bundle import BundleError
from runtime.decoding import DecodingOptions, gnmt_length_penalty
from server.contract import BatchItem, Finished, Hypothesis, InputTooLongError
from server.engine.cache import BoundCache, NumpyCache
from server.engine.decode_batch import DecodeBatch
from server.engine.generator import Generator
from server.engine.search import LOGPROB_SLACK, settled
from server.engine.sessions import physical_cores, use_shared_pool
from server.engine.text import Engine, RunningBatch

__all__ = [
    "LOGPROB_SLACK",
    "BatchItem",
    "BoundCache",
    "BundleError",
    "DecodeBatch",
    "DecodingOptions",
    "Engine",
    "Finished",
    "Generator",
    "Hypothesis",
    "InputTooLongError",
    "NumpyCache",
    "RunningBatch",
    "gnmt_length_penalty",
    "physical_cores",
    "settled",
    "use_shared_pool",
]
