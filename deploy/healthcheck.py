"""Container health probe: asks the server's grpc.health.v1 service whether it is SERVING.

    python deploy/healthcheck.py [--target 127.0.0.1:50051] [--service translator.v1.Translator]

Exit status 0 when the status is SERVING, 1 otherwise (NOT_SERVING while the model loads or the
server drains, connection refused, timeout). Used by the image's HEALTHCHECK and by compose; it needs
only grpcio and grpcio-health-checking, which the runtime image has anyway.

Settings come from the server's own environment, so the probe follows the container's configuration:

| variable | default | meaning |
| --- | --- | --- |
| `TRANSLATOR_PORT` | `50051` | port probed on 127.0.0.1 (unless `--target`) |
| `TRANSLATOR_TLS_CERT` | | set: the probe speaks TLS |
| `TRANSLATOR_HEALTHCHECK_CA` | `TRANSLATOR_TLS_CERT` | PEM roots to verify the server with |
| `TRANSLATOR_HEALTHCHECK_SERVER_NAME` | `localhost` | name checked against the server certificate |
| `TRANSLATOR_HEALTHCHECK_CERT` / `_KEY` | | client certificate (mTLS: `TRANSLATOR_TLS_CLIENT_CA` set) |

Health checks never need the bearer token (the server leaves the health service open).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "translator.v1.Translator"


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def channel_for(target: str, env: Mapping[str, str]) -> grpc.Channel:
    if not env.get("TRANSLATOR_TLS_CERT"):
        return grpc.insecure_channel(target)
    ca = env.get("TRANSLATOR_HEALTHCHECK_CA") or env["TRANSLATOR_TLS_CERT"]
    cert, key = env.get("TRANSLATOR_HEALTHCHECK_CERT"), env.get("TRANSLATOR_HEALTHCHECK_KEY")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca),
        private_key=_read(key) if cert and key else None,
        certificate_chain=_read(cert) if cert and key else None,
    )
    name = env.get("TRANSLATOR_HEALTHCHECK_SERVER_NAME", "localhost")
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", name)])


def check(
    target: str, service: str = SERVICE, timeout: float = 3.0, env: Mapping[str, str] | None = None
) -> str:
    """The health status name (SERVING, NOT_SERVING, ...), or 'UNREACHABLE: <gRPC code>'."""
    env = os.environ if env is None else env
    with channel_for(target, env) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            return f"UNREACHABLE: {e.code().name} {e.details() or ''}".strip()
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="healthcheck", description=__doc__.splitlines()[0])
    default_target = f"127.0.0.1:{os.environ.get('TRANSLATOR_PORT', '50051')}"
    parser.add_argument("--target", default=default_target, help=f"host:port (default: {default_target})")
    parser.add_argument(
        "--service", default=SERVICE, help=f"health service name (default: {SERVICE}; '' = the server)"
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default: 3)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing")
    args = parser.parse_args(argv)
    try:
        status = check(args.target, args.service, args.timeout)
    except OSError as e:  # unreadable certificate files
        status = f"ERROR: {e}"
    if not args.quiet:
        print(f"{args.target} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
