"""Translate English text with a running translation server.

    python -m client "Open the file" "Save changes?"          # one translation per argument
    python -m client < input.en > output.es                    # one translation per stdin line, in order
    python -m client --info                                    # model, languages, limits, defaults
    python -m client --glossary terms.tsv --keep Inkscape "Open the Inkscape preferences"
    python -m client po po/app.pot -o po/es.po                 # fill a gettext catalog (see client.po)

Before the first request the CLI waits up to --wait-s seconds (default 30) for the server to be ready
(health SERVING: a server that is starting refuses connections, then answers NOT_SERVING while it
loads its model), saying so on stderr.

Output: one line per input text. Segments the server passed through or repaired (a placeholder the model
lost, a text it cannot translate) are reported on stderr as `note:` lines (--no-notes: silent).
--scores: SCORE<TAB>TEXT, the score with 4 decimals. With
--num-hypotheses N > 1: N lines per input text (best first, each SCORE<TAB>TEXT with --scores), then
an empty line.

Exit status: 0 ok, 1 other error, 2 usage, 3 server unreachable or not ready within --wait-s
(UNAVAILABLE), 4 invalid request (INVALID_ARGUMENT, or larger than the server's message size limit),
5 deadline exceeded, 6 server busy (RESOURCE_EXHAUSTED: queue full), 7 authentication: token refused
(UNAUTHENTICATED / PERMISSION_DENIED) or TLS failure (server certificate not verified, client
certificate refused, TLS on one side only).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc

from client.core import DEFAULT_TARGET, NotServingError, TLSError, TranslatorClient, TranslatorError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INVALID, EXIT_DEADLINE, EXIT_BUSY, EXIT_AUTH = range(
    8
)


def unescape_line(line: str) -> str:
    """data/*.en convention: backslash-n is a newline inside a segment, double backslash a backslash."""
    return re.sub(r"\\(\\|n)", lambda m: "\n" if m.group(1) == "n" else "\\", line)


def escape_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to translate (default: stdin lines)")
    add_translation_args(p)
    p.add_argument("--num-hypotheses", type=int, default=0, help="n-best size (default: model's)")
    p.add_argument("--max-length", type=int, default=0, help="max generated tokens (default: from source)")
    p.add_argument(
        "--no-notes",
        action="store_true",
        help="do not report segments the server passed through or repaired (on stderr)",
    )
    p.add_argument("--scores", action="store_true", help="print SCORE<TAB>TEXT")
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="texts per request, capped by the server's limits (default: 16)",
    )
    p.add_argument("--parallel", type=int, default=4, help="requests in flight for stdin input (default: 4)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request, retries included")
    p.add_argument("--retries", type=int, default=3, help="retries on UNAVAILABLE / RESOURCE_EXHAUSTED")
    p.add_argument(
        "--wait-s",
        type=float,
        default=30.0,
        help="wait this long for the server to be ready before the first request; 0 = no wait "
        "(default: %(default)g)",
    )
    p.add_argument(
        "--escaped",
        action="store_true",
        help="lines use backslash escapes (\\n inside a segment, \\\\), like data/*.en; output too",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--info", action="store_true", help="print the model, its limits and defaults, and exit")
    add_connection_args(p)
    return p


def format_translation(t, args) -> list[str]:
    def clean(text: str) -> str:
        # One line per text: a newline (or carriage return) inside a translation becomes a space.
        return escape_line(text) if args.escaped else re.sub(r"\r\n|[\r\n]", " ", text)

    def line(h) -> str:
        if not args.scores:
            return clean(h.text)
        return f"{'' if h.score is None else format(h.score, '.4f')}\t{clean(h.text)}"

    if args.num_hypotheses > 1:
        return [line(h) for h in t.hypotheses] + [""]
    return [line(t.hypotheses[0]) if t.hypotheses else ""]


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


def format_notes(t, index: int, text: str) -> list[str]:
    """Segments the server did not translate as the model wrote them (not the ones with nothing to
    translate, nor texts from the translation memory: neither is a problem), one stderr line each."""
    out = []
    for n in t.notes:
        if n.reason == "nothing to translate" or n.action == "memory":
            continue
        what = "kept untranslated" if n.action == "passed_through" else "repaired"
        out.append(f"note: text {index + 1}: {text[n.start : n.end]!r} {what}: {n.reason}")
    return out


def format_info(info) -> str:
    """GetModelInfoResponse as a few readable lines."""
    lim, d = info.limits, info.default_options
    mode = getattr(info, "batching_mode", "")  # newer servers name the mode
    providers = ", ".join(info.execution_providers) or "?"
    penalty = f"{d.length_penalty:g}" if d.HasField("length_penalty") else "none"
    max_length = f"{d.max_length} tokens" if d.max_length else "from the source (1.5 x its tokens + 10)"
    rows = [
        ("model", f"{info.name} {info.version}".strip() + f" ({info.variant or '?'} on {providers})"),
        ("languages", f"{info.source_language} -> {info.target_language}"),
        ("batching", mode or ("on" if info.batching else "off")),
        (
            "memory",
            f"{info.translation_memory_entries:,} texts" if info.translation_memory_entries else "off",
        ),
        (
            "limits",
            f"{lim.max_texts_per_request} texts and {lim.max_request_bytes} bytes per request, "
            f"{lim.max_text_chars or '?'} characters per text ({lim.max_source_tokens} source tokens "
            f"per segment), beam size <= {lim.max_beam_size}, max length <= {lim.max_length} tokens",
        ),
        (
            "defaults",
            f"beam size {d.beam_size}, n-best {d.num_hypotheses}, length penalty {penalty}, "
            f"max length {max_length}, repetition penalty {d.repetition_penalty:g}, "
            f"no-repeat n-gram {d.no_repeat_ngram_size or 'off'}",
        ),
    ]
    return "\n".join(f"{k + ':':<11}{v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lead = 2 if argv[:1] == ["--target"] else 1 if argv[:1] and argv[0].startswith("--target=") else 0
    if argv[lead : lead + 1] == ["po"]:  # python -m client [--target T] po ...: gettext catalogs
        from client.po import main as po_main

        return po_main(argv[lead + 1 :] + argv[:lead])
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.parallel < 1 or args.wait_s < 0:
        print("error: --batch-size and --parallel must be >= 1, --wait-s >= 0", file=sys.stderr)
        return EXIT_USAGE
    client = client_from_args(args)
    options = translation_options(args) | dict(
        num_hypotheses=args.num_hypotheses, max_length=args.max_length, return_scores=args.scores
    )
    try:
        glossary = read_glossary(args.glossary, args.keep)
        texts: list[str] = []
        from_stdin = not args.texts and not args.info
        if args.texts:
            texts = [unescape_line(t) for t in args.texts] if args.escaped else list(args.texts)
        elif from_stdin:
            lines = sys.stdin.read().split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            texts = [unescape_line(t) if args.escaped else t.rstrip("\r") for t in lines]
        if not texts and not args.info:
            return EXIT_OK
        if args.wait_s > 0:
            client.wait_until_serving(
                args.wait_s,
                on_waiting=lambda: print(
                    f"waiting for the server at {args.target} to be ready... "
                    f"(up to {args.wait_s:g} s, --wait-s)",
                    file=sys.stderr,
                    flush=True,
                ),
            )
        if args.info:
            print(format_info(client.model_info()))
            return EXIT_OK
        batches = client.batches(texts, args.batch_size, **options)  # within the server's limits
        progress = None
        if from_stdin and not args.no_progress and len(batches) > 1:
            from tqdm import tqdm

            progress = tqdm(total=len(texts), unit="line", file=sys.stderr, disable=None)

        def run(batch: list[str]):
            result = client.translate(batch, glossary=glossary, **options)
            if progress is not None:
                progress.update(len(batch))
            return result

        out = sys.stdout
        index = 0
        with ThreadPoolExecutor(max_workers=min(args.parallel, len(batches))) as pool:
            for translations in pool.map(run, batches):  # in order
                for t in translations:
                    out.write("\n".join(format_translation(t, args)) + "\n")
                    if not args.no_notes:
                        for note in format_notes(t, index, texts[index]):
                            print(note, file=sys.stderr)
                    index += 1
                out.flush()
        if progress is not None:
            progress.close()
        return EXIT_OK
    except TranslatorError as e:
        code, message = explain(e, args.target, args.wait_s)
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
