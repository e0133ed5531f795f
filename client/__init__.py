"""Python client of the Translator gRPC service (see client.core), CLI (python -m client) and load
generator (python -m client.load)."""

from client.core import (
    AsyncTranslatorClient,
    Hypothesis,
    NotServingError,
    StreamItem,
    StreamResult,
    TLSError,
    Translation,
    TranslatorClient,
    TranslatorError,
    decoding_options,
    split_batches,
)

__all__ = [
    "AsyncTranslatorClient",
    "Hypothesis",
    "NotServingError",
    "StreamItem",
    "StreamResult",
    "TLSError",
    "Translation",
    "TranslatorClient",
    "TranslatorError",
    "decoding_options",
    "split_batches",
]
