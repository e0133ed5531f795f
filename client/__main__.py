"""Translate English text with a running translation server.

    python -m client "Open the file" "Save changes?"          # one translation per argument
    python -m client < input.en > output.es                    # one translation per stdin line, in order
    python -m client --info                                    # model, languages, limits, defaults
    python -m client --to de "Open the file"                   # another pair the server serves
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

from client.cli import (  # noqa: F401 - re-exported: the CLI's names as they were before client.cli
    EXIT_AUTH,
    EXIT_BUSY,
    EXIT_DEADLINE,
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    TLS_HINTS,
    add_connection_args,
    add_translation_args,
    client_from_args,
    explain,
    read_glossary,
    translation_options,
)
from client.core import TranslatorClient, TranslatorError


def unescape_line(line: str) -> str:
    """data/*.en convention: backslash-n is a newline inside a segment, double backslash a backslash."""
    return re.sub(r"\\(\\|n)", lambda m: "\n" if m.group(1) == "n" else "\\", line)


def escape_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to translate (default: stdin lines)")
    add_translation_args(p)
    p.add_argument(
        "--from",
        dest="source_language",
        default="",
        metavar="LANG",
        help="source language, BCP-47 (default: en)",
    )
    p.add_argument(
        "--to",
        dest="target_language",
        default="",
        metavar="LANG",
        help="target language, BCP-47, e.g. de or pt-BR (default: es; --info lists the served pairs)",
    )
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
    served = [(p.source_language, p.target_language) for p in getattr(info, "pairs", ())]
    served = served or [(info.source_language, info.target_language)]  # servers before several models
    pairs = ", ".join(f"{s} -> {t}" for s, t in served)
    rows = [
        ("model", f"{info.name} {info.version}".strip() + f" ({info.variant or '?'} on {providers})"),
        ("languages", pairs),
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


def all_models(client: TranslatorClient) -> list:
    """Every model the server serves (ListModels), or its one model for a server older than it."""
    try:
        return client.list_models()
    except TranslatorError as e:
        if e.code != grpc.StatusCode.UNIMPLEMENTED:
            raise
        return [client.model_info()]


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
            if args.source_language or args.target_language:
                pair = dict(source_language=args.source_language, target_language=args.target_language)
                print(format_info(client.model_info(**pair)))
            else:
                print("\n\n".join(format_info(info) for info in all_models(client)))
            return EXIT_OK
        batches = client.batches(texts, args.batch_size, **options)  # within the server's limits
        progress = None
        if from_stdin and not args.no_progress and len(batches) > 1:
            from tqdm import tqdm

            progress = tqdm(total=len(texts), unit="line", file=sys.stderr, disable=None)

        def run(batch: list[str]):
            result = client.translate(
                batch,
                glossary=glossary,
                source_language=args.source_language,
                target_language=args.target_language,
                **options,
            )
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
