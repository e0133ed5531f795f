"""What `python -m client` and `python -m client po` share: exit codes, connection and decoding
options, the glossary file, and the messages that explain a failed call. Both commands import it; neither
imports the other's module for it (client/__main__.py only hands `po` over to client/po.py)."""

from __future__ import annotations

import argparse
import os

import grpc

from client.core import DEFAULT_TARGET, NotServingError, TLSError, TranslatorClient, TranslatorError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INVALID, EXIT_DEADLINE, EXIT_BUSY, EXIT_AUTH = range(
    8
)


TLS_HINTS = {
    "untrusted": "pass --ca-cert with the CA certificate that signed the server's certificate",
    "hostname": "reach the server by a name its certificate lists, or pass --server-name NAME",
    "not_tls": "the server listens without TLS: drop --tls, --ca-cert, --cert and --key",
    "needs_tls": "pass --tls (system CA certificates) or --ca-cert FILE",
    "client_cert": (
        "pass --cert and --key with a client certificate signed by the CA the server trusts "
        "(its TRANSLATOR_TLS_CLIENT_CA)"
    ),
    "handshake": "check --tls, --ca-cert, --cert/--key and --server-name",
}


def explain(e: TranslatorError, target: str, wait_s: float = 0.0) -> tuple[int, str]:
    """Exit code and a message that says what went wrong and what to do."""
    c = e.code
    if isinstance(e, TLSError):
        return EXIT_AUTH, f"TLS with {target} failed: {e.details}.\n{TLS_HINTS[e.problem]}"
    if isinstance(e, NotServingError):
        last = "NOT_SERVING: still loading its model" if e.last == "NOT_SERVING" else e.last
        return EXIT_UNAVAILABLE, (
            f"the server at {target} was not ready within {wait_s:g} s (last answer: {last}).\n"
            "Is it running (make run, or python -m server)? Check --target, or wait longer with --wait-s."
        )
    if e.message_too_large:
        return EXIT_INVALID, (
            f"the request is larger than the server accepts ({e.details}); "
            "send fewer or shorter lines per request (--batch-size)"
        )
    if c == grpc.StatusCode.UNAVAILABLE:
        return EXIT_UNAVAILABLE, (
            f"cannot reach a serving translation server at {target}: {e.details}\n"
            "Is it running (python -m server), or still loading its model? Check --target, "
            "and --tls/--ca-cert if the server uses TLS."
        )
    if c == grpc.StatusCode.INVALID_ARGUMENT:
        return EXIT_INVALID, f"invalid request: {e.details}"
    if c == grpc.StatusCode.DEADLINE_EXCEEDED:
        return (
            EXIT_DEADLINE,
            f"no answer within the deadline ({e.details}); raise --timeout or send smaller batches",
        )
    if c == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = f" (server suggests retrying after {e.retry_after_ms} ms)" if e.retry_after_ms else ""
        return EXIT_BUSY, f"the server is overloaded: {e.details}{hint}"
    if c in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return EXIT_AUTH, f"not authorised: {e.details}; pass --token (or TRANSLATOR_TOKEN)"
    return EXIT_ERROR, f"translation failed: {c.name}: {e.details}"


def client_from_args(args: argparse.Namespace) -> TranslatorClient:
    """A client with the connection options every subcommand takes (target, timeout, retries, TLS, token)."""
    return TranslatorClient(
        args.target,
        timeout=args.timeout,
        retries=args.retries,
        retry_resource_exhausted=True,
        tls=args.tls,
        ca_cert=args.ca_cert,
        client_cert=args.cert,
        client_key=args.key,
        server_name=args.server_name,
        token=args.token,
    )


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """--target and the TLS / token options, shared by every subcommand."""
    p.add_argument(
        "--target",
        default=os.environ.get("TRANSLATOR_TARGET", DEFAULT_TARGET),
        help="server host:port [TRANSLATOR_TARGET] (default: %(default)s)",
    )
    p.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    p.add_argument("--ca-cert", help="PEM CA certificate(s) to verify the server (implies --tls)")
    p.add_argument("--cert", help="PEM client certificate (mutual TLS)")
    p.add_argument("--key", help="PEM client private key (mutual TLS)")
    p.add_argument("--server-name", help="expected server name in its certificate (TLS)")
    p.add_argument(
        "--token", default=os.environ.get("TRANSLATOR_TOKEN"), help="bearer token [TRANSLATOR_TOKEN]"
    )


def add_translation_args(p: argparse.ArgumentParser) -> None:
    """Decoding options and the glossary, shared by every subcommand (see translation_options)."""
    p.add_argument("--beam-size", type=int, default=0, help="beam width, 1 = greedy (default: model's)")
    p.add_argument("--length-penalty", type=float, default=None, help="GNMT alpha (default: model's)")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="penalty on repeated tokens, 1 = off (default: model's)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        default=None,
        help="forbid repeated n-grams, 0 = off (default: model's)",
    )
    p.add_argument(
        "--glossary",
        metavar="FILE",
        help="terms with a required translation: lines ENGLISH<TAB>SPANISH, or ENGLISH alone to keep it",
    )
    p.add_argument(
        "--keep", action="append", default=[], metavar="TERM", help="keep TERM untranslated (repeatable)"
    )


def translation_options(args: argparse.Namespace) -> dict:
    """add_translation_args' decoding options as TranslatorClient.translate keywords."""
    return dict(
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
    )


def read_glossary(path: str, keep: list[str]) -> dict[str, str]:
    """--glossary FILE (ENGLISH<TAB>SPANISH or ENGLISH alone per line; # comments) and --keep terms."""
    terms: dict[str, str] = {}
    if path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\r\n")
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                source, _, target = line.partition("\t")
                terms[source.strip()] = target.strip()
    for term in keep:
        terms[term] = ""
    return terms
