"""Accelerator rules of `python -m client po`: moved to runtime.po_text (shared with the server's
/translate_file); re-exported here."""

from runtime.po_text import *  # noqa: F403
from runtime.po_text import _identifier_underscore  # noqa: F401
