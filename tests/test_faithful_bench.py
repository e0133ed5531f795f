"""bench.faithful: the independent checker (bench.faithful_check: spans, multiset check, tag nesting,
sentences), the set's selection rules (bench.faithful_set), the run and --compare reports, and the committed
set itself (bench/data/faithful.jsonl: held-out packages only)."""

import json
from collections import Counter
from pathlib import Path

import pytest

from bench import faithful, faithful_set
from bench.faithful_check import (
    CATEGORIES,
    HANDWRITTEN,
    categorize,
    check_spans,
    count_sentences,
    markup_tags,
    protected_spans,
    tags_well_formed,
)
from bench.faithful_set import (
    DEFAULT_SET,
    HANDWRITTEN_SOURCES,
    clean_heldout_pair,
    heldout_packages,
    select_balanced,
)
from runtime.tokenizer import find_placeholders

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_LIST = REPO_ROOT.parent / "shared" / "data" / "debian-l10n-packages.tsv"


def spans(text: str) -> list[tuple[str, str]]:
    return [(s.kind, s.text) for s in protected_spans(text)]


# --------------------------------------------------------------------------------------------
# Span extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Copied %d of %s files", [("printf", "%d"), ("printf", "%s")]),
        ("%1$s of %2$s", [("printf", "%1$s"), ("printf", "%2$s")]),
        ("You have %n new message(s)", [("printf", "%n")]),
        ("Delete %1 of %2?", [("qt", "%1"), ("qt", "%2")]),
        ("Hello {name}, item {0}", [("brace", "{name}"), ("brace", "{0}")]),
        ("Saved %(count)d files", [("python", "%(count)d")]),
        ("Set $HOME or ${XDG_CONFIG_HOME}", [("shell", "$HOME"), ("shell", "${XDG_CONFIG_HOME}")]),
        ("Fish &amp; chips", [("markup", "&amp;")]),
        ("See https://example.com/a?q=1&b=2.", [("url", "https://example.com/a?q=1&b=2")]),
        ("Mail bugs@example.org now", [("email", "bugs@example.org")]),
        (
            "Edit /etc/apt/sources.list or ~/.config/app",
            [("path", "/etc/apt/sources.list"), ("path", "~/.config/app")],
        ),
        ("Use --no-sandbox or -v, not e-mail - item", [("option", "--no-sandbox"), ("option", "-v")]),
        ("Version 3.3.3 released in 2011", [("number", "3.3.3"), ("number", "2011")]),
        ("Start PulseAudio on GNOME", [("name", "PulseAudio"), ("name", "GNOME")]),
        ("Press Ctrl+S now", [("key", "Ctrl+S")]),
        ("Done 🎉", [("emoji", "🎉")]),
        ("Open ファイル here", [("script", "ファイル")]),
        ("Open\tClose", [("tab", "\t")]),
        ("Save the file", []),
        ("and/or km/h I/O x86 URLs", []),
    ],
)
def test_protected_spans(text, expected):
    assert spans(text) == expected


def test_overlaps_resolve_to_the_outer_span():
    # the tag carries its attribute's placeholder; a URL its digits and path
    assert spans('<a href="%s">Click here</a>') == [("markup", '<a href="%s">'), ("markup", "</a>")]
    assert spans("Go to http://localhost:8080/docs/v2") == [("url", "http://localhost:8080/docs/v2")]
    # placeholders are exactly runtime.tokenizer.find_placeholders' when nothing else overlaps
    text = "<b>%s</b> of {n} (%(x)s, $HOME, %1)"
    assert [t for _, t in spans(text)] == find_placeholders(text)


def test_numbers_compare_across_separators():
    assert check_spans("Copied 1,000 files", "Se copiaron 1.000 archivos").ok is True
    assert check_spans("Version 3.5", "Versión 3,5").ok is True
    assert check_spans("Copied 100 files", "Se copiaron 1000 archivos").ok is False


# --------------------------------------------------------------------------------------------
# Multiset check


def test_check_spans_multiset():
    ok = check_spans("Copy %s to %s", "Copiar %s a %s")
    assert (ok.ok, ok.total, ok.kept, ok.missing, ok.extra) == (True, 2, 2, [], [])
    lost = check_spans("Copy %s to %s", "Copiar %s")
    assert (lost.ok, lost.kept, lost.missing) == (False, 1, ["%s"])
    doubled = check_spans("Open %s", "Abrir %s %s")
    assert (doubled.ok, doubled.kept, doubled.extra) == (False, 1, ["%s"])
    assert check_spans("Save the file", "Guardar el archivo").ok is None  # no spans: not counted
    assert check_spans("Open\tClose", "Abrir Cerrar").missing == ["\t"]
    # extra spans the source does not have are not counted against the output
    assert check_spans("Open %s", "Abrir %s en /tmp").ok is True


# --------------------------------------------------------------------------------------------
# Tags


def test_tag_nesting():
    assert tags_well_formed("Click <b>Apply</b>")
    assert tags_well_formed("<b><i>x</i></b> and <a href='%s'>here</a>")
    assert tags_well_formed("Line<br/>break<br> and none at all")
    assert not tags_well_formed("<b><i>x</b></i>")  # crossed
    assert not tags_well_formed("<b>x")  # unclosed
    assert not tags_well_formed("x</b>")  # closed, never opened
    assert markup_tags("Usage: cmd <file> <dir>") == []  # usage words, not markup
    assert markup_tags("<qt><b>x</b></qt>") == [
        ("open", "qt"),
        ("open", "b"),
        ("close", "b"),
        ("close", "qt"),
    ]


# --------------------------------------------------------------------------------------------
# Sentences and categories


def test_count_sentences():
    assert count_sentences("Save") == 1
    assert count_sentences("Open the file. Save it. Close the window.") == 3
    assert count_sentences("First paragraph here.\n\nSecond paragraph here.") == 2
    assert count_sentences("¿Desea guardar? Los cambios se perderán.", "es") == 2
    assert count_sentences("Open the file. " * 60) == 60
    assert count_sentences("") == 0


def test_categorize():
    assert categorize("Click <b>Apply</b> to save {count} changes.") == ["brace", "markup"]
    assert categorize("Press Ctrl+S to save. The changes will be lost otherwise.") == ["multi_sentence"]
    assert categorize("Firefox could not connect to the proxy server.") == ["name"]
    assert categorize("Firefox") == []  # a bare name is not a name inside a sentence
    assert categorize("Run with --verbose from /usr/bin") == ["path", "option"]
    assert categorize("Open\tClose") == ["tab"]
    assert set(categorize("%s: $HOME %1 %(n)d http://x.org a@b.org 2")) >= {
        "printf", "shell", "qt", "python", "url", "email", "number"
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# Building


def test_clean_heldout_pair_keeps_tabs_and_bug_addresses():
    assert clean_heldout_pair("Open\tClose", "Abrir\tCerrar") == ("Open\tClose", "Abrir\tCerrar")
    assert clean_heldout_pair("Open   the  file", "Abrir   el archivo") == (
        "Open the file",
        "Abrir el archivo",
    )
    report = "Report bugs to <bug-make@gnu.org>"
    assert clean_heldout_pair(report, "Informe de errores a <bug-make@gnu.org>") == (
        report,
        "Informe de errores a <bug-make@gnu.org>",
    )
    credits = clean_heldout_pair("translator-credits", "Juan <juan@example.org>")
    assert credits == "translator credit"
    long_source = "word " * 70  # 350 characters: clean_pair's 250 would drop it
    assert not isinstance(clean_heldout_pair(long_source, "palabra " * 45), str)
    assert clean_heldout_pair("word " * 90, "palabra " * 45) == "too long"


def test_heldout_packages_skip_the_training_top_and_its_families(tmp_path):
    rows = [f"top{i}-data\t{1000 - i}" for i in range(1, 150)] + ["gtk-common\t100"]
    rows += ["libreoffice-l10n-LANG\t5", "top-extra\t4", "libgtk-3-0\t4", "alpha\t3", "beta\t2", "gamma\t1"]
    rows += ["delta\t1"]
    tsv = tmp_path / "list.tsv"
    tsv.write_text("# comment\n" + "\n".join(rows) + "\n")
    chosen = heldout_packages(tsv, every=2, extra=["gamma"])
    names = [p for _, p in chosen]
    # top-extra and libgtk-3-0 share families ("top", "libgtk") with top-150 packages
    assert names == ["libreoffice-l10n-es", "beta", "gamma", "delta"]  # every 2nd of 5, + gamma
    assert all(r > 150 for r, _ in chosen)
    with pytest.raises(SystemExit):
        heldout_packages(tsv, every=2, extra=["top3-data"])


def test_select_balanced_caps_every_category():
    pool = [
        {"source": f"s{i}", "package": f"p{i % 3}", "kinds": kinds}
        for i, kinds in enumerate([["printf"]] * 30 + [["printf", "number"]] * 30 + [["tab"]] * 3)
    ]
    chosen = select_balanced(pool, cap=10, seed=1)
    counts = Counter(k for item in chosen for k in item["kinds"])
    # rarest first: the 3 tabs, then number (filling printf too), then printf is full already
    assert counts == {"tab": 3, "number": 10, "printf": 10}
    assert len({item["source"] for item in chosen}) == len(chosen)
    assert select_balanced(pool, cap=10, seed=1) == chosen  # reproducible
    assert {item["package"] for item in chosen} == {"p0", "p1", "p2"}  # round-robin over packages


# --------------------------------------------------------------------------------------------
# Scoring without a model


SCORED_ITEMS = [
    {"source": "Copy %s to %s. Then quit.", "target": "Copiar %s a %s. Luego salir.", "package": "p",
     "rank": 200, "kinds": ["printf", "multi_sentence"], "seen_in_train": False},
    {"source": "Click <b>Apply</b>", "target": "Pulse <b>Aplicar</b>", "package": "p", "rank": 200,
     "kinds": ["markup"], "seen_in_train": False},
    {"source": "🎉", "target": None, "package": HANDWRITTEN, "rank": None, "kinds": [],
     "seen_in_train": None},
]  # fmt: skip


def write_set(tmp_path: Path, items: list[dict]) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items))
    return path


def test_run_scores_an_identity_system(tmp_path, monkeypatch):
    items = SCORED_ITEMS
    path = write_set(tmp_path, items)

    def identity(args, texts):
        return list(texts), [None] * len(texts), {"backend": "identity"}

    monkeypatch.setattr(faithful, "translate_bundle", identity)
    out = tmp_path / "report.json"
    faithful.main(["run", "--bundle", str(tmp_path), "--set", str(path), "--json", str(out)])
    report = json.loads(out.read_text())
    overall = report["groups"]["overall"]
    assert overall["spans_all_kept"] == 100.0 and overall["spans_kept"] == 100.0
    assert overall["tags_ok"] == 100.0 and overall["fewer_sentences"] == 0.0
    assert report["groups"]["catalog"]["with_reference"] == 2 and overall["bleu"] is not None
    assert [i["output"] for i in report["items"]] == [i["source"] for i in items]
    assert report["items"][0]["sentences"] == {
        "source": 2, "output": 2, "fewer": False, "ratio_to_reference": 0.893, "ratio_to_source": 1.0
    }  # fmt: skip


def test_compare_reports_both_passes_and_the_delta(tmp_path, monkeypatch, capsys):
    path = write_set(tmp_path, SCORED_ITEMS)

    def passes(args, texts):
        lossy = [
            t.replace("%s", "").replace("</b>", "").split(". ")[0] for t in texts
        ]  # spans, tags, a sentence
        return {
            "raw": (lossy, [None] * len(texts), {"backend": "raw", "seconds": 2.0}),
            "text_layer": (list(texts), [None] * len(texts), {"backend": "layer", "seconds": 3.0}),
        }

    monkeypatch.setattr(faithful, "translate_passes", passes)
    out = tmp_path / "report.json"
    faithful.main(["run", "--bundle", str(tmp_path), "--set", str(path), "--compare", "--json", str(out)])
    report = json.loads(out.read_text())
    assert (
        report["raw"]["system"]["backend"] == "raw" and report["text_layer"]["system"]["backend"] == "layer"
    )
    assert [i["output"] for i in report["text_layer"]["items"]] == [i["source"] for i in SCORED_ITEMS]
    catalog = report["delta"]["groups"]["catalog"]
    assert catalog["spans_all_kept"] == {"before": 0.0, "after": 100.0, "change": 100.0}
    assert catalog["tags_ok"] == {"before": 0.0, "after": 100.0, "change": 100.0}
    assert catalog["fewer_sentences"] == {"before": 100.0, "after": 0.0, "change": -100.0}
    assert catalog["bleu"]["after"] > catalog["bleu"]["before"]
    assert report["delta"]["groups"]["handwritten"]["bleu"] == {"before": None, "after": None, "change": None}
    assert set(catalog) == {key for key, _ in faithful.COMPARED}
    assert "url" not in report["delta"]["groups"]  # groups without items are left out
    assert report["delta"]["seconds"]["throughput_cost_percent"] == 50.0
    printed = capsys.readouterr().out
    assert "raw engine (Engine.translate):" in printed and "text layer (Engine.translate_texts):" in printed
    assert "  0.0 \u2192 100.0" in printed and "cost +50.0%" in printed


@pytest.mark.parametrize("extra", [["--target", "localhost:1"], ["--bundle", "x", "--text-layer"]])
def test_compare_needs_a_bundle_and_no_text_layer(extra):
    with pytest.raises(SystemExit):
        faithful.main(["run", "--compare", *extra])


# --------------------------------------------------------------------------------------------
# The committed set


@pytest.fixture(scope="module")
def benchmark_items() -> list[dict]:
    with DEFAULT_SET.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_set_parses_with_every_category(benchmark_items):
    assert DEFAULT_SET.stat().st_size < 300 * 1024
    catalog = [i for i in benchmark_items if i["package"] != HANDWRITTEN]
    assert 350 <= len(catalog) <= 600
    for item in benchmark_items:
        assert set(item) >= {"source", "target", "package", "kinds"}
        assert 0 < len(item["source"]) <= faithful_set.MAX_SOURCE_CHARS or item["package"] == HANDWRITTEN
        assert set(item["kinds"]) <= set(CATEGORIES)
    for item in catalog:
        assert item["kinds"] and item["target"]
        assert item["kinds"] == categorize(item["source"])  # labels match the checker
    counts = Counter(k for item in catalog for k in item["kinds"])
    assert set(counts) == set(CATEGORIES)
    assert max(counts.values()) <= faithful_set.DEFAULT_CAP
    assert any("\n" in i["source"] for i in catalog if "multi_sentence" in i["kinds"])
    assert len({i["source"] for i in benchmark_items}) == len(benchmark_items)  # deduplicated


def test_set_has_the_handwritten_cases(benchmark_items):
    handwritten = [i for i in benchmark_items if i["package"] == HANDWRITTEN]
    assert [i["source"] for i in handwritten] == list(HANDWRITTEN_SOURCES)
    assert all(i["target"] is None for i in handwritten)
    sources = set(HANDWRITTEN_SOURCES)
    for case in ("Open\tClose", "🎉", "ファイルを開く", "%1$s of %2$s", "Save", "11", "3.3.3", "Openbox"):
        assert case in sources
    assert "Open the file. " * 60 in sources
    assert any(count_sentences(s) == 32 for s in sources)


@pytest.mark.skipif(not PACKAGE_LIST.exists(), reason="shared/data/debian-l10n-packages.tsv is not here")
def test_set_holds_no_training_package(benchmark_items):
    ranked = []
    for line in PACKAGE_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name = line.split("\t")[0]
            ranked.append(
                [name.replace("-LANG", f"-{lang}") for lang in ("es", "fr", "de")]
                if "-LANG" in name
                else [name]
            )
    trained = {name for names in ranked[:150] for name in names}
    rank_of = {name: r for r, names in enumerate(ranked, start=1) for name in names}
    assert "libreoffice-l10n-es" in trained
    for item in benchmark_items:
        if item["package"] == HANDWRITTEN:
            continue
        assert item["package"] not in trained, item
        assert rank_of[item["package"]] > 150 and item.get("rank") == rank_of[item["package"]]
