"""The web page at / (server/web/index.html) in a real headless browser: Debian's chromium driven by
its chromedriver through Selenium, against a real server with the shipped model. Type a sentence and
see the translation and its alternatives; upload a small .pot and get the filled .po back.

WEB_PAGE_SCREENSHOT=docs/web-page.png writes the README's screenshot from the typing test.

Issue 34: the keyboard reaches the translation and its copy button, every field has a label, an error
clears the old answer, notes and the machine-translation notice are shown, the <noscript> message, an
axe-core audit (from npm, cached outside the repository, injected by the test only: the page loads
nothing from elsewhere), and CORS as a browser on another origin sees it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from client.load import free_port

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from tests.test_routing import MODELS, make_store, models_of  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)

POT = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

msgid "Open the file"
msgstr ""

msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""
"""


@pytest.fixture(scope="module")
def page_server(start_server, shipped_bundle):
    return start_server(shipped_bundle, http_port=free_port())


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1200,820")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's JavaScript errors
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def open_page(browser, server) -> None:
    browser.get(f"http://127.0.0.1:{server.server.http_port}/")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "source"))


def test_typing_translates_live(browser, page_server):
    open_page(browser, page_server)
    box = browser.find_element(By.ID, "source")
    box.send_keys("Do you want to save the changes to the document before closing?")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_element(By.ID, "translation").text.strip())
    translation = browser.find_element(By.ID, "translation").text
    assert "documento" in translation and translation.startswith("¿")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#alternatives li")) == 2)
    alternatives = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#alternatives li")]
    assert all(alternatives) and translation not in alternatives
    # Typing more re-translates: the page always shows the translation of what is in the box.
    box.clear()
    box.send_keys("Open the file")
    wait.until(lambda d: d.find_element(By.ID, "translation").text == "Abrir el archivo")
    box.clear()
    box.send_keys("Could not save the document %s. Do you want to try again?")
    wait.until(lambda d: "%s" in d.find_element(By.ID, "translation").text)
    shot = os.environ.get("WEB_PAGE_SCREENSHOT")
    if shot:
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#alternatives li")) == 2)
        browser.save_screenshot(str(Path(shot)))


def test_po_upload_returns_the_filled_catalog(browser, page_server, tmp_path):
    pot = tmp_path / "app.pot"
    pot.write_text(POT)
    open_page(browser, page_server)
    browser.find_element(By.ID, "po-file").send_keys(str(pot))
    browser.find_element(By.ID, "po-submit").click()
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: d.find_element(By.ID, "po-result").get_attribute("value"))
    result = browser.find_element(By.ID, "po-result").get_attribute("value")
    assert 'msgid "Open the file"\nmsgstr "Abrir el archivo"' in result
    assert 'msgstr[1] "%d archivos"' in result and '"Language: es\\n"' in result
    link = browser.find_element(By.ID, "po-download")
    assert link.get_attribute("download") == "app.po" and link.get_attribute("href").startswith("blob:")
    assert "2 filled" in browser.find_element(By.ID, "po-status").text


# ---- several models: the target selector (issue 31) ---------------------------------------------------


@pytest.fixture(scope="module")
def store_server(start_server, tiny_bundle, tmp_path_factory):
    """tests/test_routing.py's store: en -> de, en -> es, en -> pt-BR (tiny random models)."""
    store = make_store(tiny_bundle, tmp_path_factory.mktemp("store"), MODELS)
    return start_server(store, threads=1, http_port=free_port(), warmup=False)


def page_errors(browser) -> list[str]:
    # The favicon's 404 is the browser asking for an icon the server has none of, not the page failing.
    return [
        e["message"]
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "favicon" not in e["message"]
    ]


def selector(browser) -> list[str]:
    return [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#target option")]


def test_the_target_selector_routes_live_and_file_translation(browser, store_server, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="server.requests")
    open_page(browser, store_server)
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: selector(d) == ["de", "es", "pt-BR"])
    target = browser.find_element(By.ID, "target")
    assert target.get_attribute("value") == "es" and target.is_enabled()  # Spanish is the default
    Select(target).select_by_value("de")
    assert browser.find_element(By.ID, "target-name").text == "German"
    browser.find_element(By.ID, "source").send_keys("Open the file")
    wait.until(lambda d: d.find_element(By.ID, "status").text.endswith(" ms"))
    pot = tmp_path / "app.pot"
    pot.write_text(POT)
    browser.find_element(By.ID, "po-file").send_keys(str(pot))
    browser.find_element(By.ID, "po-submit").click()
    wait.until(lambda d: d.find_element(By.ID, "po-result").get_attribute("value"))
    assert '"Language: de\\n"' in browser.find_element(By.ID, "po-result").get_attribute("value")
    assert set(models_of(caplog)) == {"tiny-en-de"} and models_of(caplog, "TranslateFile") == ["tiny-en-de"]
    assert page_errors(browser) == [], page_errors(browser)


def test_one_pair_leaves_one_disabled_choice(browser, start_server, tiny_bundle):
    server = start_server(tiny_bundle, threads=1, http_port=free_port(), warmup=False)
    open_page(browser, server)
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: not d.find_element(By.ID, "target").is_enabled())
    assert selector(browser) == ["es"]
    browser.find_element(By.ID, "source").send_keys("Open the file")
    wait.until(lambda d: d.find_element(By.ID, "status").text.endswith(" ms"))
    assert page_errors(browser) == [], page_errors(browser)


# ---- accessibility and honesty (issue 34) -------------------------------------------------------------


def translate_on_page(browser, server, text: str, expected: str | None = None) -> str:
    """Open the page, type `text`, wait for its translation (`expected` when given) and return it."""
    open_page(browser, server)
    box = browser.find_element(By.ID, "source")
    box.send_keys(text)
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_element(By.ID, "status").text.split(" ")[1:2] == ["ms"])
    translation = browser.find_element(By.ID, "translation").text
    if expected is not None:
        assert translation == expected
    return translation


def grant_clipboard(browser, server) -> None:
    # Reading the clipboard back needs the permission a user would give; writing needs none.
    browser.execute_cdp_cmd(
        "Browser.grantPermissions",
        {
            "origin": f"http://127.0.0.1:{server.server.http_port}",
            "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"],
        },
    )


# The real Clipboard API of the page, also after a test has hidden navigator.clipboard from the page's script.
CLIPBOARD = "Object.getOwnPropertyDescriptor(Navigator.prototype, 'clipboard').get.call(navigator)"


def clipboard_text(browser) -> str:
    return browser.execute_async_script(
        f"const done = arguments[0]; {CLIPBOARD}.readText().then(done, (e) => done('error: ' + e));"
    )


def set_clipboard(browser, text: str) -> None:
    assert (
        browser.execute_async_script(
            f"const done = arguments[1]; {CLIPBOARD}.writeText(arguments[0]).then(() => done('ok'), String);",
            text,
        )
        == "ok"
    )


def tab_order(browser, start: str, stop: str, limit: int = 10) -> list[str]:
    """The ids focus visits with Tab from element `start` until `stop` (at most `limit` presses)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    browser.execute_script("arguments[0].focus()", browser.find_element(By.ID, start))
    visited: list[str] = []
    for _ in range(limit):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        visited.append(browser.switch_to.active_element.get_attribute("id"))
        if visited[-1] == stop:
            break
    return visited


def test_keyboard_reaches_the_output_and_copies_it(browser, page_server):
    from selenium.webdriver.common.keys import Keys

    translate_on_page(browser, page_server, "Open the file", "Abrir el archivo")
    grant_clipboard(browser, page_server)
    set_clipboard(browser, "something else")
    # After the text and its options, Tab reaches the translation itself, then its copy button.
    assert tab_order(browser, "source", "copy") == ["alternatives-count", "html", "translation", "copy"]
    output = browser.find_element(By.ID, "translation")
    assert output.get_attribute("aria-live") == "polite" and output.accessible_name == "Spanish translation"
    browser.switch_to.active_element.send_keys(Keys.ENTER)  # the keyboard alone, no click
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "copy-status").text == "Copied")
    assert browser.find_element(By.ID, "copy-status").get_attribute("role") == "status"
    assert clipboard_text(browser) == "Abrir el archivo"
    assert page_errors(browser) == [], page_errors(browser)  # the CSP's hashes still match the page


def test_copy_falls_back_without_the_clipboard_api(browser, page_server):
    """Plain HTTP on a LAN address has no navigator.clipboard: the page selects the output and copies."""
    translate_on_page(browser, page_server, "Open the file", "Abrir el archivo")
    grant_clipboard(browser, page_server)
    set_clipboard(browser, "something else")
    browser.execute_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    assert browser.execute_script("return navigator.clipboard") is None
    browser.find_element(By.ID, "copy").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "copy-status").text == "Copied")
    assert clipboard_text(browser) == "Abrir el archivo"
    assert browser.execute_script("return getSelection().toString()") == ""  # the selection is put back


def test_every_field_has_a_label(browser, page_server):
    open_page(browser, page_server)
    fields = browser.find_elements(By.CSS_SELECTOR, "input, select, textarea, output")
    assert len(fields) >= 8
    for field in fields:
        name = field.get_attribute("id")
        # A real <label> (for= or around it), not a placeholder or a title only.
        labels = browser.execute_script(
            "return Array.from(arguments[0].labels, (l) => l.textContent.trim())", field
        )
        assert labels and all(labels), f"#{name} has no <label>"
        if field.is_displayed():
            assert field.accessible_name.strip(), f"#{name} has no accessible name"
    source = browser.find_element(By.ID, "source")
    assert source.accessible_name == "English text"  # the label's, not the placeholder's


def test_an_error_replaces_the_previous_translation(browser, page_server):
    translate_on_page(browser, page_server, "Open the file", "Abrir el archivo")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#alternatives li"))
    # A text over the server's limit: a real 400 from the server.
    browser.execute_script(
        "const box = arguments[0]; box.value = 'open the file '.repeat(2000);"
        "box.dispatchEvent(new Event('input'));",
        browser.find_element(By.ID, "source"),
    )
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 30).until(lambda d: "error" in status.get_attribute("class"))
    assert status.text.startswith("Not translated: ") and len(status.text) > len("Not translated: ")
    # Nothing of the old answer stays next to the error.
    assert browser.find_element(By.ID, "translation").text == ""
    assert browser.find_elements(By.CSS_SELECTOR, "#alternatives li, #notes li") == []
    assert not browser.find_element(By.ID, "copy").is_enabled()
    # The browser logs the 400 it got, and nothing else (a script error would show here).
    assert all("status of 400" in e for e in page_errors(browser)), page_errors(browser)


def test_notes_and_alternatives_are_shown(browser, page_server):
    # "Save" is answered from the translation memory (tests/test_http_api.py): one memory note.
    translate_on_page(browser, page_server, "Save", "Guardar")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#notes li"))
    notes = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#notes li")]
    assert len(notes) == 1 and notes[0].startswith("“Save”: from the translation memory"), notes
    assert "packages translate it" in notes[0]
    assert browser.find_element(By.ID, "notes-box").is_displayed()
    assert browser.find_element(By.ID, "status").text.endswith("· 1 note")
    # The model's translations come as alternatives of a memory answer; asking for none shows none.
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#alternatives li")) == 2)
    Select(browser.find_element(By.ID, "alternatives-count")).select_by_value("0")
    wait.until(lambda d: not d.find_element(By.ID, "alternatives-box").is_displayed())
    # A text without notes clears them.
    box = browser.find_element(By.ID, "source")
    box.clear()
    box.send_keys("Open the file")
    wait.until(lambda d: d.find_element(By.ID, "translation").text == "Abrir el archivo")
    assert browser.find_elements(By.CSS_SELECTOR, "#notes li") == []
    assert not browser.find_element(By.ID, "notes-box").is_displayed()


def test_the_page_says_it_is_machine_translation(browser, page_server):
    open_page(browser, page_server)
    notice = browser.find_element(By.ID, "mt-notice")
    assert notice.is_displayed() and notice.text.startswith("Machine translation")
    # With JavaScript on, the <noscript> message is not shown.
    assert not browser.find_elements(By.ID, "noscript")


def test_without_javascript_the_page_says_why(browser, page_server):
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        open_page(browser, page_server)
        message = browser.find_element(By.ID, "noscript")
        assert message.is_displayed()
        assert "needs JavaScript" in message.text and "/translate" in message.text
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


# ---- axe-core --------------------------------------------------------------------------------------------

AXE_VERSION = "4.10.3"  # pinned: a new release's new rules should not fail an unchanged page


def axe_source() -> str:
    """axe.min.js of AXE_VERSION, installed once with npm into ~/.cache/translator-tests (outside the
    repository; npm checks the package's integrity). Skipped with the reason when npm cannot get it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "translator-tests"
    root = cache / f"axe-core-{AXE_VERSION}"
    package = root / "node_modules" / "axe-core"
    if not (package / "axe.min.js").is_file():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("axe-core audit: npm is not installed (apt-get install npm)")
        try:
            proc = subprocess.run(
                [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", f"axe-core@{AXE_VERSION}"],
                capture_output=True,
                text=True,
                timeout=180,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"axe-core audit: npm install axe-core@{AXE_VERSION} took over 180 s (offline?)")
        if proc.returncode != 0:
            pytest.skip(f"axe-core audit: npm could not install axe-core: {proc.stderr.strip()[-300:]}")
    assert json.loads((package / "package.json").read_text())["version"] == AXE_VERSION
    return (package / "axe.min.js").read_text()


def axe_violations(browser, source: str) -> list[dict]:
    """axe's violations of the page as it is now, the rules of WCAG 2.x A and AA and best practice."""
    browser.execute_script(source)
    return browser.execute_async_script(
        """const done = arguments[0];
        axe.run(document, {resultTypes: ["violations"]}).then(
          (r) => done(r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
                                                 nodes: v.nodes.map((n) => n.target.join(" "))}))),
          (e) => done([{id: "axe-error", impact: "critical", help: String(e), nodes: []}]));"""
    )


def test_axe_finds_no_serious_violations(browser, page_server):
    source = axe_source()
    # Every part shown: a translation with a note and alternatives, "Copied", then an error.
    translate_on_page(browser, page_server, "Save", "Guardar")
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#alternatives li")) == 2)
    browser.find_element(By.ID, "copy").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "copy-status").text)
    found = axe_violations(browser, source)
    browser.execute_script(
        "arguments[0].value = 'x '.repeat(20000); arguments[0].dispatchEvent(new Event('input'));",
        browser.find_element(By.ID, "source"),
    )
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 30).until(lambda d: "error" in status.get_attribute("class"))
    found += axe_violations(browser, source)
    serious = [v for v in found if v["impact"] in ("serious", "critical")]
    assert serious == [], json.dumps(serious, indent=1)
    # The rest is reported, not failed: axe's "moderate" and "minor" are judgement calls.
    for v in found:
        print(f"axe {v['impact']}: {v['id']} ({v['help']}) at {v['nodes']}")


# ---- CORS as a browser sees it (issue 34) -----------------------------------------------------------------

# A page on another origin (another port of 127.0.0.1) that calls the API as a browser front end does: a
# JSON POST, which makes the browser send a preflight first. The API's address comes in the query string.
CROSS_ORIGIN_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>another origin</title></head>
<body><output id="result">waiting</output>
<script>
const api = new URLSearchParams(location.search).get("api");
fetch(api + "/translate", {method: "POST", headers: {"Content-Type": "application/json"},
                           body: JSON.stringify({q: "a b", source: "en", target: "es"})})
  .then((r) => r.json())
  .then((data) => { document.getElementById("result").textContent = "translated: " + data.translatedText; })
  .catch((e) => { document.getElementById("result").textContent = "failed: " + e; });
</script></body></html>
"""


@pytest.fixture(scope="module")
def other_origin():
    """http://127.0.0.1:PORT, a second HTTP server (another port: another origin) serving the page above."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(CROSS_ORIGIN_PAGE)))
            self.end_headers()
            self.wfile.write(CROSS_ORIGIN_PAGE)

        def log_message(self, *args):  # quiet: pytest shows failures, not every GET
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


def call_from(browser, origin: str, server) -> str:
    """What the other origin's page shows once its fetch of the API has settled."""
    browser.get_log("browser")  # drop earlier lines: the CORS messages checked are this page's
    browser.get(f"{origin}/?api=http://127.0.0.1:{server.server.http_port}")
    result = browser.find_element(By.ID, "result")
    WebDriverWait(browser, 30).until(lambda d: result.text != "waiting")
    return result.text


def translations(server) -> float:
    return server.total("translator_requests_total", rpc="Translate", transport="http")


@pytest.mark.parametrize("allowed", ["listed", "*"])
def test_a_page_on_an_allowed_origin_calls_the_api(browser, start_fake_server, other_origin, allowed):
    origins = f"https://app.example.org,{other_origin}" if allowed == "listed" else "*"
    server = start_fake_server(http_port=free_port(), http_cors_origins=origins)
    assert call_from(browser, other_origin, server) == "translated: b a"  # the fake engine reverses words
    assert translations(server) == 1


@pytest.mark.parametrize("cors", ["https://app.example.org", ""], ids=["another-origin-listed", "off"])
def test_a_page_on_another_origin_is_blocked(browser, start_fake_server, other_origin, cors):
    server = start_fake_server(http_port=free_port(), http_cors_origins=cors)
    assert call_from(browser, other_origin, server) == "failed: TypeError: Failed to fetch"
    console = [e["message"] for e in browser.get_log("browser")]
    assert any("blocked by CORS policy" in m for m in console), console
    # The preflight was refused, so the POST itself never reached the server.
    assert translations(server) == 0
