"""report.html: rendered from an autoescaped Jinja2 template that ships in the wheel, so hostile
names and warnings stay text; and in real headless Chromium (Debian `chromium` + `chromium-driver`,
installed by `make test`): the report's folder, copied elsewhere, renders, every plot image loads
from its report_files/ beside the page, nothing else is fetched (no network), and a screenshot is
produced."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from _tiny_lm import tiny_lm_overrides
from oelm.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
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
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OELM_REPORT_PLOTS", "1")  # the suite's default is off (conftest): these tests read the plots
        assert main(["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out), *TINY_LM]) == 0
    return out


@pytest.mark.slow
def test_report_renders_in_headless_chromium(browser, report_dir, tmp_path):
    # the page and its plots alone, in another folder: relative links, nothing from the run folder
    moved = tmp_path / "moved"
    shutil.copytree(report_dir / "report_files", moved / "report_files")
    shutil.copyfile(report_dir / "report.html", moved / "report.html")
    page = moved / "report.html"
    plots = (moved / "report_files").as_uri() + "/"
    browser.get_log("performance")  # drop anything logged before this page
    browser.get(page.as_uri())
    assert browser.title == "oelm report: tinystories-tiny"
    table = browser.find_element("css selector", "table.comparison")
    assert "oelm_freeze" in table.text and "baseline" in table.text

    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.src, i.dataset.name])"
    )
    # every plot report.md links (report_files/*.png) is in the page, once each, drawn from its file beside the page
    linked = sorted(re.findall(r"\]\(report_files/([^)]+\.png)\)", (report_dir / "report.md").read_text()))
    assert len(linked) >= 3 and sorted(i[4] for i in images) == linked
    for complete, width, height, src, name in images:
        assert complete and width > 100 and height > 100 and src == plots + name

    # Every request the page made: the page itself and its plot files only, never the network.
    urls = []
    for entry in browser.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert sorted(urls) == sorted([page.as_uri(), *(plots + name for name in linked)]), urls
    # Resource Timing lists no file: loads (the plots), so any entry would be a fetch from elsewhere
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
    assert all(r.startswith(plots) for r in resources), resources

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


HOSTILE = '<script>alert(1)</script> "quoted" & \'single\''
# Every tag the template itself writes: nothing from the data may add one.
TEMPLATE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "b", "ul", "li", "table", "tr", "th",
                 "td", "img", "small", "code"}


class _Page(HTMLParser):
    """Tags, attribute values and text nodes (entities decoded) of an HTML page."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [v for _, v in attrs if v is not None]

    def handle_data(self, data):
        self.text.append(data)


def test_hostile_names_warnings_and_cells_are_escaped_in_the_html(report_plots):
    """A run name, method, dataset, model, warning, table cell, bold text, image name and alt text
    holding ``<script>`` and quotes come out as that literal text, never as markup: the page has
    only the template's own tags and the strings read back unchanged from text and attributes."""
    from oelm.report.render import Section, build_sections, render_html


    committed = RESULTS / "cpu-sst2"
    c = json.loads((committed / "comparison.json").read_text())
    rename = {"oelm_freeze": f"oelm_freeze {HOSTILE}"}
    c["methods"] = {rename.get(k, k): v for k, v in c["methods"].items()}
    c["vs_baseline"] = {rename.get(k, k): v for k, v in c["vs_baseline"].items()}
    c.update(name=f"run {HOSTILE}", task=f"sst2 {HOSTILE}", model=f"model {HOSTILE}",
             warnings=[*c["warnings"], f"dataset {HOSTILE} has a warning"])
    png = (committed / "report_files" / "final_metric.png").read_bytes()
    every_kind = (Section(f"Extra {HOSTILE}").text(f"a **bold {HOSTILE}** word").items([f"item {HOSTILE}"])
                  .table([f"head {HOSTILE}"], [[f"cell {HOSTILE}"]]).image(f"plot {HOSTILE}.png", png, f"alt {HOSTILE}"))
    page_text = render_html(c, [*build_sections(c, None), every_kind])
    page = _Page(page_text)

    assert "<script>" not in page_text and set(page.tags) <= TEMPLATE_TAGS, set(page.tags) - TEMPLATE_TAGS
    text = "".join(page.text)
    for s in (f"oelm report: run {HOSTILE}", f"run {HOSTILE}: sst2 {HOSTILE} with model {HOSTILE}",
              f"dataset {HOSTILE} has a warning", f"oelm_freeze {HOSTILE}", f"Extra {HOSTILE}", f"bold {HOSTILE}",
              f"item {HOSTILE}", f"head {HOSTILE}", f"cell {HOSTILE}"):
        assert s in text, s
    assert {f"alt {HOSTILE}", f"plot {HOSTILE}.png"} <= set(page.attrs)
    assert page.tags.count("img") == 2  # the committed bar chart and the hostile section's plot


def test_the_report_template_is_package_data():
    """pyproject's package-data globs take every template under oelm/report/templates into the
    wheel, so an installed oelm renders report.html too."""
    import tomllib
    from fnmatch import fnmatch

    package = ROOT / "src" / "oelm"
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["oelm"]
    templates = [p.relative_to(package).as_posix() for p in (package / "report" / "templates").iterdir()]
    assert "report/templates/report.html.j2" in templates
    assert [p for p in templates if not any(fnmatch(p, g) for g in globs)] == []
