"""The server's log format (server/logs.py): one JSON object per line on stderr, as docs/service.md
("Logs") describes it, for log shippers to parse."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from server.logs import JsonFormatter, setup_logging


@pytest.fixture()
def root_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_one_json_object_per_line_with_the_fields(root_logging, capsys):
    setup_logging("INFO")
    log = logging.getLogger("server.requests")
    log.debug("not at INFO")
    log.info("request", extra={"fields": {"id": "r-1", "rpc": "Translate", "ms": 12.5, "where": Path("/x")}})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("server").error("¿Guardar el año? %s", "ñ", exc_info=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    request, error = map(json.loads, lines)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", request["ts"])
    assert {k: v for k, v in request.items() if k != "ts"} == {
        "level": "INFO",
        "logger": "server.requests",
        "msg": "request",
        "id": "r-1",
        "rpc": "Translate",
        "ms": 12.5,
        "where": "/x",  # a field JSON cannot hold is written as text, not lost with the line
    }
    assert (error["level"], error["logger"], error["msg"]) == ("ERROR", "server", "¿Guardar el año? ñ")
    assert error["exc"].startswith("Traceback") and error["exc"].endswith("RuntimeError: boom")
    assert "¿Guardar el año?" in lines[1]  # UTF-8 as it is, not \\u escapes


def test_the_level_is_the_setting(root_logging, capsys):
    setup_logging("WARNING")
    logging.getLogger("server").info("hidden")
    logging.getLogger("server").warning("shown")
    assert [json.loads(line)["msg"] for line in capsys.readouterr().err.splitlines()] == ["shown"]
    assert len(logging.getLogger().handlers) == 1  # replaces what was there: no line twice


def test_a_record_without_fields_is_plain():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %d", (3,), None)
    record.fields = "not a dict"
    assert json.loads(JsonFormatter().format(record))["msg"] == "hello 3"
