"""The web page at / (server/web/index.html) in a real headless browser: Debian's chromium driven by
its chromedriver through Selenium, against a real server with the shipped model. Type a sentence and
see the translation and its alternatives; upload a small .pot and get the filled .po back.

WEB_PAGE_SCREENSHOT=docs/web-page.png writes the README's screenshot from the typing test.
"""

from __future__ import annotations

import logging
import os
import shutil
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
