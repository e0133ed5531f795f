"""/translate_file and /download_file against hostile clients (issue 33, the file half): uploads are
content and never paths, a catalog cannot buy unbounded work, file work stays off the event loop and dies
with its request or the server, the download store keeps everyone's links, names cannot inject headers,
and files leave most of the queue to other clients. Over the fake engine; msgfmt is the real one unless a
test puts a stand-in first on PATH."""

from __future__ import annotations

import email.message
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.parse
import uuid
from pathlib import Path

import pytest

from client import po as po_cli
from client.load import free_port
from runtime.po_catalog import CatalogError, read_catalog
from server.config import load_config
from tests.fake_engine import FakeEngine
from tests.http_helpers import call, upload

HEADER = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n"Language: es\\n"\n'
CATALOG = HEADER + '\nmsgid "Open the file"\nmsgstr ""\n'


@pytest.fixture()
def http(start_fake_server):
    return lambda engine=None, **config: start_fake_server(engine, http_port=free_port(), **config)


def download(server, body: dict):
    return call(server, urllib.parse.urlparse(body["translatedFileUrl"]).path)


def raw_upload(server, disposition: str, content: bytes, headers: dict | None = None):
    """POST /translate_file with the file part's Content-Disposition parameters as given."""
    boundary = uuid.uuid4().hex
    body = b"".join(
        [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in (("source", "en"), ("target", "es"))
        ]
        + [
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; {disposition}\r\n'.encode(),
            b"Content-Type: application/octet-stream\r\n\r\n" + content + f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", **(headers or {})}
    return call(server, "translate_file", body, headers=headers)


@pytest.fixture()
def slow_msgfmt(tmp_path, monkeypatch):
    """A `msgfmt` first on PATH that records its pid and sleeps a minute; returns the pid list's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "msgfmt"
    script.write_text('#!/bin/sh\necho $$ >> "$FAKE_MSGFMT_PIDS"\nexec sleep 60\n')
    script.chmod(0o755)
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_MSGFMT_PIDS", str(pids))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return pids


def started_pids(pids: Path, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pids.exists() and pids.read_text().strip():
            return [int(p) for p in pids.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the stand-in msgfmt never started")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: only its parent has not reaped it yet.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


# ---- 1. an upload is content, never a path -----------------------------------------------------------


def test_an_upload_naming_a_server_file_is_read_as_its_text(http, tmp_path):
    secret = tmp_path / "secret.po"
    secret.write_text(HEADER + '\nmsgid "server secret"\nmsgstr ""\n')
    server = http()
    status, _, body = upload(server, "app.po", str(secret))
    assert status == 400, body
    assert (
        "not a readable gettext catalog" in body["error"] and "secret" not in body["error"].split(":", 1)[1]
    )
    # The same answer whether the path exists or not: no existence oracle.
    status2, _, body2 = upload(server, "app.po", str(tmp_path / "missing.po"))
    assert status2 == 400
    assert body["error"].split("line")[0] == body2["error"].split("line")[0]
    for content in (str(secret), str(secret).encode()):
        with pytest.raises(CatalogError):
            read_catalog(content, "stdin")


def test_client_po_reads_stdin_as_a_catalog_not_a_path(start_fake_server, tmp_path, capsys, monkeypatch):
    secret = tmp_path / "secret.po"
    secret.write_text(CATALOG)
    server = start_fake_server()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(str(secret).encode())))
    capsys.readouterr()
    rc = po_cli.main(["-", "--target", server.target, "--no-progress", "--wait-s", "0"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "not a readable gettext catalog" in err


# ---- 2. bounded work per catalog ---------------------------------------------------------------------


@pytest.mark.parametrize("n", ["20000", "9" * 5000, "0"])
def test_plural_forms_no_language_has_are_refused(http, n):
    pot = HEADER.replace('"Language', f'"Plural-Forms: nplurals={n}; plural=n;\\n"\n"Language')
    pot += '\nmsgid "one file"\nmsgid_plural "%d files"\nmsgstr[0] ""\nmsgstr[1] ""\n'
    started = time.monotonic()
    status, _, body = upload(http(), "app.po", pot)
    assert status == 400, body
    assert (
        "Plural-Forms declares nplurals=" in body["error"] and "Spanish has 2 plural forms" in body["error"]
    )
    assert len(body["error"]) < 400 and time.monotonic() - started < 10


def test_entries_and_output_over_the_limits_are_refused(http):
    server = http(file_max_entries=3, file_max_output_bytes=300)
    pot = HEADER + "".join(f'\nmsgid "entry {i}"\nmsgstr ""\n' for i in range(4))
    status, _, body = upload(server, "app.pot", pot)
    assert status == 400 and "entries, more than the 3" in body["error"]
    status, _, body = upload(server, "notes.txt", "open the file\n" * 30)
    assert status == 400 and "over 300 bytes" in body["error"]


def test_a_msgfmt_run_past_its_timeout_is_killed(http, slow_msgfmt):
    server = http(file_check_timeout_s=1)
    started = time.monotonic()
    status, _, body = upload(server, "app.po", CATALOG)
    assert status == 504 and "msgfmt took more than 1 s" in body["error"]
    assert time.monotonic() - started < 15
    assert all(wait_dead(pid) for pid in started_pids(slow_msgfmt))


def test_a_client_that_hangs_up_kills_its_msgfmt(http, slow_msgfmt):
    server = http(file_check_timeout_s=120)
    boundary = uuid.uuid4().hex
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="app.po"\r\n\r\n'
    body = (part + CATALOG + f"\r\n--{boundary}--\r\n").encode()
    head = (
        f"POST /translate_file?source=en&target=es HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=10) as s:
        s.sendall(head.encode() + body)
        (pid,) = started_pids(slow_msgfmt)
    assert wait_dead(pid), "msgfmt outlived the request that started it"


def test_the_runner_kills_on_timeout_and_on_cancel():
    from runtime import subprocess_run

    started = time.monotonic()
    with pytest.raises(subprocess_run.SubprocessTimeout):
        subprocess_run.run(["sleep", "30"], timeout_s=0.3)
    cancel = subprocess_run.Cancellation()
    threading.Timer(0.3, cancel.cancel).start()
    with pytest.raises(subprocess_run.SubprocessCancelled):
        subprocess_run.run(["sh", "-c", "sleep 30; sleep 30"], timeout_s=60, cancel=cancel)
    assert time.monotonic() - started < 10
    with pytest.raises(subprocess_run.SubprocessCancelled):  # cancelled before: never started
        subprocess_run.run(["true"], timeout_s=5, cancel=cancel)


# ---- 4. file work off the event loop -----------------------------------------------------------------


def test_catalog_work_runs_in_the_file_workers(http, monkeypatch):
    import server.files as files

    threads: dict[str, set[str]] = {}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return real(*args, **kwargs)

        monkeypatch.setattr(files, name, wrapper)

    for name in ("read_catalog", "plan", "fill", "write_checked"):
        spy(name, getattr(files, name))
    status, _, body = upload(http(), "app.pot", CATALOG)
    assert status == 200, body
    assert set(threads) == {"read_catalog", "plan", "fill", "write_checked"}
    assert all(t.startswith("file-work") for names in threads.values() for t in names), threads


# ---- 6. a stop kills the file work -------------------------------------------------------------------


def test_a_stop_during_a_file_check_ends_it(http, slow_msgfmt):
    server = http(file_check_timeout_s=120, shutdown_grace_s=1)

    def send() -> None:
        try:
            upload(server, "app.po", CATALOG)
        except OSError:  # the stop closes the connection: what the client sees is not the point here
            pass

    client = threading.Thread(target=send, daemon=True)
    client.start()
    (pid,) = started_pids(slow_msgfmt)
    started = time.monotonic()
    server.stop(1)
    assert time.monotonic() - started < 8
    assert wait_dead(pid, 5), "msgfmt outlived the server's stop"
    deadline = time.monotonic() + 5
    while any(t.name.startswith("file-work") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name.startswith("file-work") for t in threading.enumerate())
    client.join(10)


SERVE_WITH_FAKE_ENGINE = """
import sys
import server.app
from tests.fake_engine import FakeEngine
server.app.default_engine_factory = lambda bundle_dir, config: FakeEngine(step_s=0)
from server.__main__ import exit_with, main
exit_with(main(sys.argv[1:]))
"""


def test_sigterm_during_a_file_check_exits_within_the_grace_period(slow_msgfmt, tmp_path):
    """python -m server as Kubernetes stops it: SIGTERM while msgfmt checks an upload. It used to log
    "stopped" and live until msgfmt ended (asyncio.run waited for the default executor)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}\n")
    port = free_port()
    args = ["--model-dir", str(bundle), "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1"]
    args += ["--http-port", str(port), "--no-warmup", "--shutdown-grace-s", "2", "--log-level", "WARNING"]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_FAKE_ENGINE, *args],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        server = types.SimpleNamespace(server=types.SimpleNamespace(http_port=port))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if call(server, "health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)

        def send() -> None:
            try:
                upload(server, "app.po", CATALOG)
            except OSError:
                pass

        threading.Thread(target=send, daemon=True).start()
        (pid,) = started_pids(slow_msgfmt)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        assert (code, time.monotonic() - started < 2 + 6) == (0, True)
        assert wait_dead(pid, 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()


# ---- 7. the download store ---------------------------------------------------------------------------


def test_uploads_never_evict_a_kept_file(http):
    server = http()
    status, _, first = upload(server, "mine.txt", "Open it\n")
    assert status == 200
    for i in range(70):
        assert upload(server, f"empty{i}.txt", b"")[0] == 200
    assert download(server, first)[0] == 200


def test_a_full_store_refuses_new_files_with_retry_after(http):
    server = http(download_store_bytes=2 * 1024 + 100)
    status, _, first = upload(server, "a.txt", "Open it\n")
    assert status == 200 and upload(server, "b.txt", "Save it\n")[0] == 200
    status, headers, body = upload(server, "c.txt", "Close it\n")
    assert status == 503 and int(headers["Retry-After"]) >= 1 and "retry in" in body["error"]
    assert download(server, first)[0] == 200


def test_expired_files_leave_without_another_upload(http):
    server = http(download_ttl_s=0.3)
    status, _, body = upload(server, "a.txt", "Open it\n")
    assert status == 200 and len(server.server.http.files) == 1
    time.sleep(1.0)
    assert len(server.server.http.files) == 0
    assert download(server, body)[0] == 404


def test_the_store_counts_bytes_and_expires_by_time():
    from server.files import DownloadStore, StoreFull

    now = [0.0]
    store = DownloadStore(max_bytes=3000, ttl_s=10, clock=lambda: now[0])
    kept = store.put("a.po", b"x" * 900)
    with pytest.raises(StoreFull) as full:
        store.put("b.po", b"x" * 1200)
    assert full.value.retry_after_s == 10
    assert store.get(kept) == ("a.po", b"x" * 900)
    now[0] = 10.5
    assert store.get(kept) is None and store.used == 0
    store.put("b.po", b"x" * 1200)


# ---- 8. names ----------------------------------------------------------------------------------------


def test_control_characters_in_a_name_cannot_break_the_download(http):
    server = http()
    status, _, body = raw_upload(server, "filename*=UTF-8''a%0D%0AX-Evil%3A%201%00b.txt", b"Open it\n")
    assert status == 200, body
    got, headers, text = download(server, body)
    assert got == 200 and text == "it Open\n" and "X-Evil" not in headers
    assert not any(c in headers["Content-Disposition"] for c in "\r\n\0")


def test_a_quote_in_a_name_cannot_add_parameters(http):
    server = http()
    name = "x\"; filename*=UTF-8''evil.html; a=\".txt"
    hostile = "filename*=UTF-8''" + urllib.parse.quote(name, safe="")
    status, _, body = raw_upload(server, hostile, b"Open it\n")
    assert status == 200, body
    _, headers, _ = download(server, body)
    message = email.message.Message()
    message["Content-Disposition"] = headers["Content-Disposition"]
    params = message.get_params(header="Content-Disposition")
    # email decodes filename* (RFC 2231) as a second "filename": attachment and the two names, no other.
    assert [k for k, _ in params] == ["attachment", "filename", "filename"], params
    assert message.get_filename().endswith(".es.txt") and "html" not in message.get_filename()[-8:]


def test_the_link_is_percent_encoded_and_not_from_the_host_header(http):
    server = http()
    status, _, body = upload(server, "100%.po", CATALOG)
    assert status == 200
    link = body["translatedFileUrl"]
    assert link.startswith("/download_file/") and link.endswith("/100%25.po")
    got, headers, _ = call(server, link)
    assert got == 200 and headers["Content-Disposition"].endswith("filename*=UTF-8''100%25.po")
    status, _, body = raw_upload(server, 'filename="a.txt"', b"Open it\n", {"Host": "evil.example"})
    assert status == 200 and body["translatedFileUrl"].startswith("/download_file/")
    public = http(http_public_url="https://tr.example.org/api/")
    status, _, body = upload(public, "a b.po", CATALOG)
    assert body["translatedFileUrl"].startswith("https://tr.example.org/api/download_file/")
    assert body["translatedFileUrl"].endswith("/a%20b.po")


def test_suffixes_are_case_insensitive(http):
    server = http()
    status, _, body = upload(server, "APP.PO", CATALOG)
    assert status == 200 and body["translatedFileUrl"].endswith("/APP.po")
    _, headers, _ = download(server, body)
    assert headers["Content-Type"].startswith("text/x-gettext-translation")


def test_names_are_sanitized():
    from server.files import content_disposition, safe_name

    assert safe_name("../../etc/passwd.po") == "passwd.po"
    assert safe_name("C:\\Users\\me\\app.po") == "app.po"
    assert safe_name('a"b\r\n\0c.po') == "abc.po"
    assert safe_name("..") == ""
    assert len(safe_name("x" * 500 + ".po")) <= 120 and safe_name("x" * 500 + ".po").endswith(".po")
    header = content_disposition("café 100%.po")
    assert header == "attachment; filename=\"caf_ 100_.po\"; filename*=UTF-8''caf%C3%A9%20100%25.po"


def test_the_page_decodes_the_name_safely():
    page = (Path(__file__).resolve().parent.parent / "server" / "web" / "index.html").read_text()
    assert "decodeURIComponent(data.translatedFileUrl" not in page


# ---- 9. the queue share ------------------------------------------------------------------------------


def test_files_keep_most_of_the_queue_free(http):
    server = http(FakeEngine(step_s=0.001))
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.total("translator_queue_segments"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    statuses: list[int] = []
    text = "".join(f"line number {i} here\n" for i in range(600))
    files = [
        threading.Thread(target=lambda i=i: statuses.append(upload(server, f"f{i}.txt", text)[0]))
        for i in range(5)
    ]
    for t in files:
        t.start()
    for t in files:
        t.join(120)
    done.set()
    sampler.join(5)
    assert statuses == [200] * 5
    assert peak[0] <= 1024 * 0.125, peak[0]


# ---- 11. a malformed catalog -------------------------------------------------------------------------


def test_what_msgfmt_rejects_on_input_is_a_400_naming_the_line(http):
    status, _, body = upload(http(), "app.po", HEADER + '\nmsgid "Save\nmsgstr ""\n')
    assert status == 400, body
    assert "line 7: end-of-line within string" in body["error"]  # msgfmt counts the line the string ran into


# ---- settings ----------------------------------------------------------------------------------------


def test_file_limits_are_settings():
    config = load_config([], {"TRANSLATOR_FILE_WORKERS": "3", "TRANSLATOR_DOWNLOAD_TTL_S": "60"})
    assert (config.file_workers, config.download_ttl_s) == (3, 60.0)
    with pytest.raises(ValueError, match="file_queue_share"):
        load_config(["--file-queue-share", "0"], {})
    with pytest.raises(ValueError, match="http_public_url"):
        load_config(["--http-public-url", "tr.example.org"], {})
