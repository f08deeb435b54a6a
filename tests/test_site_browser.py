"""The built site in a real browser: every page loaded in headless Chromium (through Selenium) at a desktop and a
phone width.

A page fails where an element sticks out of the content column (a wide table or code block must scroll inside
itself instead), where a code block needs scrolling at the desktop width (its lines are kept to 88 characters),
where a table cell shows a Markdown escape (``\\|``), or where the page logs a console error; the site's search
must find each term of ``SEARCH_TERMS``. A screenshot of each page at each width goes to
``site-screenshots/amp_backends-site/`` (git-ignored; ``AMP_SITE_SCREENSHOTS`` names another parent), which the
test prints.

The site is built here (``mkdocs build --strict``) and served over http from 127.0.0.1 (the search loads its
index over http). nox's ``lint`` session runs this module; it skips where MkDocs, Selenium, Chromium or its
driver is missing (Debian: ``apt-get install chromium chromium-driver``, which ``.ci/run`` does as root).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What a reader looks up: the search must find a page for each (extend the list as pages add terms).
SEARCH_TERMS = ("set_global_policy", "LossScaleOptimizer", "get_scaled_loss", "mixed_float16", "mpiexec")
# name -> (width, height) of the viewport, in CSS pixels
WIDTHS = {"desktop": (1280, 800), "phone": (390, 844)}
# a folder of the test's own (its old screenshots are removed before each run), inside the one named
SCREENSHOTS = Path(os.environ.get("AMP_SITE_SCREENSHOTS") or ROOT / "site-screenshots") / "amp_backends-site"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")

# Elements that stick out of the content column (outside the blocks that scroll inside themselves), code blocks
# that scroll at the desktop width, and table cells that show an escape, as "what: where" lines.
LAYOUT_JS = r"""
const column = document.querySelector('.md-content').getBoundingClientRect();
const scrollers = 'pre, .highlight, .md-typeset__scrollwrap, .md-typeset__table';
const where = (el) => {
  const parts = [];
  for (let e = el; e && e !== document.body && parts.length < 4; e = e.parentElement) {
    parts.unshift(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
                  (e.classList.length ? '.' + [...e.classList].join('.') : ''));
  }
  const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
  return parts.join(' > ') + (text ? ` ("${text}")` : '');
};
const found = [];
const root = document.documentElement;
if (root.scrollWidth > root.clientWidth + 1) {
  found.push(`the page scrolls sideways: ${root.scrollWidth} px wide in a ${root.clientWidth} px window`);
}
for (const el of document.querySelectorAll('.md-content *')) {
  if (el.parentElement.closest(scrollers)) continue;  // inside a block that scrolls
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) continue;
  if (box.right > column.right + 1 || box.left < column.left - 1) {
    found.push(`sticks out of the content column (${Math.round(box.left)}-${Math.round(box.right)} px, ` +
               `column ${Math.round(column.left)}-${Math.round(column.right)} px): ${where(el)}`);
  }
}
if (arguments[0]) {
  for (const code of document.querySelectorAll('.md-content pre > code')) {
    if (code.scrollWidth > code.clientWidth + 1) {
      found.push(`a code block scrolls (${code.scrollWidth} px of code in ${code.clientWidth} px): ${where(code)}`);
    }
  }
}
for (const cell of document.querySelectorAll('.md-content td, .md-content th')) {
  if (cell.textContent.includes('\\|')) found.push(`a table cell shows an escaped pipe: ${where(cell)}`);
}
return found;
"""


def _browser() -> tuple[str, str]:
    """Chromium's and its driver's paths, or a skip that says what to install."""
    for module in ("mkdocs", "material", "selenium"):
        pytest.importorskip(module, reason=f"{module} is not installed: the site test runs in nox's lint session "
                                           "(the docs and site-test extras)")
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("Chromium or chromium-driver is missing: `apt-get install chromium chromium-driver` "
                    "(Debian; .ci/run installs them when it runs as root)")
    return browser, driver


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as nox's lint session builds it (``mkdocs build --strict``)."""
    _browser()
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the test's output stays the test's
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site's address: http.server on 127.0.0.1 at a free port, in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _browser()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--hide-scrollbars", "--window-size=1280,800"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _viewport(driver, width: int, height: int, phone: bool) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": phone})


def _pages(site: Path) -> list[str]:
    """Every page's path below the site's root ('' for the home page, 'concepts/', 'reference/api/', ...)."""
    found = []
    for page in sorted(site.rglob("index.html")):
        rel = page.parent.relative_to(site)
        if rel.parts[:1] not in (("assets",), ("search",)):
            found.append("" if not rel.parts else rel.as_posix() + "/")
    return found


def _load(driver, url: str) -> None:
    """Open ``url`` and wait until it and its fonts are loaded."""
    driver.get(url)
    deadline = time.monotonic() + 15
    while driver.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.execute_script("return document.fonts ? document.fonts.ready : null")


def _errors(driver) -> list[str]:
    """The console's errors since the last call (the browser's SEVERE log entries: a failed request, a script
    error, ``console.error``)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def test_every_page_fits_its_column_and_logs_no_error(site, served, browser, capsys):
    """Each page at each width: its layout (``LAYOUT_JS``), its console, and a screenshot."""
    pages = _pages(site)
    assert len(pages) >= 15, pages
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    problems: list[str] = []
    for kind, (width, height) in WIDTHS.items():
        _viewport(browser, width, height, phone=kind == "phone")
        for page in pages:
            _load(browser, served + page)
            label = f"{page or 'index/'}@{kind}"
            problems += [f"{label}: {p}" for p in browser.execute_script(LAYOUT_JS, kind == "desktop")]
            problems += [f"{label}: console error: {e}" for e in _errors(browser)]
            shot = page.strip("/").replace("/", "-") or "index"
            browser.save_screenshot(str(SCREENSHOTS / f"{shot}-{kind}.png"))
    with capsys.disabled():
        print(f"\nscreenshots of {len(pages)} pages at {', '.join(f'{k} {w}x{h}' for k, (w, h) in WIDTHS.items())}: "
              f"{SCREENSHOTS}")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def _search(driver, term: str) -> int:
    """How many documents the site's search lists for ``term``, typed into the header's search box."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
    meta = driver.find_element(By.CSS_SELECTOR, ".md-search-result__meta")
    box.click()
    box.send_keys(Keys.CONTROL, "a", Keys.BACKSPACE)
    _wait(lambda: "type to start" in meta.text.lower(), f"the search box to empty before {term!r}: {meta.text!r}")
    box.send_keys(term)
    said = _wait(lambda: re.match(r"(no|\d+) matching document", meta.text.strip().lower()),
                 f"the search to answer {term!r}: {meta.text!r}")
    return 0 if said.group(1) == "no" else int(said.group(1))


def _wait(condition, what: str, seconds: float = 15):
    deadline = time.monotonic() + seconds
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {seconds} s for {what}")
        time.sleep(0.05)
    return result


def test_the_search_finds_the_terms_readers_look_up(served, browser, capsys):
    """The search index loads over http and finds every term of ``SEARCH_TERMS``."""
    _viewport(browser, *WIDTHS["desktop"], phone=False)
    _load(browser, served)
    found = {term: _search(browser, term) for term in SEARCH_TERMS}
    with capsys.disabled():
        print(f"\nthe site's search: {', '.join(f'{term} {n}' for term, n in found.items())} documents")
    missing = sorted(term for term, n in found.items() if not n)
    assert not missing, f"the site's search finds nothing for {missing} (found: {found})"
    assert not _errors(browser)
