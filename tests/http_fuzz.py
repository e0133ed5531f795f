"""The HTTP half of tests/test_fuzz.py: hypothesis strategies for raw HTTP requests to the
LibreTranslate-compatible API (JSON of every shape, forms, multipart whole and broken, hostile headers,
malformed HTTP, gettext catalogs of every shape), a raw-socket sender, a well-behaved client to run
beside the fuzzer, and the process's resources to compare before and after."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from typing import Any

from hypothesis import strategies as st

TOKEN = "fuzz-token"  # the server's bearer token: clean requests carry it, fuzzed ones may or may not
AUTH = f"Authorization: Bearer {TOKEN}"
VICTIM_TEXTS = ["Open the file", "Delete %1 selected images?", "Could not save the document %s."]
# What a client may get for what it sent; 500 never. 503: the download store is full (Retry-After).
CLIENT_STATUSES = {200, 400, 403, 404, 405, 408, 413, 429, 503, 504}
# Measured after a warm-up: the download store is bounded by the fixture, so what grows past this is a
# leak (1,500 requests grew RSS by 44 MB counting the warm-up, <1 MB per 300 after it).
RSS_SLACK_MB = 24

PATHS = [
    "/translate",
    "/translate",
    "/translate",
    "/translate_file",
    "/translate_file",
    "/languages",
    "/health",
    "/frontend/settings",
    "/download_file/abc/x.po",
    "/",
    "/nowhere",
    "/translate?api_key=x",
    "/translate?q=Save&source=en&target=es&alternatives=1e400",
    "/%ff%fe",
    "/translate?" + "a=b&" * 300,
]
KEYS = ["q", "source", "target", "format", "alternatives", "timeout_ms", "api_key", "file", "x"]

any_text = st.text(max_size=60)  # surrogates included: JSON carries them as \\udXXX escapes
words = st.sampled_from(
    [
        TOKEN,
        "Open the file",
        "Save",
        "<b>Bold</b> text",
        "%s files",
        "",
        " ",
        "en",
        "es",
        "auto",
        "html",
        "text",
        "<script>var a = 'Open';</script>",
        "a" * 300,
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2, 7, 8, -1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    words,
    any_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)  # noqa: E501


@st.composite
def well_formed_json(draw) -> bytes:
    """A request that should translate (so that 200s happen), with the odd bad option."""
    q = draw(st.one_of(words, any_text, st.lists(words, min_size=1, max_size=3)))
    body: Any = {"q": q, "source": draw(st.sampled_from(["en", "auto"])), "target": "es"}
    if draw(st.booleans()):
        body["format"] = draw(st.sampled_from(["text", "html"]))
    if draw(st.booleans()):
        body["alternatives"] = draw(st.sampled_from([0, 1, 2, 3, 7, 8, "2", 2.0, 2.5, 1e400]))
    return json.dumps(body).encode()


@st.composite
def json_bodies(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:  # deep nesting, past any recursion limit sometimes
        depth = draw(st.sampled_from([10, 500, 2_000, 100_000]))
        return b'{"q": ' + b"[" * depth + b"]" * depth + b', "source": "en", "target": "es"}'
    if kind == 1:  # not JSON, or not UTF-8
        return draw(st.binary(max_size=200))
    if kind == 2:
        return draw(well_formed_json())
    body = draw(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6))
    if kind < 6:
        body.setdefault("source", "en")
        body.setdefault("target", "es")
    if kind == 9:
        body = draw(json_values)  # not an object at all
    return json.dumps(body).encode()  # NaN/Infinity as Python writes them, lone surrogates escaped


def form_field(name: str, value: str) -> str:
    return f'Content-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'


@st.composite
def catalogs(draw) -> bytes:
    """gettext catalogs of every shape: headers with any Plural-Forms, plural and context entries,
    broken quoting, truncation, BOMs, other encodings, plain text."""
    nplurals = draw(st.sampled_from(["1", "2", "3", "0", "-1", "x", "", "9" * 5000, "99999999999"]))
    plural = draw(st.sampled_from(["n != 1", "(n", "n%10==1 ? 0 : 1", "x" * 300, "", "n/0"]))
    charset = draw(st.sampled_from(["UTF-8", "utf-8", "ISO-8859-1", "nope", ""]))
    header = (
        f'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset={charset}\\n"\n'
        f'"Plural-Forms: nplurals={nplurals}; plural={plural};\\n"\n\n'
    )
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        msgid = (
            draw(st.one_of(words, any_text)).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        )
        entry = ""
        if draw(st.booleans()):
            entry += f'msgctxt "{draw(words)}"\n'
        entry += f'msgid "{msgid}"\n'
        if draw(st.booleans()):
            entry += f'msgid_plural "{msgid}s"\n' + "".join(
                f'msgstr[{i}] ""\n' for i in range(draw(st.integers(0, 3)))
            )
        else:
            entry += 'msgstr ""\n'
        if draw(st.integers(0, 5)) == 0:
            entry = entry.replace('"', "", 1)  # broken quoting
        entries.append(entry)
    text = (header if draw(st.booleans()) else "") + "\n".join(entries)
    data = text.encode("utf-8", "surrogatepass")
    mutation = draw(st.integers(0, 6))
    if mutation == 0 and data:
        data = data[: draw(st.integers(0, len(data)))]
    elif mutation == 1:
        data = b"\xef\xbb\xbf" + data
    elif mutation == 2:
        data = data + draw(st.binary(max_size=40))
    elif mutation == 3:
        data = "\n".join(draw(st.lists(words, max_size=4))).encode()  # a .txt
    return data


@st.composite
def multipart_bodies(draw, damaged: bool = True) -> tuple[bytes, str]:
    boundary = draw(st.sampled_from(["BB", "----x", "a" * 70, "b" * 200]))
    fields = {"source": "en", "target": "es"}
    fields.update(draw(st.dictionaries(st.sampled_from(KEYS[:7]), words, max_size=3)))
    parts = "".join(f"--{boundary}\r\n" + form_field(k, v) for k, v in fields.items())
    filename = draw(
        st.sampled_from(
            ["messages.po", "x.pot", "a.txt", "../../etc/passwd", "", "x" * 300, "ü.po", 'q"uote.po', "x.exe"]
        )
    )
    body = parts.encode() + (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode("utf-8", "surrogatepass")
    body += draw(catalogs()) + f"\r\n--{boundary}--\r\n".encode()
    content_type = f"multipart/form-data; boundary={boundary}"
    damage = draw(st.integers(0, 7)) if damaged else -1
    if damage == 0:
        body = body[: -len(f"--{boundary}--\r\n")]  # no closing boundary
    elif damage == 1:
        content_type = "multipart/form-data"  # no boundary=
    elif damage == 2:
        body = body.replace(b"Content-Type: application/octet-stream", b"X-Long: " + b"x" * 9000, 1)
    elif damage == 3:
        body = body[: draw(st.integers(0, len(body)))]
    return body, content_type


@st.composite
def http_requests(draw) -> bytes:
    """One raw HTTP/1.1 request (Connection: close), most of them well-framed, some not."""
    clean = draw(st.integers(0, 7))
    if clean < 3:  # a clean request now and then: the fuzz must reach translations too
        if clean < 2:
            path, body, content_type = "/translate", draw(well_formed_json()), "application/json"
        else:
            path, (body, content_type) = "/translate_file", draw(multipart_bodies(damaged=False))
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n{AUTH}\r\n"
        return f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    kind = draw(st.integers(0, 19))
    path = draw(st.sampled_from(PATHS))
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE", "OPTIONS", "HEAD"]))
    headers = ["Host: 127.0.0.1"]
    if draw(st.integers(0, 3)):  # mostly with the token: what lies behind authorization gets fuzzed too
        headers.append(AUTH)
    if kind < 8:
        body, content_type = draw(json_bodies()), "application/json"
    elif kind < 12:
        body, content_type = draw(multipart_bodies())
        path = draw(st.sampled_from(["/translate_file", "/translate_file", "/translate"]))
    elif kind < 15:
        pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(words, any_text)), max_size=6))
        body = "&".join(f"{k}={v}" for k, v in [("source", "en"), ("target", "es"), *pairs]).encode(
            "utf-8", "surrogatepass"
        )
        content_type = "application/x-www-form-urlencoded"
    else:
        body = draw(st.binary(max_size=300))
        content_type = draw(
            st.sampled_from(
                [
                    "text/plain",
                    "application/json; charset=latin1",
                    "",
                    "x/y",
                    "multipart/form-data; boundary=",
                    "application/json\x00",
                ]
            )
        )
    if content_type:
        headers.append(f"Content-Type: {content_type}")
    extra = draw(
        st.lists(
            st.sampled_from(
                [
                    AUTH,
                    AUTH,
                    AUTH + " ",
                    "Authorization: Bearer x",
                    "Authorization: Bearer ",
                    "Authorization: Basic eDp5",
                    "Accept: text/html",
                    "X-Request-Id: " + "r" * 200,
                    "X-Big: " + "b" * 9000,
                    "Bad Header",
                    "Content-Encoding: gzip",
                    "Expect: 100-continue",
                    "Transfer-Encoding: chunked",
                    "Content-Length: -1",
                    "X:\x01\x02",
                ]
            ),
            max_size=2,
        )
    )
    length = len(body)
    framing = draw(st.integers(0, 15))
    if framing == 0:
        length += draw(st.integers(1, 50))  # announces more than it sends: the body timeout
    elif framing == 1:
        length = max(0, length - draw(st.integers(1, 50)))  # the rest reads as a next request
    if "Transfer-Encoding: chunked" in extra:
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if draw(st.booleans()) else body
        headers += extra
    else:
        headers += [*extra, f"Content-Length: {length}"]
    request_line = f"{method} {path} HTTP/1.1"
    if draw(st.integers(0, 30)) == 0:
        request_line = draw(
            st.sampled_from(["GARBAGE", "GET / HTTP/9", "POST /translate HTTP/1.1 x", "\x16\x03\x01\x02\x00"])
        )
    head = "\r\n".join([request_line, *headers, "Connection: close"]) + "\r\n\r\n"
    return head.encode("utf-8", "surrogatepass") + body


def send(port: int, request: bytes, timeout: float = 60.0) -> tuple[int | None, bytes]:
    """(status, body) of the server's first answer to `request` (None: it answered nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered (and closed) before the whole body was sent: read the answer
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:  # 100 Continue: interim
                data = data.partition(b"\r\n\r\n")[2]
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length" and len(rest) >= int(value):
                        return int(head.split(b" ", 2)[1]), rest[: int(value)]
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def victim_answer(port: int) -> list[str] | str:
    body = json.dumps({"q": VICTIM_TEXTS, "source": "en", "target": "es"}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/translate", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["translatedText"]
    except Exception as e:  # recorded: the comparison with the quiet run fails on it
        return f"{type(e).__name__}: {e}"


class HttpVictim(threading.Thread):
    """A well-behaved HTTP client translating the same texts over and over beside the fuzzer."""

    def __init__(self, port: int, want: list[str] | str) -> None:
        super().__init__(daemon=True)
        self.port, self.want = port, want
        self.stop = threading.Event()
        self.answers: list[list[str] | str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            self.answers.append(victim_answer(self.port))


def resources(pid: int) -> dict[str, float]:
    """Open descriptors and RSS (MiB) of process `pid`."""
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_mb": round(rss_kb / 1024, 1)}


def settled_resources(pid: int, start: dict[str, float], wait_s: float = 15.0) -> dict[str, float]:
    """The resources once closing connections have closed (up to `wait_s`)."""
    deadline = time.monotonic() + wait_s
    while True:
        now = resources(pid)
        if now["fds"] <= start["fds"] or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


HEAVY_TEXT = (
    "Could not save the document to the selected folder because the disk is full. "
    "Free some space, or choose another folder, and try again. "
) * 2


def heavy_warmup(port: int) -> None:
    """Two concurrent requests of the largest shapes the fuzz reaches and more (64 long texts, 7
    alternatives: beam 8), so that ONNX Runtime's arenas and the allocator reach their high-water marks
    before the resources are measured: memory kept for a shape seen before is no leak."""
    body = json.dumps(
        {"q": [f"{i} {HEAVY_TEXT}" for i in range(64)], "source": "en", "target": "es", "alternatives": 7}
    ).encode()

    def post() -> None:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/translate", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
