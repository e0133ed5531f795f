"""Translate English text with a running translation server.

    python -m client "Open the file" "Save changes?"          # one translation per argument
    python -m client < input.en > output.es                    # one translation per stdin line, in order
    python -m client --info                                    # model name, limits, defaults

Exit status: 0 ok, 1 other error, 2 usage, 3 server unreachable (UNAVAILABLE), 4 invalid argument,
5 deadline exceeded, 6 server busy (RESOURCE_EXHAUSTED), 7 authentication/permission error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc

from client.core import DEFAULT_TARGET, TranslatorClient, TranslatorError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INVALID, EXIT_DEADLINE, EXIT_BUSY, EXIT_AUTH = range(
    8
)


def unescape_line(line: str) -> str:
    """data/*.en convention: backslash-n is a newline inside a segment, double backslash a backslash."""
    return re.sub(r"\\(\\|n)", lambda m: "\n" if m.group(1) == "n" else "\\", line)


def escape_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def explain(e: TranslatorError, target: str) -> tuple[int, str]:
    """Exit code and a message that says what went wrong and what to do."""
    c = e.code
    if c == grpc.StatusCode.UNAVAILABLE:
        return EXIT_UNAVAILABLE, (
            f"cannot reach a serving translation server at {target}: {e.details}\n"
            "Is it running (python -m server), or still loading its model? Check --target, "
            "and --tls/--ca-cert if the server uses TLS."
        )
    if c == grpc.StatusCode.INVALID_ARGUMENT:
        return EXIT_INVALID, f"the server refused the request: {e.details}"
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to translate (default: stdin lines)")
    p.add_argument(
        "--target",
        default=os.environ.get("TRANSLATOR_TARGET", DEFAULT_TARGET),
        help="server host:port [TRANSLATOR_TARGET] (default: %(default)s)",
    )
    p.add_argument("--beam-size", type=int, default=0, help="beam width, 1 = greedy (default: model's)")
    p.add_argument("--num-hypotheses", type=int, default=0, help="n-best size (default: model's)")
    p.add_argument("--max-length", type=int, default=0, help="max generated tokens (default: from source)")
    p.add_argument("--length-penalty", type=float, default=None, help="GNMT alpha (default: model's)")
    p.add_argument("--scores", action="store_true", help="print SCORE<TAB>TEXT")
    p.add_argument("--batch-size", type=int, default=16, help="stdin lines per request (default: 16)")
    p.add_argument("--parallel", type=int, default=4, help="requests in flight for stdin input (default: 4)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request, retries included")
    p.add_argument("--retries", type=int, default=3, help="retries on UNAVAILABLE / RESOURCE_EXHAUSTED")
    p.add_argument(
        "--escaped",
        action="store_true",
        help="lines use backslash escapes (\\n inside a segment, \\\\), like data/*.en; output too",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--info", action="store_true", help="print the model info and exit")
    p.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    p.add_argument("--ca-cert", help="PEM CA certificate(s) to verify the server (implies --tls)")
    p.add_argument("--cert", help="PEM client certificate (mutual TLS)")
    p.add_argument("--key", help="PEM client private key (mutual TLS)")
    p.add_argument("--server-name", help="expected server name in its certificate (TLS)")
    p.add_argument(
        "--token", default=os.environ.get("TRANSLATOR_TOKEN"), help="bearer token [TRANSLATOR_TOKEN]"
    )
    return p


def format_translation(t, args) -> list[str]:
    def clean(text: str) -> str:
        return escape_line(text) if args.escaped else text.replace("\n", " ")

    if args.num_hypotheses > 1:
        return [
            f"{h.score if h.score is not None else ''}\t{clean(h.text)}" if args.scores else clean(h.text)
            for h in t.hypotheses
        ] + [""]
    best = t.hypotheses[0] if t.hypotheses else None
    text = clean(best.text) if best else ""
    return [f"{best.score:.4f}\t{text}" if args.scores and best and best.score is not None else text]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.parallel < 1:
        print("error: --batch-size and --parallel must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    client = TranslatorClient(
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
    options = dict(
        beam_size=args.beam_size,
        num_hypotheses=args.num_hypotheses,
        max_length=args.max_length,
        length_penalty=args.length_penalty,
        return_scores=args.scores,
    )
    try:
        if args.info:
            print(client.model_info())
            return EXIT_OK
        if args.texts:
            texts = [unescape_line(t) for t in args.texts] if args.escaped else list(args.texts)
            from_stdin = False
        else:
            lines = sys.stdin.read().split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            texts = [unescape_line(t) if args.escaped else t.rstrip("\r") for t in lines]
            from_stdin = True
        if not texts:
            return EXIT_OK
        batch_size = args.batch_size
        if len(texts) > batch_size:
            batch_size = min(batch_size, client.model_info().limits.max_texts_per_request or batch_size)
        batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
        progress = None
        if from_stdin and not args.no_progress and len(batches) > 1:
            from tqdm import tqdm

            progress = tqdm(total=len(texts), unit="line", file=sys.stderr, disable=None)

        def run(batch: list[str]):
            result = client.translate(batch, **options)
            if progress is not None:
                progress.update(len(batch))
            return result

        out = sys.stdout
        with ThreadPoolExecutor(max_workers=min(args.parallel, len(batches))) as pool:
            for translations in pool.map(run, batches):  # in order
                for t in translations:
                    out.write("\n".join(format_translation(t, args)) + "\n")
                out.flush()
        if progress is not None:
            progress.close()
        return EXIT_OK
    except TranslatorError as e:
        code, message = explain(e, args.target)
        print(f"error: {message}", file=sys.stderr)
        return code
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return EXIT_OK
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
