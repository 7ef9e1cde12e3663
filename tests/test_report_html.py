"""report.html in real headless Chromium (Debian `chromium` + `chromium-driver`, installed by
`make test`): it renders, every plot image loads, nothing is fetched from a network, and a
screenshot is produced."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from _tiny_lm import tiny_lm_overrides
from oelm.cli import main

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

TINY_LM = tiny_lm_overrides(max_steps=10, eval_every=5)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium / chromedriver not installed (`make test` installs the Debian packages chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # An explicit driver path: selenium-manager is never asked to download anything.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("report_html")
    assert main(["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out), *TINY_LM]) == 0
    return out


@pytest.mark.slow
def test_report_renders_in_headless_chromium(browser, report_dir, tmp_path):
    page = report_dir / "report.html"
    browser.get_log("performance")  # drop anything logged before this page
    browser.get(page.as_uri())
    assert browser.title == "oelm report: tinystories-tiny"
    table = browser.find_element("css selector", "table.comparison")
    assert "oelm_freeze" in table.text and "baseline" in table.text

    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.src.slice(0, 22),"
        " i.dataset.name])"
    )
    # every plot report.md links (report_files/*.png) is in the page, once each, and drawn
    linked = sorted(re.findall(r"\]\(report_files/([^)]+\.png)\)", (report_dir / "report.md").read_text()))
    assert len(linked) >= 3 and sorted(i[4] for i in images) == linked
    for complete, width, height, prefix, _ in images:
        assert complete and width > 100 and height > 100 and prefix == "data:image/png;base64,"

    # Every request the page made: the file itself and data: URIs only, never the network.
    urls = []
    for entry in browser.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert urls and all(u.startswith("data:") or u == page.as_uri() for u in urls), urls
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

    # Full-page screenshot through the DevTools protocol.
    height = browser.execute_script("return document.documentElement.scrollHeight")
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG" and img.size[0] >= 1000 and img.size[1] >= min(height, 2000)
    colors = img.convert("RGB").resize((64, 256)).getcolors(64 * 256)
    assert colors is not None and len(colors) > 20  # text, tables and plots: not a blank page
