"""The documentation's offline machinery, without building the site or starting a browser.

`make docs-check` runs the full check on the built site in headless Chromium; these tests pin
the pieces it relies on: the figure-link hook, the static checks of `check_site.py` and what
its browser part reports, each on a small hand-written page whose right answer is known (the
one test that starts Chromium is skipped without Playwright and a system Chromium).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(relpath, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str((ROOT / relpath).parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


figures = _load("docs/_hooks/figures.py", "docs_hook_figures")
check_site = _load("docs/_check/check_site.py", "docs_check_site")


def test_figure_hook_links_each_image_to_itself():
    html = ('<p><img alt="a" src="../figures/a.png" /></p>'
            '<p><a href="x.html"><img src="b.png"></a></p>'
            '<p>text <img src="c.svg" alt="c"> more</p>')
    out = figures.on_page_content(html, page=None, config=None, files=None)
    assert '<a class="fd-figure" href="../figures/a.png" title="Open full size">' \
           '<img alt="a" src="../figures/a.png" /></a>' in out
    assert ('<a class="fd-figure" href="c.svg" title="Open full size">'
            '<img src="c.svg" alt="c"></a>') in out
    # an image already inside a link keeps that link and gets no second one
    assert '<a href="x.html"><img src="b.png"></a>' in out
    assert out.count("fd-figure") == 2


def _site(tmp_path, pages, files=()):
    for rel, text in {**pages, **dict(files)}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


_CLEAN = """<html><head><link rel="stylesheet" href="assets/main.css">
<script src="js/app.js"></script></head><body>
<a href="guides/a.html#intro">A</a> <a href="#top">top</a> <a href="https://example.org/">out</a>
<img src="figures/f.png"><h1 id="top">T</h1></body></html>"""


def test_static_checks_pass_a_clean_site(tmp_path):
    site = _site(tmp_path, {
        "index.html": _CLEAN,
        "guides/a.html": '<h2 id="intro">I</h2><a href="../index.html">home</a>',
    }, files={"assets/main.css": "body{background:url(../figures/f.png)}",
              "js/app.js": "// see https://github.com/o/r/blob/main/x.js\n",
              "figures/f.png": "png"})
    failures, external = check_site.static_checks(site)
    assert failures == [] and external == 0


@pytest.mark.parametrize("page, css, expected", [
    ('<script src="https://unpkg.com/mathjax@3/es5/tex-mml-chtml.js"></script>', "",
     "fetches https://unpkg.com/mathjax@3/es5/tex-mml-chtml.js"),
    ('<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>', "",
     "fetches https://fonts.gstatic.com"),
    ('<link rel="stylesheet" href="assets/main.css">',
     "@import 'https://fonts.googleapis.com/css?family=Roboto';",
     "fetches https://fonts.googleapis.com/css?family=Roboto"),
    ('<link rel="stylesheet" href="assets/main.css">', "@font-face{src:url(//cdn.example/f.woff2)}",
     "fetches //cdn.example/f.woff2"),
    ('<img src="http://example.org/a.png">', "", "fetches http://example.org/a.png"),
    ('<div style="background:url(https://example.org/b.png)"></div>', "",
     "fetches https://example.org/b.png"),
])
def test_static_checks_find_external_fetches(tmp_path, page, css, expected):
    site = _site(tmp_path, {"index.html": page}, files={"assets/main.css": css})
    failures, external = check_site.static_checks(site)
    assert external == 1
    assert [f.split(": ", 1)[1] for f in failures] == [expected]


def test_static_checks_find_cdn_assets_in_scripts(tmp_path):
    site = _site(tmp_path, {"index.html": '<script src="a.js"></script>'}, files={
        "a.js": 'load("https://cdn.jsdelivr.net/npm/katex/dist/katex.min.js");'
                'if(!window.ResizeObserver)load("https://unpkg.com/resize-observer-polyfill")'})
    failures, external = check_site.static_checks(site)
    # the polyfill is fetched only by browsers without ResizeObserver: allowed, stated in the check
    assert failures == ["a.js: may fetch https://cdn.jsdelivr.net/npm/katex/dist/katex.min.js"]


@pytest.mark.parametrize("href, expected", [
    ("guides/", "guides/ is a directory (a listing when opened from disk)"),
    ("guides/b.html", "guides/b.html does not exist"),
    ("guides/a.html#nowhere", "guides/a.html#nowhere names a missing anchor"),
    ("#nowhere", "#nowhere names a missing anchor"),
    ("../outside.html", "../outside.html leaves the site"),
])
def test_static_checks_find_broken_links(tmp_path, href, expected):
    site = _site(tmp_path / "site", {
        "index.html": f'<a href="{href}">x</a>',
        "guides/a.html": '<h2 id="intro">I</h2>',
    })
    (tmp_path / "outside.html").write_text("x")
    failures, _ = check_site.static_checks(site)
    assert failures == [f"index.html: {expected}"]


def test_the_404_page_may_link_from_the_root(tmp_path):
    # a server shows 404.html for any missing path, so the theme writes root-absolute links
    site = _site(tmp_path, {"index.html": "x", "404.html": '<a href="/index.html">home</a>'})
    assert check_site.static_checks(site) == ([], 0)


class _FakeRoute:
    def __init__(self, url):
        self.request = type("Request", (), {"url": url})()
        self.outcome = None

    def continue_(self):
        self.outcome = "continued"

    def abort(self):
        self.outcome = "aborted"


@pytest.mark.parametrize("url, outcome, lines", [
    ("file:///site/index.html", "continued", []),
    ("data:image/png;base64,AAAA", "continued", []),
    ("https://cdn.example/x.js", "aborted", ["requested https://cdn.example/x.js"]),
    ("http://127.0.0.1:8000/", "aborted", ["requested http://127.0.0.1:8000/"]),
])
def test_the_browser_stops_and_reports_every_request_off_disk(url, outcome, lines):
    watch = check_site._Watch()
    route = _FakeRoute(url)
    watch.route(route)
    assert (route.outcome, watch.take()) == (outcome, lines)
    assert watch.take() == []  # taken once, per page


def test_the_speech_step_forgives_only_the_refused_speech_rules():
    rules = "file:///s/javascripts/mathjax/sre/mathmaps/base.json"
    lines = [f"a local file failed to load (net::ERR_FAILED: {rules})",
             "script error: SyntaxError: Unexpected end of JSON input",
             "a local file failed to load (net::ERR_FILE_NOT_FOUND: file:///s/a11y/sre.js)",
             "requested https://cdn.jsdelivr.net/npm/speech-rule-engine@4/lib/mathmaps/en.json"]
    assert check_site._speech_lines(lines) == lines[2:]


_browser = pytest.mark.skipif(
    check_site.sync_playwright is None or check_site.find_chromium() is None,
    reason="needs Playwright and a system Chromium (make docs-check installs Playwright)")


@_browser
def test_the_browser_check_reports_what_a_page_did(tmp_path):
    # a site without MathJax: the speech steps fail too, and only this page's lines are asserted
    page = ('<html><body><article><p>x</p></article>'
            '<script>fetch("https://example.org/t.js").catch(() => 0); null.x;</script>'
            '<script src="nowhere.js"></script></body></html>')
    site = _site(tmp_path, {"index.html": "<html><body>home</body></html>",
                            "math.html": "<html><body>m</body></html>", "bad.html": page})
    shot = tmp_path / "shot.png"
    with check_site.sync_playwright() as playwright:
        with playwright.chromium.launch(executable_path=check_site.find_chromium()) as browser:
            failures, counts, _ = check_site.browser_checks(site, browser, shot)
    mine = sorted(f for f in failures if f.startswith("bad.html"))
    assert mine == [
        f"bad.html: a local file failed to load (net::ERR_FILE_NOT_FOUND: "
        f"{(site / 'nowhere.js').resolve().as_uri()})",
        "bad.html: requested https://example.org/t.js",
        "bad.html: script error: TypeError: Cannot read properties of null (reading 'x')",
    ]
    assert set(counts) == {"bad.html", "index.html", "math.html"}
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
