"""Corpus builder: .mo parsing, LibreOffice help alignment, cleaning rules, splitting, line escaping."""

import struct
from pathlib import Path

import polib
import pytest

from model.corpus import (
    MAX_CHARS,
    CatalogEntry,
    Pair,
    align_help_pages,
    catalog_pairs,
    clean_pair,
    dedupe,
    drop_reason,
    escape_line,
    help_paragraphs,
    normalise_whitespace,
    normalised_source,
    package_family,
    parse_mo,
    read_novel,
    read_split,
    split_of,
    split_pairs,
    strip_accelerators,
    unescape_line,
    write_splits,
)

# --------------------------------------------------------------------------------------------
# .mo parsing


def build_mo(tmp_path: Path, entries: list[polib.POEntry], charset: str = "UTF-8") -> bytes:
    po = polib.POFile(encoding=charset.lower())
    po.metadata = {
        "Project-Id-Version": "test 1.0",
        "MIME-Version": "1.0",
        "Content-Type": f"text/plain; charset={charset}",
        "Content-Transfer-Encoding": "8bit",
        "Plural-Forms": "nplurals=2; plural=(n != 1);",
    }
    for entry in entries:
        po.append(entry)
    path = tmp_path / "messages.mo"
    po.save_as_mofile(str(path))
    return path.read_bytes()


def test_parse_mo_contexts_and_plurals(tmp_path):
    data = build_mo(
        tmp_path,
        [
            polib.POEntry(msgid="Open", msgstr="Abrir"),
            polib.POEntry(msgctxt="menu", msgid="Open", msgstr="Abre"),
            polib.POEntry(
                msgid="%d file", msgid_plural="%d files", msgstr_plural={0: "%d archivo", 1: "%d archivos"}
            ),
            polib.POEntry(
                msgctxt="unit",
                msgid="%d byte",
                msgid_plural="%d bytes",
                msgstr_plural={0: "%d byte", 1: "%d bytes"},
            ),
            polib.POEntry(msgid="Line one\nline two", msgstr="Línea uno\nlínea dos"),
        ],
    )
    entries = {(e.msgctxt, e.msgid): e for e in parse_mo(data)}
    assert len(entries) == 5  # the header (msgid "") is not an entry
    assert entries[(None, "Open")].msgstr == ("Abrir",)
    assert entries[("menu", "Open")].msgstr == ("Abre",)
    plural = entries[(None, "%d file")]
    assert plural.msgid_plural == "%d files"
    assert plural.msgstr == ("%d archivo", "%d archivos")
    assert entries[("unit", "%d byte")].msgid_plural == "%d bytes"
    assert entries[(None, "Line one\nline two")].msgstr == ("Línea uno\nlínea dos",)

    pairs = set(catalog_pairs(entries.values()))
    assert ("%d file", "%d archivo") in pairs and ("%d files", "%d archivos") in pairs
    assert ("Open", "Abrir") in pairs and ("Open", "Abre") in pairs
    assert not any("\x04" in s or "\x00" in s for pair in pairs for s in pair)


def test_parse_mo_non_utf8_charset(tmp_path):
    data = build_mo(tmp_path, [polib.POEntry(msgid="Year", msgstr="Año")], charset="ISO-8859-1")
    assert b"A\xf1o" in data  # really Latin-1 on disk
    (entry,) = parse_mo(data)
    assert entry.msgstr == ("Año",)


def test_parse_mo_big_endian_and_garbage(tmp_path):
    data = build_mo(tmp_path, [polib.POEntry(msgid="Close", msgstr="Cerrar")])
    # Re-pack as big-endian: same layout, every 32-bit header/table field byte-swapped.
    count, orig, trans = struct.unpack("<3I", data[8:20])
    header = struct.pack(">5I", 0x950412DE, 0, count, orig, trans) + data[20:orig]
    tables = b"".join(
        struct.pack(">2I", *struct.unpack_from("<2I", data, offset + 8 * i))
        for offset in (orig, trans)
        for i in range(count)
    )
    big = header + tables + data[orig + len(tables) :]
    assert [(e.msgid, e.msgstr) for e in parse_mo(big)] == [("Close", ("Cerrar",))]
    with pytest.raises(ValueError):
        parse_mo(b"not a catalog at all, just text")
    with pytest.raises(ValueError):
        parse_mo(b"\x00" * 8)


def test_catalog_pairs_skip_untranslated():
    entries = [
        CatalogEntry("Save", ("",)),
        CatalogEntry("%d item", ("%d elemento", ""), msgid_plural="%d items"),
        CatalogEntry("Quit", ("Salir",)),
    ]
    assert list(catalog_pairs(entries)) == [("%d item", "%d elemento"), ("Quit", "Salir")]


# --------------------------------------------------------------------------------------------
# Cleaning


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        ("", "Abrir", "empty"),
        ("Open", "", "empty"),
        ("   ", "Abrir", "empty"),
        ("Hello", "Hello", "source == target"),
        ("GNOME", "GNOME", "source == target"),
        ("%s: %d", "%s : %d", "pure placeholder"),
        ("{0} {1}", "{1} {0}", "pure placeholder"),
        ("<b>%s</b>", "<b> %s </b>", "pure placeholder"),
        ("a" * (MAX_CHARS + 1), "b" * 10, "too long"),
        ("Short", "c" * (MAX_CHARS + 1), "too long"),
        ("translator-credits", "Juan Pérez", "translator credit"),
        ("Translators", "Traductores", "translator credit"),
        ("Your names", "Juan", "translator credit"),
        ("Credits", "Juan Pérez <juan@example.org>, Ana <ana@example.org>", "translator credit"),
        ("image;picture;photo;", "imagen;foto;fotografía;", "keyword list"),
        ("OK", "Aceptar, pero esto es claramente otra frase mucho más larga", "length ratio"),
        ("Hello world", "123 456", "no letters in target"),
        ("Hello", "Hola\ufffd", "bad encoding"),
    ],
)
def test_drop_reasons(source, target, reason):
    assert clean_pair(source, target) == reason


def test_kept_pairs():
    assert drop_reason("Open a file", "Abrir un archivo") is None
    assert clean_pair("Save %s as %d", "Guardar %s como %d") == ("Save %s as %d", "Guardar %s como %d")
    assert clean_pair("A" * MAX_CHARS, "B" * MAX_CHARS) == ("A" * MAX_CHARS, "B" * MAX_CHARS)


def test_whitespace_normalisation():
    assert normalise_whitespace("  Open   the\t\tfile  ") == "Open the file"
    assert normalise_whitespace("\nLine one  \n   line two\n") == "Line one\nline two"
    assert clean_pair("  Open  file ", "Abrir   archivo\t") == ("Open file", "Abrir archivo")
    # newlines inside a message are kept
    assert clean_pair("First line\nSecond line", "Primera línea\nSegunda línea") == (
        "First line\nSecond line",
        "Primera línea\nSegunda línea",
    )


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("_File", "_Archivo", ("File", "Archivo")),
        ("&File", "&Archivo", ("File", "Archivo")),
        ("~File", "~Archivo", ("File", "Archivo")),
        ("Save _As…", "Guardar _como…", ("Save As…", "Guardar como…")),
        ("Pr_eferences", "Prefere_ncias", ("Preferences", "Preferencias")),
        ("_Quit", "Salir", ("Quit", "Salir")),  # translator dropped the accelerator
        ("Use &amp; here", "Use &amp; aquí", ("Use &amp; here", "Use &amp; aquí")),  # entity, not a marker
        ("Rename my_file_name", "Renombrar my_file_name", ("Rename my_file_name", "Renombrar my_file_name")),
        ("a_b_c", "x_y_z", ("a_b_c", "x_y_z")),
    ],
)
def test_strip_accelerators(source, target, expected):
    assert strip_accelerators(source, target) == expected


def test_accelerators_stripped_consistently_in_clean_pair():
    for mark in "_&~":
        assert clean_pair(f"{mark}Open File", f"{mark}Abrir archivo") == ("Open File", "Abrir archivo")
    # a mark not followed by a word character is text
    assert clean_pair("Tom & Jerry", "Tom y Jerry") == ("Tom & Jerry", "Tom y Jerry")
    assert clean_pair("Size ~ 5 MB", "Tamaño ~ 5 MB") == ("Size ~ 5 MB", "Tamaño ~ 5 MB")


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("Open file_name", "Abrir file_name"),
        ("Set the NO_PROXY variable", "Defina la variable NO_PROXY"),
    ],
)
def test_single_underscore_identifiers_survive(source, target):
    assert clean_pair(source, target) == (source, target)


def test_normalised_source():
    assert normalised_source("Open  the File!") == normalised_source("open the file")
    assert normalised_source("Save %s…") == "save s"


# --------------------------------------------------------------------------------------------
# Dedupe, families, splits


def pair(source: str, target: str = "x", package: str = "pkg") -> Pair:
    return Pair(source, target, package, "1.0", "test.mo")


def test_dedupe_keeps_first_of_identical_pairs_and_lists_their_packages():
    pairs = [pair("Open", "Abrir", "a"), pair("Open", "Abrir", "b"), pair("Open", "Abre", "a")]
    unique = dedupe(pairs)
    assert [(p.source, p.target, p.package, p.packages) for p in unique] == [
        ("Open", "Abrir", "a", ("a", "b")),
        ("Open", "Abre", "a", ("a",)),
    ]


@pytest.mark.parametrize(
    "group",
    [
        ["gcc-12-locales", "cpp-12", "gcc", "cpp"],
        ["libgtk-3-common", "libgtk2.0-common", "libgtk-4-common", "libgtk2.0-0"],
        ["postgresql-15", "postgresql-client-15", "postgresql-common"],
        ["wesnoth-1.16-data", "wesnoth-1.16-music", "wesnoth-core"],
        ["libreoffice-l10n-es", "libreoffice-help-es", "libreoffice-help-en-us"],
    ],
)
def test_package_family_groups(group):
    assert len({package_family(p) for p in group}) == 1


def test_package_family_separates_unrelated():
    families = {package_family(p) for p in ["gcc-12", "gimp", "gnome-shell", "glib2.0-data", "libgtk-3-0"]}
    assert len(families) == 5
    assert split_of("libreoffice") == "train"  # pinned


def _family_in(split: str) -> str:
    """A made-up family name (letters only, so package_family keeps it whole) that hashes to `split`."""
    for i in range(10_000):
        name = "fam" + "".join(chr(ord("a") + int(d)) for d in str(i))
        if split_of(name) == split:
            return name
    raise AssertionError(f"no family hashes to {split}")


def test_split_keeps_every_train_pair_and_labels_novel_held_out_pairs():
    train_fam, valid_fam, test_fam = _family_in("train"), _family_in("valid"), _family_in("test")
    pairs = [
        pair("Open the file", "Abrir el archivo", f"{train_fam}-data"),
        pair("open the FILE!", "Abre el archivo", f"{train_fam}-common"),  # same normalised source as test
        pair("Quit", "Salir", f"{train_fam}-data"),
        pair("Help", "Ayuda", f"{train_fam}-utils"),  # same normalised source as valid
        pair("Save", "Guardar", f"{train_fam}-utils"),
        pair("Open the file", "Abrir archivo", f"{test_fam}-common"),
        pair("Close", "Cerrar", f"{test_fam}2.0-data"),
        pair("Save", "Guardar", f"{test_fam}-common"),  # the same pair on both sides stays on both
        pair("help", "ayuda", f"{valid_fam}-5"),
        pair("Close", "Cierra", f"{valid_fam}-common"),  # valid shares a source with test: dropped
        pair("Print", "Imprimir", valid_fam),
    ]
    splits = split_pairs(pairs)
    families = {name: {package_family(p.package) for p in ps} for name, ps in splits.items()}
    assert families == {"train": {train_fam}, "valid": {valid_fam}, "test": {test_fam}}
    # common strings stay in train, whatever the held-out side holds
    assert [p.source for p in splits["train"]] == ["Open the file", "open the FILE!", "Quit", "Help", "Save"]
    assert [(p.source, p.novel) for p in splits["valid"]] == [("help", False), ("Print", True)]
    assert [(p.source, p.novel) for p in splits["test"]] == [
        ("Open the file", False),
        ("Close", True),
        ("Save", False),
    ]
    # "novel" really is novel: no novel held-out source occurs in train
    train_sources = {normalised_source(p.source) for p in splits["train"]}
    novel = [p for name in ("valid", "test") for p in splits[name] if p.novel]
    assert novel and not {normalised_source(p.source) for p in novel} & train_sources
    assert all(p.novel is None for p in splits["train"])


def test_read_novel_round_trips_through_jsonl(tmp_path):
    train_fam, test_fam = _family_in("train"), _family_in("test")
    pairs = [pair("Quit", "Salir", train_fam), pair("Quit", "Salir", test_fam), pair("Zoom", "Zum", test_fam)]
    splits = split_pairs(pairs)
    write_splits(tmp_path, splits)
    assert read_novel(tmp_path, "test") == [False, True]


# --------------------------------------------------------------------------------------------
# LibreOffice help


EN_PAGE = """<html><body>
<h1 id="hd_id3150445">Insert <span class="emph">Table</span></h1>
<p id="par_id3147000" class="paragraph">Inserts a table &amp; its
   caption.</p>
<p id="par_id3150010">Only in English.</p>
<table><tr><td id="par_id3153000"><p>Cell</p> text</td></tr></table>
<p id="other_id1">Not a paragraph id.</p>
<p>No id at all.</p>
</body></html>"""

ES_PAGE = """<html><body>
<h1 id="hd_id3150445">Insertar <span class="emph">tabla</span></h1>
<p id="par_id3147000" class="paragraph">Inserta una tabla y su leyenda.</p>
<td id="par_id3153000">Texto de la celda</td>
<p id="par_id9999999">Solo en español.</p>
<p id="other_id1">No es un párrafo.</p>
</body></html>"""


def test_help_paragraphs():
    paragraphs = help_paragraphs(EN_PAGE)
    assert paragraphs["hd_id3150445"] == "Insert Table"
    assert paragraphs["par_id3147000"] == "Inserts a table & its caption."
    assert "other_id1" not in paragraphs


def test_align_help_pages_by_id():
    aligned = sorted(
        align_help_pages(
            {"text/swriter/table.html": EN_PAGE, "text/only-en.html": EN_PAGE},
            {"text/swriter/table.html": ES_PAGE},
        )
    )
    assert {page for page, _, _ in aligned} == {"text/swriter/table.html"}
    pairs = {(en, es) for _, en, es in aligned}
    assert ("Insert Table", "Insertar tabla") in pairs
    assert ("Inserts a table & its caption.", "Inserta una tabla y su leyenda.") in pairs
    assert not any("Only in English" in en or "Solo en español" in es for en, es in pairs)
    assert not any("Not a paragraph" in en for en, _ in pairs)


# --------------------------------------------------------------------------------------------
# Line escaping


LINES = [
    "plain",
    "two\nlines",
    "trailing newline\n",
    "\n",
    "back\\slash",
    "literal backslash-n: \\n",
    "both \\\nmixed \\\\n \n\\",
    "C:\\new\\table",
    "",
    "tab\tand ünïcödé 😀",
]


@pytest.mark.parametrize("text", LINES)
def test_escape_round_trip(text):
    escaped = escape_line(text)
    assert "\n" not in escaped
    assert unescape_line(escaped) == text


def test_write_and_read_split_round_trip(tmp_path):
    pairs = [Pair(text, text[::-1] + "es", "pkg", "1", "o.mo") for text in LINES]
    write_splits(tmp_path, {"test": pairs})
    assert read_split(tmp_path, "test") == [(p.source, p.target) for p in pairs]
    assert len((tmp_path / "test.en").read_text(encoding="utf-8").split("\n")) == len(pairs) + 1
    assert len((tmp_path / "test.jsonl").read_text(encoding="utf-8").splitlines()) == len(pairs)


def test_calligra_suite_is_one_family() -> None:
    families = {package_family(p) for p in ("calligra-data", "calligrasheets-data", "calligraplan")}
    assert families == {"calligra"}


def test_double_ampersand_is_left_alone() -> None:
    assert strip_accelerators("make && make install", "make && make install") == (
        "make && make install",
        "make && make install",
    )


def test_carriage_return_round_trips_through_a_line() -> None:
    text = "a\r\nb\\n"
    assert "\r" not in escape_line(text) and unescape_line(escape_line(text)) == text
