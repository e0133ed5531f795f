"""Rules about gettext catalogs shared by the corpus builder (model.corpus) and the catalog translator
(client.po): accelerator markers and the pseudo-messages that hold translator credits, not text."""

from __future__ import annotations

__all__ = ["ACCELERATOR_MARKERS", "CREDIT_MSGIDS"]

ACCELERATOR_MARKERS = "_&~"  # GTK, Qt/KDE, LibreOffice
CREDIT_MSGIDS = frozenset(
    {
        "translator-credits",
        "translator_credits",
        "translator credits",
        "translators",
        "your names",
        "your emails",
        "name of translators",
        "email of translators",
        "roles_of_translators",
        "credit_for_translators",
        "translated by",
    }
)
