"""Shell examples of the Markdown docs, parsed for tests/test_docs.py.

Two kinds of fenced blocks are read:

* ```console blocks are transcripts: a line `$ command` (continued on the next lines while a line
  ends with a backslash), then the lines the command prints, up to the next `$` line or the end of the
  block. Each command is one Example with its expected output.
* ```sh / ```bash / ```shell blocks are command lists without output; only their commands that call
  the client CLI (`python -m client ...` or `.venv/bin/python -m client ...`, not `client.load`) are
  collected, as Examples without expected output (the test checks that they exit 0).

Everything else in the docs (other languages, other commands of sh blocks) is not an example.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

CLIENT_CLI = re.compile(r"(?<![\w/.-])(?:\.venv/bin/)?python3? -m client(?![\w.])")
SHELL_LANGS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)")


@dataclass(frozen=True)
class Example:
    path: str  # relative to the repository root, e.g. "README.md"
    line: int  # 1-based line of the `$ command` (console) or of the command (sh)
    kind: str  # "console" | "sh"
    command: str  # as written, without the prompt; continuation lines kept ("\\\n" is fine for sh)
    expected: tuple[str, ...] | None  # console: the output lines; sh: None (exit status only)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        return f"{self.id} ({self.kind} block): $ {self.command}"


@dataclass(frozen=True)
class ParseError:
    path: str
    line: int
    message: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _blocks(text: str):
    """(language, first content line number, content lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        start = i + 1
        j = start
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[start:j]]
        yield lang, start + 1, body
        i = j + 1


def _logical_lines(body: list[str], first: int):
    """(line number, command) of a shell block, backslash continuations joined (kept as written)."""
    i = 0
    while i < len(body):
        number, parts = first + i, [body[i]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(body):
            i += 1
            parts.append(body[i])
        yield number, "\n".join(parts)
        i += 1


def _console(body: list[str], first: int, path: str) -> tuple[list[Example], list[ParseError]]:
    """The `$ command` + output pairs of one console block."""
    commands: list[tuple[int, str, list[str]]] = []
    errors: list[ParseError] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line == "$" or line.startswith("$ "):
            number, parts = first + i, [line[2:]]
            while parts[-1].rstrip().endswith("\\") and i + 1 < len(body):
                i += 1
                parts.append(body[i])
            commands.append((number, "\n".join(parts).strip(), []))
        elif commands:
            commands[-1][2].append(line.rstrip())
        elif line.strip():
            errors.append(ParseError(path, first + i, f"console block line before any `$ command`: {line!r}"))
        i += 1
    examples = []
    for number, command, output in commands:
        while output and not output[-1]:
            output.pop()
        examples.append(Example(path, number, "console", command, tuple(output)))
    return examples, errors


def parse(text: str, path: str) -> tuple[list[Example], list[ParseError]]:
    examples: list[Example] = []
    errors: list[ParseError] = []
    for lang, first, body in _blocks(text):
        if lang == "console":
            found, bad = _console(body, first, path)
            examples += found
            errors += bad
        elif lang in SHELL_LANGS:
            for number, command in _logical_lines(body, first):
                stripped = command.strip()
                if CLIENT_CLI.match(stripped):
                    examples.append(Example(path, number, "sh", stripped, None))
    return examples, errors


def collect(root: Path, paths: tuple[str, ...]) -> tuple[list[Example], list[ParseError]]:
    examples: list[Example] = []
    errors: list[ParseError] = []
    for path in paths:
        found, bad = parse((root / path).read_text(encoding="utf-8"), path)
        examples += found
        errors += bad
    return examples, errors


# ---- running -----------------------------------------------------------------------------------------

# Programs a doc example may pipe the client through; anything else must be listed as skipped.
SAFE_PROGRAMS = {
    "cat",
    "cut",
    "diff",
    "echo",
    "grep",
    "head",
    "jq",
    "paste",
    "printf",
    "sed",
    "sort",
    "tail",
    "tr",
    "uniq",
    "wc",
}
_SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", "|&"}
_INPUT = {"<", "<<<"}
_OUTPUT = {">", ">>", ">|", "&>", "&>>", ">&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def rewrite(command: str, python: str, target: str, metrics: str) -> str:
    """The example as run: the client CLI as `python -m client --target TARGET` (any --target of the
    example replaced), the default addresses localhost:50051 / :8000 replaced by the test server's."""
    command = re.sub(r"(?<![\w-])--target(?:=|[ \t]+)\S+", "", command)
    command = CLIENT_CLI.sub(lambda _: f"{shlex.quote(python)} -m client --target {target}", command)
    command = re.sub(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0):50051\b", target, command)
    return re.sub(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0):8000\b", metrics, command)


def why_not_runnable(command: str, root: Path) -> str | None:
    """None if the (original) command only runs the client CLI and SAFE_PROGRAMS, with no background
    job, no file written and only existing files read; else the reason it cannot run as is."""
    if CLIENT_CLI.search(command) is None:
        return "it does not run the client CLI (python -m client)"
    if "$(" in command or "`" in command:
        return "command substitution"
    try:
        lexer = shlex.shlex(command.replace("\\\n", " "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as e:
        return f"cannot tokenize it: {e}"
    stage_start = True
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "&":
            return "it runs a background job (&)"
        if tok in _SEPARATORS:
            stage_start = True
        elif tok in _INPUT or tok in _OUTPUT or tok in ("<<", "<>"):
            arg = tokens[i + 1] if i + 1 < len(tokens) else ""
            if tok in ("<<", "<>"):
                return f"it uses {tok!r} (here-document or read-write file)"
            if tok == "<" and not (root / arg).is_file():
                return f"it reads {arg!r}, which is not in the repository"
            if tok in _OUTPUT and arg != "/dev/null" and not arg.isdigit():
                return f"it writes the file {arg!r}"
            i += 2
            continue
        elif stage_start:
            if _ASSIGNMENT.match(tok):
                pass  # VAR=value prefix
            elif tok in ("python", "python3", ".venv/bin/python", ".venv/bin/python3"):
                rest = tokens[i + 1 : i + 3]
                if rest != ["-m", "client"]:
                    return f"it runs {' '.join([tok, *rest])!r}"
                stage_start = False
            elif tok in SAFE_PROGRAMS:
                stage_start = False
            else:
                return f"it runs {tok!r}"
        i += 1
    return None
