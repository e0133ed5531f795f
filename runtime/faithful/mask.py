"""Masking: protected spans -> sentinels before the model, sentinels -> spans after, with the checks.

The sentinels are the Qt-style `%1`..`%9`, then `{0}`..`{9}`, then `%10`, `%11`, ...: the first 19 are
single pieces of the tokenizer that the training data is full of, so the model copies them where they
belong. Every placeholder of the source is masked too, so the masked text holds no other placeholder.

`restore` accepts a model output only when the result is whole: every sentinel exactly once, nothing
placeholder-like invented, non-positional printf placeholders in the source's order, and markup tags
balanced and properly nested (or, when the source's own tags are not, in the source's order). `repair`
tries the deliberate fixes (drop a duplicated sentinel, put back a missing one that sat at the very start
or end of the source); the text layer falls back to the next hypothesis, then to the source untranslated.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.faithful.spans import Span, tag_name
from runtime.tokenizer import PLACEHOLDER_PATTERN

__all__ = ["SENTINEL_PATTERN", "Masked", "mask", "restore", "repair", "sentinel", "tags_well_formed"]

SENTINEL_PATTERN = _SENTINEL = re.compile(r"%\d+|\{\d+\}")
# Non-positional printf conversions: their order is their meaning.
_ORDERED = re.compile(
    r"%(?!\d+\$)[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcsp]"
)
_TAG_IN_TEXT = re.compile(r"</?[A-Za-z][A-Za-z0-9:_-]*(?:\s[^<>]{0,200})?/?>")
# Text that is only punctuation, spaces and sentinels has nothing for the model to translate.
_NOTHING_LEFT = re.compile(r"[\s\W_]*")


def sentinel(i: int) -> str:
    """The i-th sentinel (0-based)."""
    if i < 9:
        return f"%{i + 1}"
    if i < 19:
        return f"{{{i - 9}}}"
    return f"%{i + 1}"


@dataclass(frozen=True)
class Masked:
    """A source piece with its protected spans replaced by sentinels."""

    source: str
    text: str  # what the model sees
    spans: tuple[Span, ...]
    # Sentinels given a space inside their tag pair: "after" an opening tag, "before" a closing one.
    padded: tuple[tuple[str, str], ...] = ()
    tokens: tuple[str, ...] = ()  # the sentinel of each span

    @property
    def sentinels(self) -> list[str]:
        return list(self.tokens) if self.tokens else [sentinel(i) for i in range(len(self.spans))]

    @property
    def translatable(self) -> bool:
        """Whether anything is left for the model once the spans are masked."""
        rest = _SENTINEL.sub(" ", self.text)
        return not _NOTHING_LEFT.fullmatch(rest)


def _tokens(source: str, spans: list[Span]) -> list[str]:
    """A sentinel per span: the next of %1..%9, {0}..{9}, %10, ... unless the source has a digit right
    after the span, where a %N would read on into it (`%15`): then the next unused {N}."""
    used: set[str] = set()
    out = []
    for s in spans:
        if source[s.end : s.end + 1].isdigit():
            tok = next(f"{{{k}}}" for k in range(len(spans) + 10) if f"{{{k}}}" not in used)
        else:
            tok = next(t for t in (sentinel(i) for i in range(2 * len(spans) + 20)) if t not in used)
        used.add(tok)
        out.append(tok)
    return out


def _token_pattern(tok: str) -> str:
    """A sentinel in a text: %N not followed by another digit; {N} as it is."""
    return re.escape(tok) + (r"(?!\d)" if tok.startswith("%") else "")


def mask(source: str, spans: list[Span], open_tags: Sequence[Span] = ()) -> Masked:
    """Spans -> sentinels. A tag glued to the text it wraps (`<b>Apply</b>`) gets a space inside the pair
    in the masked text (`%1 Apply %2`): the model translates the word rather than copying the run; the
    space goes again on restore. open_tags: tags left visible (not in `spans`); one that opens or stands
    alone (`<br/>`) and is glued to a word (`<b>Warning:</b>`) gets a space after it likewise, when it
    occurs once: after a tag the tokenizer cannot start the word with its usual piece (`W ar n ing`,
    which the model translated `Calentización`), after a space it can (`<b> Warning:</b>` ->
    `<b>Advertencia:</b>`)."""
    parts, pos, padded = [], 0, []
    tokens = _tokens(source, spans)
    marks = [*zip(spans, tokens, strict=True), *((t, None) for t in open_tags)]
    for s, sent in sorted(marks, key=lambda m: m[0].start):
        parts.append(source[pos : s.start])
        if sent is None:  # a visible tag
            tok = s.text
            if (
                tag_name(s.text)[0] in ("open", "empty")
                and source[s.end : s.end + 1].isalnum()
                and source.count(s.text) == 1
            ):
                tok = tok + " "
                padded.append((s.text, "after"))
            parts.append(tok)
            pos = s.end
            continue
        tok = sent
        if s.kind == "tag":
            kind, _ = tag_name(s.text)
            if kind == "open" and source[s.end : s.end + 1].strip() and source[s.end] != "<":
                tok = tok + " "
                padded.append((sent, "after"))
            elif kind == "close" and s.start and source[s.start - 1].strip() and source[s.start - 1] != ">":
                tok = " " + tok
                padded.append((sent, "before"))
        parts.append(tok)
        pos = s.end
    parts.append(source[pos:])
    return Masked(source, "".join(parts), tuple(spans), tuple(padded), tuple(tokens))


def tags_well_formed(tags: list[str]) -> bool:
    """Whether the tags open and close in properly nested pairs (empty tags like <br/> stand alone;
    <br>, <hr>, <img> and similar HTML void elements need no closing tag)."""
    void = {"br", "hr", "img", "input", "meta", "link", "wbr", "col", "area", "base", "nl"}
    stack: list[str] = []
    for tag in tags:
        kind, name = tag_name(tag)
        if kind == "empty" or (kind == "open" and name in void):
            continue
        if kind == "open":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


def _problem(m: Masked, output: str, check_invented: bool = True) -> str | None:
    """Why `output` (a model output over m.text) cannot be restored, or None when it can."""
    found = _SENTINEL.findall(output)
    wanted = m.sentinels
    counts = Counter(found)
    # Spans named as the source has them: the sentinels are the text layer's own, and a reason naming
    # them ("lost %7, {0}") named markers the source does not hold.
    source_text = dict(zip(wanted, (s.text for s in m.spans), strict=True))
    missing = [source_text[s] for s in wanted if counts[s] == 0]
    if missing:
        return f"lost {', '.join(dict.fromkeys(missing))}"
    repeated = [source_text[s] for s in wanted if counts[s] > 1]
    invented = any(s not in source_text for s in counts)
    if repeated or invented:
        said = [f"repeated {', '.join(dict.fromkeys(repeated))}"] if repeated else []
        return " and ".join(said + (["invented a placeholder"] if invented else []))
    rest = _SENTINEL.sub("", output)
    invented = [p for p in PLACEHOLDER_PATTERN.findall(rest) if p != "%%"] if check_invented else []
    if invented:
        return f"invented {', '.join(invented)}"
    toks = m.sentinels
    ordered = [toks[i] for i, s in enumerate(m.spans) if s.ordered]
    if ordered and [s for s in found if s in ordered] != ordered:
        return "moved printf placeholders out of order"
    src_tags = [s.text for s in m.spans if s.kind == "tag"]
    if src_tags:
        index = {toks[i]: s.text for i, s in enumerate(m.spans) if s.kind == "tag"}
        out_tags = [index[s] for s in found if s in index]
        if tags_well_formed(src_tags):
            if not tags_well_formed(out_tags):
                return "broke the nesting of markup tags"
        elif out_tags != src_tags:
            return "moved markup tags"
    return None


def _spaced(m: Masked, output: str) -> str:
    """A space put back between a sentinel and a word that the source kept apart (the model glued them):
    otherwise a restored URL, path or number would run into the next word."""
    parts = re.split(r"(%\d+|\{\d+\})", output)  # text, sentinel, text, ...
    index = dict(zip(m.sentinels, m.spans, strict=True))
    for k in range(1, len(parts), 2):
        s = index.get(parts[k])
        if s is None:
            continue
        after, before = m.source[s.end :], m.source[: s.start]
        nxt = parts[k + 1]
        if not nxt and k + 2 < len(parts):  # two spans glued that the source did not glue: "%s%s"
            other = index.get(parts[k + 2])
            if other is None or other.start != s.end:
                parts[k + 1] = " "
        elif re.match(r"[^\w\s]*\s", after):  # "http://x.org, next": keep ", " apart
            parts[k + 1] = re.sub(r"^([^\w\s]*)(?=\w)", r"\1 ", nxt, count=1)
        elif not re.match(r"\w", after) and re.match(r"\w", nxt):
            parts[k + 1] = " " + nxt
        if not re.search(r"\w$", before) and re.search(r"\w$", parts[k - 1]):
            parts[k - 1] += " "
    return "".join(parts)


def restore(m: Masked, output: str, visible: Sequence[Span] | None = None) -> tuple[str | None, str | None]:
    """(restored text, None) when `output` keeps everything, else (None, the problem).

    visible: the spans left in the model's input as they are (the text layer's first try); they must come
    back verbatim, as often as in the source, with nothing placeholder-like lost or invented, printf in
    order and tags nested."""
    for tok, side in m.padded:  # the space mask() put inside a tag pair
        if side == "after":
            output = re.sub(_token_pattern(tok) + " ", lambda _, t=tok: t, output, count=1)
        else:
            output = re.sub(" " + _token_pattern(tok), lambda _, t=tok: t, output, count=1)
    if visible is not None and not m.spans:
        return output, _visible_problem(m.source, output, visible)
    problem = _problem(m, output, check_invented=visible is None)
    if problem is not None:
        return None, problem
    by_sentinel = {t: s.restore for t, s in zip(m.sentinels, m.spans, strict=True)}
    spaced = _spaced(m, output)
    # Restored spans are checked like visible ones (the model may have put "--" before a "--ipv6"), on
    # the output with each span back as in the source (a glossary term's translation may be anything).
    by_source = {t: s.text for t, s in zip(m.sentinels, m.spans, strict=True)}
    shadow = _SENTINEL.sub(lambda x: by_source[x.group(0)], spaced)
    if problem := _visible_problem(m.source, shadow, [*m.spans, *(visible or [])]):
        return None, problem
    return _SENTINEL.sub(lambda x: by_sentinel[x.group(0)], spaced), None


def _standalone(text: str, span: str) -> int:
    """Occurrences of `span` in `text` not glued to what would change it: a word (where the span itself
    starts or ends with one), or the span's own leading - % $ ("----ipv6" is not "--ipv6")."""
    before = ("\\w" if re.match(r"\w", span) else "") + (re.escape(span[0]) if span[0] in "-%$" else "")
    after = ("\\w" if re.search(r"\w$", span) else "") + ("\\-" if span[-1] == "-" else "")
    if span[0].isdigit():  # numbers end at Latin letters and digits only (spans._NUMBER)
        before = before.replace("\\w", "A-Za-z0-9_")
    if span[-1].isdigit():
        after = after.replace("\\w", "A-Za-z0-9_")
    pattern = (f"(?<![{before}])" if before else "") + re.escape(span) + (f"(?![{after}])" if after else "")
    return len(re.findall(pattern, text))


def _visible_problem(source: str, output: str, visible: Sequence[Span]) -> str | None:
    """Why `output` does not keep the visible spans of `source` (None when it does)."""
    for t in dict.fromkeys(s.text for s in visible):
        if _standalone(output, t) != _standalone(source, t):
            return f"changed {t}"
    want, got = Counter(PLACEHOLDER_PATTERN.findall(source)), Counter(PLACEHOLDER_PATTERN.findall(output))
    if want != got:
        diff = list((want - got) + (got - want))
        return f"lost or invented {', '.join(diff[:3])}"
    if _ORDERED.findall(output) != _ORDERED.findall(source):
        return "moved printf placeholders out of order"
    src_tags, out_tags = _TAG_IN_TEXT.findall(source), _TAG_IN_TEXT.findall(output)
    if tags_well_formed(src_tags):
        if not tags_well_formed(out_tags):
            return "broke the nesting of markup tags"
    elif out_tags != src_tags:
        return "moved markup tags"
    return None


def _around(m: Masked, i: int) -> tuple[str, str]:
    """The masked text before and after sentinel i."""
    hit = re.search(_token_pattern(m.sentinels[i]), m.text)
    assert hit is not None
    return m.text[: hit.start()], m.text[hit.end() :]


def repair(m: Masked, output: str) -> str | None:
    """A deliberately fixed `output` (masked form) or None: repeated sentinels keep their first
    occurrence; a lost sentinel that sat at the start or end of the source goes back there, one from
    inside at the word boundary nearest its relative place (the span left untranslated where the model
    dropped it); None when the result still breaks a rule (printf order, tag nesting)."""
    seen: set[str] = set()

    def first_only(x: re.Match[str]) -> str:
        if x.group(1) in seen:
            return ""  # with the space before it
        seen.add(x.group(1))
        return x.group(0)

    fixed = re.sub(r" ?(%\d+|\{\d+\})", first_only, output)
    present = set(_SENTINEL.findall(fixed))
    for i, s in enumerate(m.sentinels):
        if s in present:
            continue
        before, after = _around(m, i)
        if _NOTHING_LEFT.fullmatch(before):  # at the start: "%s: not found"
            glue = re.match(r"[^\w%{}]*", after).group(0)
            fixed = s + glue + fixed.lstrip().lstrip(glue)
        elif _NOTHING_LEFT.fullmatch(after):  # at the end: "Permission denied: %s"
            glue = re.search(r"[^\w%{}]*$", before).group(0)
            core = fixed.rstrip()
            if after.strip() and core.endswith(after.strip()):
                core = core[: -len(after.strip())]
            fixed = core.rstrip(glue) + glue + s + after
        else:  # inside: at the word boundary nearest its relative place in the source, left untranslated
            where = len(before) / max(1, len(before) + len(after)) * len(fixed)
            cuts = [k for k, ch in enumerate(fixed) if ch == " "] + [len(fixed)]
            k = min(cuts, key=lambda c: abs(c - where))
            fixed = fixed[:k] + " " + s + fixed[k:]
    return fixed if _problem(m, fixed) is None else None
