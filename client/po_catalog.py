"""Catalog side of `python -m client po`: moved to runtime.po_catalog (transport-independent, so the
server's /translate_file fills catalogs with the same code); re-exported here."""

from runtime.po_catalog import *  # noqa: F403
from runtime.po_catalog import _FIELDS  # noqa: F401
