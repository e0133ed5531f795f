"""Bearer-token authentication: the one rule both transports apply, and the gRPC server interceptor
(health checks stay open).

Metadata / header `authorization: Bearer <token>`; the scheme is case-insensitive (RFC 7235 section
2.1: `bearer` and `BEARER` work too). The rule (`token_matches`), for gRPC metadata, the HTTP
`Authorization` header and the HTTP `api_key` alike: spaces and tabs around the presented token are
dropped (HTTP parsers drop them from header values anyway, so gRPC does too), the rest is compared
exactly, in constant time. Any text can be presented, a lone surrogate included: it simply does not
match.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import grpc

from server.metrics import Metrics

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
BLANKS = b" \t"


def as_bytes(value: str | bytes) -> bytes:
    """A presented credential as bytes. surrogatepass: a lone surrogate (JSON allows "\\ud800") or an
    undecodable header byte (aiohttp keeps it as a surrogate escape) must fail the comparison, not raise."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def bearer_credentials(value: str | bytes) -> bytes | None:
    """The token of an `authorization` value `<scheme> <token>` whose scheme is Bearer in any case
    (one or more spaces after it), blanks around it dropped; else None."""
    scheme, space, token = as_bytes(value).partition(b" ")
    if not space or scheme.lower() != b"bearer":
        return None
    return token.strip(BLANKS)


def token_matches(presented: str | bytes, expected: bytes) -> bool:
    """Whether a presented token (blanks around it dropped) is `expected`, compared in constant time."""
    token = as_bytes(presented).strip(BLANKS)
    return bool(token) and hmac.compare_digest(token, expected)


def _deny_handler(original: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def deny(request_or_iterator, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kwargs = {
        "request_deserializer": original.request_deserializer,
        "response_serializer": original.response_serializer,
    }
    if original.request_streaming and original.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if original.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if original.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Every RPC but grpc.health.v1 needs metadata `authorization: Bearer <token>` (scheme in any case)."""

    def __init__(self, token: str, metrics: Metrics | None = None) -> None:
        self._expected = token.encode()
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        presented = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else value
                break
        token = bearer_credentials(presented) if presented is not None else None
        if token is not None and token_matches(token, self._expected):
            return handler
        if self._metrics is not None:
            rpc = method.rsplit("/", 1)[-1] or "unknown"
            self._metrics.requests.labels(rpc=rpc, code="UNAUTHENTICATED", transport="grpc").inc()
        reason = "missing" if presented is None else "invalid"
        return _deny_handler(handler, f"{reason} bearer token: send metadata 'authorization: Bearer <token>'")
