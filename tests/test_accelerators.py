"""Menu accelerators in texts sent one by one (Translate, HTTP /translate): the text layer takes a label's
`_`, `&` or `~` out before the model (trained without them) and puts it back on a letter of the
translation; prose, identifiers and catalogs (whose accelerators runtime.po_catalog handles) keep theirs."""

from __future__ import annotations

import pytest

from client.core import StreamItem
from runtime.decoding import DecodingOptions
from runtime.po_text import lone_accelerator
from server.contract import Hypothesis, SegmentNote
from server.engine import Engine
from server.engine.faithful import _Text, _with_accelerator


@pytest.mark.parametrize(
    ("text", "stripped", "accel"),
    [
        ("_OK", "OK", (0, "_", "O")),
        ("Save _As...", "Save As...", (5, "_", "A")),
        ("E_xit", "Exit", (1, "_", "x")),
        ("Fi&le", "File", (2, "&", "l")),
        ("Mar&k articles as read when they arrive", "Mark articles as read when they arrive", (3, "&", "k")),
        ("~Insert Row", "Insert Row", (0, "~", "I")),
        ('Set window manager "_URGENT" hint', 'Set window manager "URGENT" hint', (20, "_", "U")),
    ],
)
def test_a_labels_accelerator_is_found(text, stripped, accel):
    assert lone_accelerator(text) == (stripped, accel)


@pytest.mark.parametrize(
    "text",
    [
        "max_length",  # an identifier
        "A_eroded-cercle_2",  # two underscores: names, not a label
        "Drag&Drop",  # an ampersand between two words
        "Tom & Jerry",
        "AT&T",
        "~5 minutes",  # not before a letter
        "~/Documents",  # a path
        "America/Costa_Rica",  # a word with a slash: a name
        "&&Save",  # gettext's escaped marker
        "Search &amp; replace",  # an entity
        "Loading the library will create the SF_Array object that can be used to call its methods",
    ],
)
def test_prose_identifiers_and_names_keep_their_characters(text):
    assert lone_accelerator(text) == (text, None)


def test_notes_move_back_to_source_offsets():
    """A note on the stripped text [2, 6) of "Save _As now" (accelerator at 5) covers [2, 7) of the source."""
    note = SegmentNote("repaired", 2, 6, "x")
    label = _Text("Save As now", [], (5, "_", "A"))
    (h,) = _with_accelerator(label, [Hypothesis("Guardar como", -0.1, [3], (note,))])
    # Off the source's first letter, off the translation's (runtime.po_text.place_accelerator).
    assert h.text == "Guardar _como" and h.notes == (SegmentNote("repaired", 2, 7, "x"),)
    (blank,) = _with_accelerator(_Text("OK", [], (0, "_", "O")), [Hypothesis("", 0.0, [])])
    assert blank.text == ""  # nothing to put it on


@pytest.fixture(scope="module")
def engine(shipped_bundle) -> Engine:
    return Engine(shipped_bundle, intra_op_threads=1)


def test_the_shipped_model_translates_labels_with_accelerators(engine):
    """Each label comes back as the translation of the label without its marker, with the marker on one
    of its letters: `_OK` is no longer left untranslated, `Save _As...` no longer half English."""
    labels = ["_OK", "Save _As...", "E_xit", "Open _Recent Files", "&Save", "~Insert Row"]
    with_marker = engine.translate_texts(labels)
    plain = engine.translate_texts([lone_accelerator(t)[0] for t in labels])
    for label, got, want in zip(labels, with_marker, plain, strict=True):
        mark = lone_accelerator(label)[1][1]
        text = got[0].text
        assert text.count(mark) == 1 and text[text.index(mark) + 1].isalpha(), (label, text)
        assert text.replace(mark, "") == want[0].text, (label, text)
    assert with_marker[0][0].text != "_OK"


def test_callers_can_leave_markers_alone(engine):
    options = engine.default_options
    # (a label the translation memory does not hold: `_OK` and `OK` never reach the model)
    prepared = engine.prepare(["Open _Recent Files"], options, accelerators=False)
    assert prepared.segments == ["Open _Recent Files"]
    assert engine.prepare(["Open _Recent Files"], options).segments == ["Open Recent Files"]
    assert engine.prepare(["Drag&Drop"], DecodingOptions(beam_size=1)).segments == ["Drag&Drop"]


def test_the_server_moves_accelerators_for_translate_but_not_for_files(start_fake_server, client_for):
    from client.load import free_port
    from tests.fake_engine import FakeEngine
    from tests.http_helpers import upload

    fake = FakeEngine()
    server = start_fake_server(fake, http_port=free_port())
    client = client_for(server, retries=0)
    client.translate(["_Open it"])
    client.translate(["_Open it"], literal_markers=True)
    items = [StreamItem("a", ["_Open it"]), StreamItem("b", ["_Open it"], literal_markers=True)]
    assert all(r.ok for r in client.translate_stream(items))
    assert fake.accelerators_seen == [True, False, True, False]
    status, _, body = upload(server, "app.pot", 'msgid ""\nmsgstr ""\n\nmsgid "_Open it"\nmsgstr ""\n')
    assert (status, body["filled"]) == (200, 1)
    assert fake.accelerators_seen[4:] == [False]  # the catalog's markers are po_catalog's
