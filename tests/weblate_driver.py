"""Weblate's own LibreTranslate machinery against a server, in Weblate's Python (tests/test_weblate.py runs
this file with the interpreter that has `weblate` installed: it is not imported by the test suite, whose
environment Weblate's pinned dependencies would downgrade).

    python tests/weblate_driver.py PLAN.json  ->  one JSON object on stdout

PLAN: {"url": "http://127.0.0.1:PORT/", "key": "", "validate": true,
       "units": [{"source": "Delete %d files?", "flags": "c-format"}, ...]}
Needs DJANGO_SETTINGS_MODULE (a settings module the test writes: Weblate's example settings with an
in-memory sqlite database and a local-memory cache). The units are Weblate's own test double
(weblate.checks.tests.test_checks.MockUnit, what Weblate's machinery tests use) and are all asked for
suggestions at once, each from its own thread and machinery object, as concurrent editors would; the
rate-limit mark lives in the shared cache, as in Weblate.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import django


def main(plan_path: str) -> dict:
    django.setup()
    from django.core.exceptions import ValidationError
    from weblate.checks.tests.test_checks import MockUnit
    from weblate.machinery.base import MachineTranslationError
    from weblate.machinery.libretranslate import LibreTranslateTranslation

    plan = json.loads(open(plan_path, encoding="utf-8").read())
    settings = {"url": plan["url"], "key": plan.get("key", "")}
    machine = LibreTranslateTranslation(settings)
    machine.delete_cache()  # the rate-limit mark and the language list
    out: dict = {"weblate": django.get_version(), "languages": machine.download_languages()}
    if plan.get("validate"):
        try:
            machine.validate_settings()
            out["validate"] = "ok"
        except ValidationError as e:
            out["validate"] = " ".join(e.messages)

    def suggest(unit: dict) -> dict:
        started = time.monotonic()
        try:
            found = LibreTranslateTranslation(settings).translate(
                MockUnit(code=unit.get("target", "es"), source=unit["source"], flags=unit.get("flags", ""))
            )
            texts = [item["text"] for plural in found for item in plural]
            return {"suggestions": texts, "seconds": round(time.monotonic() - started, 3)}
        except MachineTranslationError as e:
            return {"error": str(e), "seconds": round(time.monotonic() - started, 3)}

    units = plan.get("units", [])
    if units:
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            out["units"] = list(pool.map(suggest, units))
    out["rate_limited"] = bool(machine.is_rate_limited())
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
