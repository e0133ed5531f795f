"""Code in texts (runtime.faithful.code): quoted literals, usage lines and shell syntax, other tools' masks
(Weblate's `[X7X]`) are protected spans; the text layer's notes name what the source holds, never its
own sentinels; translate-toolkit's pofilter runs on catalogs (bench.pofilter_check)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import polib
import pytest

from runtime.decoding import DecodingOptions
from runtime.faithful.code import code_spans, is_code
from runtime.faithful.spans import find_spans
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, Prepared
from server.engine import Engine
from server.engine.faithful import TextLayer

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"
BEAM1 = DecodingOptions(beam_size=1)


@pytest.fixture(scope="module")
def layer() -> TextLayer:
    return TextLayer(Tokenizer(TOKENIZER), max_source_tokens=64)


def code(text: str) -> list[str]:
    return [s.text for s in find_spans(text) if s.kind == "code"]


def run(layer: TextLayer, text: str, model) -> Hypothesis:
    """prepare -> model(segment) -> finish, for as many rounds as the layer asks (two at most)."""
    step = layer.prepare([text], BEAM1, accelerators=False)
    for _ in range(2):
        if not isinstance(step, Prepared):
            break
        step = layer.finish(step, [[Hypothesis(model(s), -1.0, [7])] for s in step.segments])
    assert not isinstance(step, Prepared)
    return step[0][0]


# ---- Weblate's masks -----------------------------------------------------------------------------------


def test_a_weblate_mask_is_a_span_the_model_sees_as_a_placeholder(layer):
    assert [(s.kind, s.text) for s in find_spans("Delete [X7X] selected images?")] == [("mask", "[X7X]")]
    first = layer.prepare(["Delete [X7X] selected images?"], BEAM1)
    assert first.segments == ["Delete %1 selected images?"]  # where a Qt %1 would be, as the model knows
    got = layer.finish(first, [[Hypothesis("¿Borrar %1 imágenes seleccionadas?", -1.0, [7])]])
    assert got[0][0].text == "¿Borrar [X7X] imágenes seleccionadas?"


def test_several_masks_keep_their_places_and_a_text_of_masks_is_left_alone(layer):
    first = layer.prepare(["[X0X] of [X5X] files"], BEAM1)
    assert first.segments == ["%1 of %2 files"]
    got = layer.finish(first, [[Hypothesis("%1 de %2 archivos", -1.0, [7])]])
    assert got[0][0].text == "[X0X] de [X5X] archivos"
    assert layer.prepare(["[X0X]"], BEAM1).segments == []  # nothing for the model


def test_the_shipped_model_puts_a_weblate_mask_where_the_placeholder_goes(shipped_bundle):
    """The issue's case: Weblate sends `Delete %1 selected images?` as `Delete [X7X] selected images?`;
    the translation is the one the placeholder gets, the mask in its place."""
    engine = Engine(shipped_bundle, intra_op_threads=1)
    masked, plain = engine.translate_texts(["Delete [X7X] selected images?", "Delete %1 selected images?"])
    assert masked[0].text == plain[0].text.replace("%1", "[X7X]"), (masked[0].text, plain[0].text)


# ---- quoted literals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Type `help' to see this list.", ["`help'"]),
        ("`%s': not a valid identifier", ["`%s'"]),
        ("Use `fc -s [pat=rep ...] [command]' format", ["`fc -s [pat=rep ...] [command]'"]),
        ('Equivalent to `let "EXPRESSION"\'.', ['`let "EXPRESSION"\'']),
        ("such as `write` or `wall`", ["`write`", "`wall`"]),
        ('Without EXPR, returns "$line $filename".', ['"$line $filename"']),
        ('Invalid argument for option "--dynamic-title-mode": %s', ['"--dynamic-title-mode"']),
        ("missing 'endef', unterminated 'define'", ["'endef'", "'define'"]),
        ('This is a synonym for the "test" builtin', ['"test"']),
        # Prose between quotes is translated: a capitalised word or phrase, a list quoted alike.
        ('Open the "Other" folder', []),
        ("If you select `Get all new mail' the account is checked", []),
        ('When "unsaved documents" or "always" is selected', []),
        # Apostrophes are not quotes.
        ("Don't use the users' files", []),
        ("Mousepad won't ask", []),
        # A placeholder alone between quotes: the placeholder is protected, the quotes are the model's.
        ('Create "%1" in %2', []),
        ("Delete '%s' tag?", []),
    ],
)
def test_quoted_literals_are_kept_with_their_quotes(text, kept):
    assert code(text) == kept


def test_what_makes_quoted_text_code():
    assert is_code("%s", gnu=True) and is_code("-l") and is_code("x86_64") and is_code("FILE")
    assert is_code("vpath")
    assert is_code("help name", gnu=True) and not is_code("help name")
    # A placeholder alone between straight or curly quotes: the translators restyle the quotes.
    assert not is_code("%s") and not is_code("%1") and not is_code("{name}")
    assert not is_code("Other") and not is_code("Whole disk", gnu=True) and not is_code("")


# ---- usage lines and shell syntax ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("(( expression ))", ["((", "))"]),
        ("[[ expression ]]", ["[[", "]]"]),
        ("case WORD in [PATTERN [| PATTERN]...) COMMANDS ;;]... esac",
         ["case", "WORD", "in", "PATTERN", "PATTERN", "COMMANDS", ";;", "esac"]),
        ("if COMMANDS; then COMMANDS; [ elif COMMANDS; then COMMANDS; ]... [ else COMMANDS; ] fi",
         ["if", "COMMANDS", "then", "COMMANDS", "elif", "COMMANDS", "then", "COMMANDS", "else", "COMMANDS",
          "fi"]),
        ("until COMMANDS; do COMMANDS-2; done", ["until", "COMMANDS", "do", "COMMANDS-2", "done"]),
        ("export [-fn] [name[=value] ...] or export -p", ["export", "export"]),
        ("time [-p] pipeline", ["time"]),
        ("test [expr]", ["test"]),
        ("set [NAME=VALUE ...]", ["set"]),
        ("Usage: %s [OPTION]... [FILE]...", ["OPTION", "FILE"]),
        ("Equivalent to\n\twhile (( EXP2 )); do\n\t\tCOMMANDS\n\tdone", ["while", "((", "EXP2", "))", "do",
                                                                          "done"]),
        # Prose, descriptions and messages are not usage lines.
        ("compress GRUB files [optional]", []),
        ("use FILE as the boot image [default=%s]", []),
        ("cannot start debugger; debugging mode disabled", []),
        ("for each file; do it again", []),
        ("if the file exists, then stop", []),
        ("The result is done\ndone", []),
    ],
)  # fmt: skip
def test_usage_lines_keep_their_command_keywords_and_metavariables(text, kept):
    assert code(text) == kept


def test_code_spans_report_kinds_and_offsets():
    text = "Delete [X7X]? See `help'"
    assert [(k, text[s:e]) for k, s, e in code_spans(text)] == [("mask", "[X7X]"), ("code", "`help'")]


# ---- the text layer ----------------------------------------------------------------------------------------


def test_a_model_that_rewrites_a_literal_gets_it_masked_and_kept(layer):
    """First round: `%s' visible; the model writes «%s» and fails the check. Second round: masked."""
    seen = []

    def model(segment: str) -> str:
        seen.append(segment)
        rest = ": no es un identificador válido"
        return "«%s»" + rest if "%s" in segment else "%1" + rest

    got = run(layer, "`%s': not a valid identifier", model)
    assert seen == ["`%s': not a valid identifier", "%1: not a valid identifier"]
    assert got.text == "`%s': no es un identificador válido"


def test_a_shell_keyword_the_model_translates_is_put_back(layer):
    def model(segment: str) -> str:
        return segment.replace("time", "tiempo").replace("pipeline", "tubería")

    got = run(layer, "time [-p] pipeline", model)
    assert got.text == "time [-p] tubería"


def test_notes_name_what_the_source_holds_not_the_layers_sentinels(layer):
    """A segment left untranslated said `lost %7, %9, {0}`: markers the source never had."""
    text = "Copy %s to %s"

    def model(segment: str) -> str:
        return re.sub(r"%2|%s$", "", segment.replace("Copy", "Copiar").replace("to", "a")).strip()

    got = run(layer, text, model)
    reasons = " ".join(n.reason for n in got.notes)
    assert "lost %s" in reasons and not re.search(r"%\d|\{\d\}", reasons), reasons


def test_the_shipped_model_keeps_shell_code(shipped_bundle):
    """The issue's cases: `(( expression ))` lost a parenthesis, `export` became `Exportar`, `if COMMANDS;
    then ...` became `si ORDENA.MANDO; entonces ...`, and `` `%s' `` became `«%s»`."""
    engine = Engine(shipped_bundle, intra_op_threads=1)
    sources = [
        "(( expression ))",
        "export [-fn] [name[=value] ...] or export -p",
        "if COMMANDS; then COMMANDS; [ elif COMMANDS; then COMMANDS; ]... [ else COMMANDS; ] fi",
        "`%s': not a valid identifier",
        "Type `help' to see this list.",
    ]
    got = [h[0].text for h in engine.translate_texts(sources)]
    assert got[0].startswith("((") and got[0].endswith("))"), got[0]
    assert got[1].startswith("export ") and got[1].endswith(" export -p"), got[1]
    assert got[2] == sources[2]
    assert got[3].startswith("`%s': ") and "«" not in got[3], got[3]
    assert "`help'" in got[4], got[4]


# ---- pofilter ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="msgfmt (GNU gettext) not installed")
def test_pofilter_flags_rewritten_quotes_and_the_bench_counts_kept_code():
    pytest.importorskip("translate.filters.checks")
    from bench.pofilter_check import code_kept, pofilter

    po = polib.POFile()
    rewritten = polib.POEntry(msgid="`%s': not a valid identifier", msgstr="«%s»: identificador no válido")
    kept = polib.POEntry(msgid="`%s': invalid alias name", msgstr="`%s': nombre de alias no válido")
    po.extend([rewritten, kept])
    failed = pofilter(po)
    assert "singlequoting" in failed[(None, "`%s': not a valid identifier")]
    assert "singlequoting" not in failed.get((None, "`%s': invalid alias name"), set())
    assert code_kept("if COMMANDS; then COMMANDS; fi", "si ÓRDENES; entonces ÓRDENES; fi") == (3, 1)
    assert code_kept("Type `help' to see", "Escriba `help' para ver") == (1, 1)
