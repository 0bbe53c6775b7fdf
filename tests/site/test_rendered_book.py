"""The built book, checked in a real browser: every page of the toc loads, its math is typeset
by the MathJax served with the book, its images load, no request leaves 127.0.0.1, and the
cited bibliography renders. Build first: ``make book-build`` (the build itself runs with -W).

The site is ``book/_build/html`` (``GLA_BOOK_DIR`` names another book folder). It is served on
127.0.0.1 at a free port and opened in Debian's chromium through chromedriver, both found on
PATH (``CHROMIUM``/``CHROMEDRIVER`` override them). Nothing is skipped: a missing site or
browser fails the tests, since the book is part of what ``make test`` checks.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest
import yaml

BOOK = Path(os.environ.get("GLA_BOOK_DIR", Path(__file__).resolve().parents[2] / "book")).resolve()
REPO = BOOK.parent  # the repository holding the book (Colab links point into it)
HTML = BOOK / "_build" / "html"
BIBLIOGRAPHY_PAGE = "references"
MATHJAX_DIR = "_static/mathjax/"
MATHJAX_SCRIPT = MATHJAX_DIR + "tex-chtml.js"
# Schemes of requests that stay inside the browser (chrome:// are its own UI resources).
LOCAL_SCHEMES = ("data", "blob", "about", "chrome", "chrome-extension", "devtools")
COLAB_PATH = re.compile(r"^https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/(.+)$")
# Math in a page's source: $...$, $$...$$ or an amsmath environment.
SOURCE_MATH = re.compile(r"\$[^$\s][^$]*\$|\\begin\{(align|equation|gather|multline)")


def toc_docnames(toc_file: Path = BOOK / "_toc.yml") -> list[str]:
    """Every page of the book, in toc order: the root, then each ``file:`` entry (recursively)."""
    toc = yaml.safe_load(toc_file.read_text())
    names = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                names.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(n).with_suffix("")) if Path(n).suffix in (".md", ".ipynb") else n for n in names]


def source_of(docname: str) -> Path:
    """The source file of a page (``.md`` or ``.ipynb``) in the book folder."""
    for suffix in (".md", ".ipynb"):
        path = BOOK / f"{docname}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"no source for page {docname!r} in {BOOK}")


def prose_of(docname: str) -> str:
    """The text a page is written in: the file for ``.md``, the markdown cells for ``.ipynb``."""
    path = source_of(docname)
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        pass


@pytest.fixture(scope="session")
def site() -> Path:
    """The built site; fails (does not skip) when the book has not been built."""
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run `make book-build` (or `make book`) first")
    return HTML


@pytest.fixture(scope="session")
def base_url(site: Path):
    """``http://127.0.0.1:PORT/`` serving the site from a thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _find(env: str, *names: str) -> str:
    for candidate in (os.environ.get(env), *names):
        if candidate and (shutil.which(candidate) or Path(candidate).is_file()):
            return shutil.which(candidate) or candidate
    pytest.fail(f"{' or '.join(names)} not found: install chromium and chromedriver (or set {env})")


@pytest.fixture(scope="session")
def browser():
    """Headless chromium driven by selenium; records the network log of every page."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _find("CHROMIUM", "chromium", "chromium-browser", "google-chrome")
    profile = tempfile.mkdtemp(prefix="gla-book-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # An explicit driver path: selenium-manager must not try to download anything.
    service = Service(executable_path=_find("CHROMEDRIVER", "chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


PAGES = toc_docnames()

# Everything one page reports after MathJax is done; runs in the page (async script).
PAGE_REPORT_JS = r"""
const done = arguments[arguments.length - 1];
(async () => {
  for (const img of document.images) { if (img.loading === "lazy") img.loading = "eager"; }
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  const t0 = Date.now();
  while ([...document.images].some(i => !i.complete) && Date.now() - t0 < 20000) {
    await new Promise(r => setTimeout(r, 100));
  }
  const skip = "PRE,CODE,SCRIPT,STYLE,TEXTAREA,MJX-CONTAINER,SVG";
  const raw = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    let el = n.parentElement, skipped = false;
    for (; el; el = el.parentElement) {
      if (skip.split(",").includes(el.tagName.toUpperCase()) || el.classList.contains("highlight")) {
        skipped = true; break;
      }
    }
    if (!skipped && /\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$\\[A-Za-z]/.test(n.textContent)) {
      raw.push(n.textContent.trim().slice(0, 120));
    }
  }
  const maths = [...document.querySelectorAll(".math")];
  done({
    title: document.title,
    h1: [...document.querySelectorAll("article.bd-article h1")].map(h => h.textContent.trim()),
    mathjax_version: window.MathJax && MathJax.version ? MathJax.version : null,
    mathjax_scripts: [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s)),
    math_elements: maths.length,
    untypeset: maths.filter(m => !m.querySelector("mjx-container")).map(m => m.textContent.slice(0, 120)),
    containers: document.querySelectorAll("mjx-container").length,
    chtml_containers: document.querySelectorAll('mjx-container[jax="CHTML"]').length,
    merrors: [...document.querySelectorAll("mjx-merror")].map(e => e.getAttribute("data-mjx-error") || e.textContent),
    raw_tex: raw,
    mjx_fonts: [...document.fonts].filter(f => /^"?MJX/.test(f.family)).map(f => [f.family, f.status]),
    images: [...document.images].map(i => ({src: i.currentSrc || i.src, complete: i.complete, width: i.naturalWidth})),
    links: [...document.querySelectorAll("a[href]")].map(a => ({href: a.href, cls: a.className, text: a.textContent.trim()})),
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
    citations: [...document.querySelectorAll(".citation[id], [role='doc-biblioentry']")].map(e => ({id: e.id, text: e.textContent.trim()})),
  });
})().catch(e => done({error: String(e)}));
"""


def page_url(base_url: str, docname: str) -> str:
    return urljoin(base_url, f"{docname}.html")


def network(browser) -> tuple[dict, dict, dict]:
    """Requests, response statuses and failures since the last call, from chromium's log."""
    requests, statuses, failures = {}, {}, {}
    for entry in browser.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        params = msg.get("params", {})
        if msg["method"] == "Network.requestWillBeSent":
            requests[params["requestId"]] = params["request"]["url"]
        elif msg["method"] == "Network.responseReceived":
            statuses[params["requestId"]] = params["response"]["status"]
        elif msg["method"] == "Network.loadingFailed" and not params.get("canceled"):
            failures[params["requestId"]] = params.get("errorText", "")
    return requests, statuses, failures


@pytest.fixture(scope="module")
def reports(browser, base_url):
    """Open every toc page once; returns {docname: (report, requests, statuses, failures)}."""
    out = {}
    browser.get("about:blank")
    network(browser)  # drop what came before
    for docname in PAGES:
        browser.get(page_url(base_url, docname))
        report = browser.execute_async_script(PAGE_REPORT_JS)
        assert "error" not in report, f"{docname}: page script failed: {report.get('error')}"
        out[docname] = (report, *network(browser))
    return out


def test_toc_pages_are_built(site):
    missing = [d for d in PAGES if not (site / f"{d}.html").is_file()]
    assert not missing, f"pages of _toc.yml missing from the build: {missing}"
    assert BIBLIOGRAPHY_PAGE in PAGES, "the toc must list the bibliography page"


@pytest.mark.parametrize("docname", PAGES)
def test_page_loads(reports, base_url, docname):
    report, requests, statuses, failures = reports[docname]
    url = page_url(base_url, docname)
    doc_ids = [rid for rid, u in requests.items() if urldefrag(u)[0] == url]
    assert doc_ids, f"{docname}: the page was never requested"
    assert all(statuses.get(rid) == 200 for rid in doc_ids), f"{docname}: HTTP {[statuses.get(r) for r in doc_ids]}"
    assert report["title"].strip() and "404" not in report["title"], report["title"]
    assert len(report["h1"]) == 1 and report["h1"][0], f"{docname}: expected one H1, got {report['h1']}"


@pytest.mark.parametrize("docname", PAGES)
def test_no_request_leaves_the_site(reports, base_url, docname):
    _, requests, statuses, failures = reports[docname]
    outside = sorted({u for u in requests.values()
                      if not u.startswith(base_url) and urlparse(u).scheme not in LOCAL_SCHEMES})
    assert not outside, f"{docname}: requests to other hosts: {outside}"
    bad = {requests.get(rid, rid): code for rid, code in statuses.items() if code >= 400}
    assert not bad, f"{docname}: failed responses: {bad}"
    failed = {requests.get(rid, rid): err for rid, err in failures.items()}
    assert not failed, f"{docname}: failed requests: {failed}"


@pytest.mark.parametrize("docname", PAGES)
def test_math_is_typeset_by_local_mathjax(reports, base_url, docname):
    report, requests, *_ = reports[docname]
    has_math = bool(SOURCE_MATH.search(prose_of(docname)))
    if has_math:
        assert report["math_elements"] > 0, f"{docname}: the source has math but the page has no .math element"
    assert not report["raw_tex"], f"{docname}: raw TeX left in the page: {report['raw_tex'][:5]}"
    if report["math_elements"] == 0:
        return
    assert report["mathjax_version"] and report["mathjax_version"].startswith("3."), report["mathjax_version"]
    # The bundle, and the extensions it autoloads, all come from the book's own _static/mathjax/.
    scripts = [urldefrag(s)[0].split("?")[0] for s in report["mathjax_scripts"]]
    assert urljoin(base_url, MATHJAX_SCRIPT) in scripts, report["mathjax_scripts"]
    assert all(s.startswith(urljoin(base_url, MATHJAX_DIR)) for s in scripts), report["mathjax_scripts"]
    assert any(u.split("?")[0] == urljoin(base_url, MATHJAX_SCRIPT) for u in requests.values()), \
        "the MathJax bundle was not fetched from the book"
    assert not report["untypeset"], f"{docname}: math left untypeset: {report['untypeset'][:5]}"
    assert report["containers"] >= report["math_elements"]
    assert report["chtml_containers"] == report["containers"], "math not rendered by the CHTML output"
    assert not report["merrors"], f"{docname}: MathJax errors: {report['merrors'][:5]}"
    fonts = dict(report["mjx_fonts"])
    assert any(s == "loaded" for s in fonts.values()), f"{docname}: no MathJax font loaded: {fonts}"
    assert not [f for f, s in fonts.items() if s == "error"], f"{docname}: MathJax fonts failed: {fonts}"


@pytest.mark.parametrize("docname", PAGES)
def test_images_load(reports, docname):
    report = reports[docname][0]
    broken = [i["src"] for i in report["images"] if not (i["complete"] and i["width"] > 0)]
    assert not broken, f"{docname}: images that did not load: {broken}"


@pytest.mark.parametrize("docname", PAGES)
def test_colab_links_open_files_of_the_repository(reports, docname):
    report = reports[docname][0]
    colab = [link["href"] for link in report["links"] if COLAB_PATH.match(link["href"])]
    if source_of(docname).suffix == ".ipynb":
        assert colab, f"{docname}: a chapter needs a Colab launch link"
        own = f"{Path(docname).name}.ipynb"
        assert any(h.endswith("/" + own) for h in colab), f"{docname}: no Colab link to {own}: {colab}"
    missing = [h for h in colab if not (REPO / COLAB_PATH.match(h).group(1)).is_file()]
    assert not missing, f"{docname}: Colab links to files not in the repository: {missing}"


def test_bibliography_renders_every_citation(reports, base_url):
    bib = reports[BIBLIOGRAPHY_PAGE][0]
    entries = {c["id"]: c["text"] for c in bib["citations"]}
    assert entries, "the bibliography page lists no entry"
    # every entry is dated: a year, or "n.d." for the undated notes the book cites as sources
    assert all(re.search(r"(19|20)\d\d|n\.d\.", text) for text in entries.values()), entries
    bib_url = page_url(base_url, BIBLIOGRAPHY_PAGE)
    cited = {}
    for docname, (report, *_) in reports.items():
        for link in report["links"]:
            url, anchor = urldefrag(link["href"])
            if url == bib_url and anchor in entries:
                cited.setdefault(anchor, set()).add(docname)
            elif url == bib_url and anchor and docname != BIBLIOGRAPHY_PAGE:
                pytest.fail(f"{docname}: citation link {link['href']} has no bibliography entry")
    assert cited, "no page cites the bibliography"
    assert "intro" in {d for ds in cited.values() for d in ds}, "the introduction cites no work"
    # The bibliography holds the cited works only: each of its entries is cited somewhere.
    uncited = sorted(set(entries) - set(cited))
    assert not uncited, f"bibliography entries cited by no page: {[entries[u][:60] for u in uncited]}"
