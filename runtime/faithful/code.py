"""Code inside a text: what a translation keeps as it is because it is code, not prose.

- Quoted literals: `` `alias' ``, `` `help name' ``, `` `fc -s [pat=rep ...]' `` (GNU quoting, whatever it
  holds but a capitalised phrase), `` `write` `` (Markdown), and a code-like thing between straight or
  curly quotes: `"--font"`, `"$line $filename"`, `'vpath'`, `"test"`. The quotes belong to the
  span: a literal comes back with the very quotes it had (the model wrote `«%s»` for `` `%s' ``, which
  then reads as another string and fails translate-toolkit's quoting checks). A capitalised word or a
  phrase between straight quotes is prose (`"Other"`, `"unsaved documents"`) and is translated, its
  quotes as the model writes them, and so is a placeholder alone between such quotes (`"%1"`: the
  translators restyle those quotes, `«%1»`); a lowercase word quoted like the prose of the same text
  is prose too (`When "unsaved documents" or "always" is selected`).
- Usage lines (synopses): `alias [-p] [name[=value] ... ]`, `time [-p] pipeline`, `set [NAME=VALUE ...]`,
  `Usage: %s [OPTION]...`, shell compound commands `if COMMANDS; then COMMANDS; ... fi`, `(( expression
  ))`, `case WORD in [PATTERN [| PATTERN]...) COMMANDS ;;]... esac`: the command word (each time it comes
  back: `export ... or export -p`), the shell's keywords and operators, and the metavariables in
  capitals are kept; the other words (`name`, `value`, `pipeline`) are translated as Debian's
  translators do (`alias [-p] [nombre[=valor] ... ]`).
- Masks other tools put in place of placeholders before sending: Weblate's `[X7X]`.

`code_spans` finds them (runtime.faithful.spans.find_spans merges them with the other kinds).
"""

from __future__ import annotations

import re

from runtime.tokenizer import PLACEHOLDER_PATTERN

__all__ = ["SHELL_KEYWORDS", "TOOL_MASK", "code_spans", "is_code", "is_usage_line", "usage_spans"]

# Weblate's machinery masks each placeholder as "[X<offset>X]" before it sends a text
# (weblate/machinery/base.py: replacement_start "[X", replacement_end "X]").
TOOL_MASK = re.compile(r"\[X\d+X\]")

SHELL_KEYWORDS = frozenset(
    "if then elif else fi for in do done case esac while until select function time coproc".split()
)
_OPERATORS = ("((", "))", "[[", "]]", ";;", "{", "}", "!")
# GNU quoting `...' (also `...` as Markdown and git write it): the text between is a literal.
_GNU_QUOTED = re.compile(r"`([^`'\n]{1,80})['`]")
# A straight or curly pair; not an apostrophe inside or after a word (don't, users' files).
_QUOTED = re.compile(r"""(?<![\w'’`"])(["'“‘])([^"'“”‘’`\n]{1,80})(["'”’])(?![\w'’])""")
_CLOSING = {'"': '"', "'": "'", "“": "”", "‘": "’"}
# What makes quoted text code whatever its words: a placeholder, an option, a path, a variable, an
# assignment, shell or C punctuation, an identifier with an underscore or a dot inside.
_CODE_MARK = re.compile(r"[$=;|&<>*(){}\[\]/\\~%#@^]|(?:^|\s)--?\w|\w[_.]\w|^[-+.]")
_CAPITALISED = re.compile(r"[A-Z][a-z]+")
_TOKEN = re.compile(r"\S+")


def is_code(inner: str, gnu: bool = False) -> bool:
    """Whether quoted text is a literal (kept as it is) rather than prose: GNU-quoted text unless it is a
    capitalised phrase (`` `Get all' ``); between other quotes, one token that is not a capitalised word
    (`"test"`, `"FILE"`, `"x86"`) or anything with a code mark (`"-%c"`, `"$line $filename"`)."""
    inner = inner.strip()
    if not inner:
        return False
    if not gnu and PLACEHOLDER_PATTERN.fullmatch(inner):
        # `Create "%1" in %2`: the translators put such quotes in their language's style (on valid, es
        # «%1» 87 in 100, fr 82, de 65); the placeholder is kept as a placeholder, the quotes are the model's.
        return False
    if _CODE_MARK.search(inner) or PLACEHOLDER_PATTERN.search(inner):
        return True
    words = inner.split()
    if gnu:
        return len(words) == 1 or not (_CAPITALISED.fullmatch(words[0]) and len(words) <= 6)
    return len(words) == 1 and not _CAPITALISED.fullmatch(inner)


def _quoted(text: str) -> list[tuple[int, int]]:
    """[start, end) of each quoted literal, quotes included."""
    out = [(m.start(), m.end()) for m in _GNU_QUOTED.finditer(text) if is_code(m.group(1), gnu=True)]
    pairs = []
    for m in _QUOTED.finditer(text):
        if _CLOSING[m.group(1)] != m.group(3) or any(s <= m.start() < e for s, e in out):
            continue
        pairs.append((m, is_code(m.group(2))))
    # Quoted alike, read alike: a plain word quoted like the prose of the same text is an item of the
    # same list ("unsaved documents" or "always"), not a literal.
    prose_quotes = {m.group(1) for m, code in pairs if not code}
    for m, code in pairs:
        plain_word = re.fullmatch(r"[a-z]+", m.group(2)) is not None
        if code and not (plain_word and m.group(1) in prose_quotes):
            out.append((m.start(), m.end()))
    return out


# ---- usage lines -------------------------------------------------------------------------------------

_USAGE_PREFIX = re.compile(r"(?:[Uu]sage|USAGE|or): +")
_COMMAND = re.compile(r"[a-z][\w.+-]*|%s")
# Bracket contents that describe rather than name an argument: "[optional]", "[default=%s]".
_DESCRIPTIVE = re.compile(r"\[(?:optional|required|default|recommended|deprecated)\b")
_METAVAR = re.compile(r"[A-Z][A-Z0-9_]*(?:-\d+)?")


def _outside_brackets(line: str) -> str:
    depth, out = 0, []
    for ch in line:
        depth += ch == "["
        out.append(ch if depth == 0 else " ")
        depth -= ch == "]" and depth > 0
    return "".join(out)


def _is_usage(line: str) -> bool:
    """Whether a line (its prefix `Usage: ` taken off) is a synopsis: a command and its arguments."""
    first = line.split(maxsplit=1)[0] if line.split() else ""
    if first in SHELL_KEYWORDS or first in _OPERATORS:
        return _is_compound(line)
    if not _COMMAND.fullmatch(first) or " " not in line or _DESCRIPTIVE.search(line):
        return False
    rest = line[len(first) :]
    outside = _outside_brackets(rest).replace("...", "   ")  # `[FILE]...`: repeated, not an ellipsis
    if re.search(r"[.!?:,]\s*$|[.!?:,]\s", outside):  # a sentence or a description
        return False
    words = [w for w in _TOKEN.findall(outside) if w not in ("or", first, "|", "...")]
    lower = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
    options = any(w.startswith(("-", "+")) for w in _TOKEN.findall(rest))
    signal = options or "[" in rest or "..." in rest or "|" in rest
    return signal and len(lower) <= 1 and all(_is_argument(w) for w in words)


def _is_argument(word: str) -> bool:
    """An argument word of a synopsis: a metavariable, an option, a placeholder, brackets and
    operators."""
    return re.fullmatch(r"[\w%$@.=+*|<>()/:-]+[.]{0,3}|[\[\]{}();&|!]+", word) is not None


def _is_compound(line: str) -> bool:
    """A shell compound command written out: `if ... fi`, `for ... done`, `case ... esac`, `(( ... ))`,
    `[[ ... ]]`, `{ ... ; }`, `function name { ... }`, `time [-p] pipeline`."""
    tokens = _TOKEN.findall(line)
    ends = {"if": "fi", "for": "done", "while": "done", "until": "done", "select": "done", "case": "esac"}
    ends |= {"((": "))", "[[": "]]", "{": "}", "function": "}"}
    head = tokens[0]
    if head in ends:
        return ends[head] in tokens or tokens[-1].endswith(ends[head]) or _opens_body(line)
    return head in ("time", "coproc") and _is_usage_plain(line)


def _opens_body(line: str) -> bool:
    """The first line of a compound command written over several (`while (( EXP2 )); do`, `case WORD
    in`): its body and closing keyword follow on their own lines."""
    return re.search(r";\s*(?:do|then)$", line) is not None or re.fullmatch(r"case \S+ in", line) is not None


def _is_usage_plain(line: str) -> bool:
    words = _TOKEN.findall(_outside_brackets(line))[1:]
    return "[" in line and sum(bool(re.fullmatch(r"[a-z][a-z-]*", w)) for w in words) <= 1


def is_usage_line(line: str) -> bool:
    """Whether `line` is a usage line or a shell construct (its sentences are not split apart)."""
    return bool(usage_spans(line))


def usage_spans(line: str, offset: int = 0) -> list[tuple[int, int]]:
    """[start, end) of what a synopsis keeps (its command, keywords, operators and metavariables in
    capitals), or [] when `line` is none."""
    lead = len(line) - len(line.lstrip())
    body = line.strip()
    prefix = _USAGE_PREFIX.match(body)
    start = lead + (prefix.end() if prefix else 0)
    body = line[start:].rstrip()
    if not body or not _is_usage(body):
        return []
    first = body.split(maxsplit=1)[0]
    compound = first in SHELL_KEYWORDS or first in _OPERATORS
    out = []
    for m in re.finditer(r"[^\s\[\]|]+|\[\[|\]\]", body):
        tok = m.group(0) if m.group(0) in _OPERATORS else m.group(0).rstrip(";")
        keep = tok == first and tok != "%s"
        keep = keep or (compound and (tok in SHELL_KEYWORDS or tok in _OPERATORS))
        keep = keep or _METAVAR.fullmatch(tok) is not None and len(tok) > 1
        if keep and tok:
            out.append((offset + start + m.start(), offset + start + m.start() + len(tok)))
    return out


def code_spans(text: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) of every code span of `text`: "mask" for other tools' masks, "code" for
    quoted literals and what usage lines keep. They may overlap; find_spans resolves that."""
    out = [("mask", m.start(), m.end()) for m in TOOL_MASK.finditer(text)]
    out += [("code", s, e) for s, e in _quoted(text)]
    pos, opened = 0, False
    for line in text.split("\n"):
        found = usage_spans(line, pos)
        out += [("code", s, e) for s, e in found]
        opened = opened or bool(found) and _opens_body(line.strip())
        # The lines that close a compound command opened on an earlier line: `done`, `fi`, `esac`.
        if opened and line.strip() in _CLOSERS:
            start = pos + len(line) - len(line.lstrip())
            out.append(("code", start, start + len(line.strip())))
        pos += len(line) + 1
    return out


_CLOSERS = frozenset({"done", "fi", "esac", "else", "then", "do", "}", ";;"})
