"""Python client of the Translator gRPC service (see client.core), CLI (python -m client) and load
generator (python -m client.load)."""

from client.core import (
    AsyncTranslatorClient,
    Hypothesis,
    StreamItem,
    StreamResult,
    Translation,
    TranslatorClient,
    TranslatorError,
    decoding_options,
)

__all__ = [
    "AsyncTranslatorClient",
    "Hypothesis",
    "StreamItem",
    "StreamResult",
    "Translation",
    "TranslatorClient",
    "TranslatorError",
    "decoding_options",
]
