"""HTTP requests to a test server's HTTP port (the LibreTranslate-compatible API), shared by the tests
of the HTTP transport over the fake engine and over the shipped model."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any


def url(server: Any, path: str = "") -> str:
    """Address of `path` on a RunningServer's HTTP port."""
    return f"http://127.0.0.1:{server.server.http_port}/{path.lstrip('/')}"


def call(server: Any, path: str, body=None, *, form: bool = False, headers=None, method=None):
    """(status, headers, parsed JSON or text) of one HTTP request: `body` as JSON, as a form (`form`),
    or as the bytes given."""
    data, headers = None, dict(headers or {})
    if body is not None:
        if isinstance(body, bytes):
            data = body
        elif form:
            data = urllib.parse.urlencode(body, doseq=True).encode()
        else:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(url(server, path), data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, h, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, h, raw = e.code, e.headers, e.read()
    try:
        return status, h, json.loads(raw)
    except ValueError:
        return status, h, raw.decode()


def upload(server: Any, name: str, content: str | bytes, **fields):
    """POST /translate_file as multipart/form-data (what LibreTranslate's clients send), `content` as
    the file (str: UTF-8): (status, headers, parsed JSON or text)."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in {"source": "en", "target": "es", **fields}.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    data = content.encode() if isinstance(content, str) else content
    body = "".join(parts).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return call(
        server, "translate_file", body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
