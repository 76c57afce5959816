"""Check the built documentation the way a reader without a network opens it: from disk.

    python docs/_check/check_site.py [SITE_DIR] [--screenshot PATH]

Without a browser:
- no `http(s)://` (or protocol-relative) URL of a script, stylesheet, font, image or frame in
  any HTML or CSS file, and none in the shipped JavaScript beyond the ones it fetches only under
  conditions this site does not meet (each named below with its condition);
- every internal link, script, stylesheet and image of every page names a file that exists
  (a page, not a directory), and every `#anchor` exists in its target page.

In the system's headless Chromium, driven by Playwright, with every request outside
`file:`/`data:`/`blob:` stopped (and every host name unresolvable), each page opened from
`file://`:
- no request leaves `file:`/`data:`/`blob:`, no local file fails to load, no script error;
- every formula is typeset: each `arithmatex` element holds an `mjx-container`, no raw `\\(`
  is left, no TeX error (`mjx-merror`);
- a table wider than the text column scrolls inside exactly one scroll container, and one that
  fits has none; every content image loaded and links to its own file;
- on the first page, the search answers a query;
- turning on MathJax's speech explorer fetches nothing from the network, and the next page
  still renders its formulas;
- the mathematics page is saved as a screenshot (1280 x 2000).

Exit status 0 when everything holds, 1 with one line per failure otherwise, 2 when Chromium
or Playwright is missing (`make docs-check` installs Playwright; it never downloads a browser).
"""

import argparse
import re
import shutil
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:  # the static checks (and their tests) run without it
    sync_playwright = None

_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.I)
_JS_ASSET = re.compile(
    r"""https?://[^\s"'`)]*?(?:\.(?:js|mjs|css|woff2?|ttf|otf|eot)\b|"""
    r"""unpkg\.com/[^\s"'`)]+|cdn\.jsdelivr\.net/[^\s"'`)]+|"""
    r"""fonts\.(?:googleapis|gstatic)\.com[^\s"'`)]*)"""
)
# URLs in the shipped JavaScript that are fetched only under a condition, and why it never holds
_CONDITIONAL = {
    "https://unpkg.com/mermaid@11/": "the theme, for a page with a mermaid diagram (none here)",
    "https://unpkg.com/resize-observer-polyfill": "the theme, in a browser without ResizeObserver",
    "https://cdn.jsdelivr.net/npm/speech-rule-engine@": (
        "MathJax's speech, unless told its local path, which MathJax does (checked in the browser)"
    ),
    "https://cdn.jsdelivr.net/npm/wicked-good-xpath@": "MathJax's speech, without XPath",
    "https://cdn.jsdelivr.net/npm/sre-mathmaps-ie@": "MathJax's speech, in Internet Explorer",
}
_SOURCE_LINK = re.compile(r"^https://github\.com/[^/]+/[^/]+/blob/")  # a comment citing source
# attributes that make the browser fetch something
_FETCHING = {
    "script": ("src",), "img": ("src", "srcset"), "source": ("src", "srcset"),
    "iframe": ("src",), "frame": ("src",), "embed": ("src",), "object": ("data",),
    "audio": ("src",), "video": ("src", "poster"), "track": ("src",), "input": ("src",),
}
_LINK_FETCHING_RELS = {"stylesheet", "preload", "prefetch", "preconnect", "dns-prefetch",
                       "modulepreload", "icon", "manifest", "apple-touch-icon"}
_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
_SPEECH_RULES = "/javascripts/mathjax/sre/mathmaps/"


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fetched, self.links, self.ids, self.styles = [], [], set(), []
        self.mermaid = False
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = {k: (v or "") for k, v in attrs}
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if "mermaid" in attrs.get("class", "").split():
            self.mermaid = True
        if attrs.get("style"):
            self.styles.append(attrs["style"])
        for attr in _FETCHING.get(tag, ()):
            if attrs.get(attr):
                for part in attrs[attr].split(","):
                    self.fetched.append(part.strip().split(" ")[0])
        if tag == "link" and attrs.get("href"):
            rels = set(attrs.get("rel", "").lower().split())
            if rels & _LINK_FETCHING_RELS:
                self.fetched.append(attrs["href"])
            else:
                self.links.append(attrs["href"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def _css_urls(text):
    return [a or b for a, b in _CSS_URL.findall(text)]


def static_checks(site: Path):
    """The no-browser checks; returns (failures, number of external fetch URLs found)."""
    failures, external = [], 0
    pages = {p: _parse(p) for p in sorted(site.rglob("*.html"))}
    for path, page in pages.items():
        rel = path.relative_to(site)
        for url in page.fetched + [u for s in page.styles for u in _css_urls(s)]:
            if _EXTERNAL.match(url) and not url.lower().startswith(("data:", "blob:")):
                external += 1
                failures.append(f"{rel}: fetches {url}")
        if page.mermaid:
            failures.append(f"{rel}: has a mermaid diagram, which the theme loads from a CDN")
    for path in sorted(site.rglob("*.css")):
        for url in _css_urls(path.read_text(encoding="utf-8", errors="replace")):
            if _EXTERNAL.match(url):
                external += 1
                failures.append(f"{path.relative_to(site)}: fetches {url}")
    for path in sorted(site.rglob("*.js")):
        for url in set(_JS_ASSET.findall(path.read_text(encoding="utf-8", errors="replace"))):
            if _SOURCE_LINK.match(url) or url.startswith(tuple(_CONDITIONAL)):
                continue
            external += 1
            failures.append(f"{path.relative_to(site)}: may fetch {url}")
    failures += _link_checks(site, pages)
    return failures, external


def _link_checks(site: Path, pages):
    failures, root = [], site.resolve()
    pages = {p.resolve(): page for p, page in pages.items()}
    for path, page in pages.items():
        if path.name == "404.html":
            continue  # served by a web server for any missing path, so its links are absolute
        rel = path.relative_to(root)
        for href in page.links + page.fetched:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
            if not target.is_relative_to(root):
                failures.append(f"{rel}: {href} leaves the site")
                continue
            if target.is_dir():
                failures.append(f"{rel}: {href} is a directory (a listing when opened from disk)")
                continue
            if not target.is_file():
                failures.append(f"{rel}: {href} does not exist")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                if fragment not in pages.get(target, _parse(target)).ids:
                    failures.append(f"{rel}: {href} names a missing anchor")
    return failures


_PAGE_STATE = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    // a hung start-up shows as untypeset formulas, not as a stuck check
    await Promise.race([MathJax.startup.promise, new Promise(r => setTimeout(r, 20000))]);
  }
  // the theme typesets again on its document$ signal; wait until the count stops changing
  let last = -1;
  for (let i = 0; i < 50; i++) {
    const n = document.querySelectorAll("mjx-container").length;
    if (n === last) break;
    last = n;
    await new Promise(r => setTimeout(r, 100));
  }
  await document.fonts.ready;
  const fontErrors = [...document.fonts].filter(f => f.status === "error").map(f => f.family);
  const math = [...document.querySelectorAll(".arithmatex")];
  const article = document.querySelector("article") || document.body;
  const column = article.getBoundingClientRect();
  const scrolls = el => {
    const s = getComputedStyle(el);
    return ["auto", "scroll"].includes(s.overflowX) && el.scrollWidth > el.clientWidth + 1;
  };
  const tables = [...article.querySelectorAll("table")].map(t => {
    let scrollers = 0;
    for (let el = t; el && el !== article; el = el.parentElement) scrollers += scrolls(el);
    return {wide: t.scrollWidth > column.width + 1, scrollers: scrollers,
            head: (t.querySelector("th, td") || {}).textContent || ""};
  });
  const images = [...article.querySelectorAll("img")].map(img => ({
    src: img.getAttribute("src"),
    loaded: img.complete && img.naturalWidth > 0,
    linked: !!(img.closest("a") && img.closest("a").href === img.src),
  }));
  return {
    arithmatex: math.length,
    containers: document.querySelectorAll("mjx-container").length,
    untypeset: math.filter(el => !el.querySelector("mjx-container")).length,
    raw: math.filter(el => /\\\(|\\\[/.test(el.textContent)).length,
    errors: document.querySelectorAll("mjx-merror").length,
    nested: document.querySelectorAll("mjx-container mjx-container").length,
    // laid out (not in a closed block) yet zero wide: typeset, but its styles are missing
    blank: [...document.querySelectorAll(".arithmatex > mjx-container")].filter(
      c => c.getClientRects().length > 0 && c.getBoundingClientRect().width === 0).length,
    fontErrors: fontErrors,
    tables: tables,
    images: images,
  };
}
"""

_SEARCH = r"""
async () => {
  const input = document.querySelector("input[data-md-component=search-query]");
  const toggle = document.getElementById("__search");
  if (!input || !toggle) return "no search box";
  // opened from disk, the theme starts its search only once the search dialog opens
  toggle.checked = true;
  toggle.dispatchEvent(new Event("change"));
  for (let i = 0; i < 100; i++) {
    input.value = "entropy";
    input.dispatchEvent(new Event("focus"));
    input.dispatchEvent(new KeyboardEvent("keyup", {key: "y"}));
    input.dispatchEvent(new Event("input"));
    await new Promise(r => setTimeout(r, 100));
    const hits = document.querySelectorAll(".md-search-result__item").length;
    if (hits > 0) return hits;
  }
  return (document.querySelector(".md-search-result__meta") || {}).textContent || "no results";
}
"""


_SPEECH = r"""
async () => {
  const doc = window.MathJax && MathJax.startup && MathJax.startup.document;
  if (!doc || !doc.menu) return "MathJax did not start";
  doc.menu.menu.pool.lookup("explorer").setValue(true);
  for (let i = 0; i < 100 && !(MathJax._.a11y && MathJax._.a11y.sre); i++) {
    await new Promise(r => setTimeout(r, 100));
  }
  await new Promise(r => setTimeout(r, 1000));
}
"""


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Watch:
    """What the open page did that a page read from disk must not: its lines, taken per page."""

    def __init__(self):
        self.lines = []

    def route(self, route):
        url = route.request.url
        if url.startswith(_LOCAL_SCHEMES):
            route.continue_()
        else:
            self.lines.append(f"requested {url}")
            route.abort()

    def request_failed(self, request):
        # an outside request is reported above when stopped; a cancelled one is no fault
        if request.url.startswith(_LOCAL_SCHEMES) and request.failure != "net::ERR_ABORTED":
            self.lines.append(f"a local file failed to load ({request.failure}: {request.url})")

    def page_error(self, error):
        self.lines.append(f"script error: {error.name}: {error.message}".splitlines()[0])

    def take(self):
        lines, self.lines = self.lines, []
        return lines


def _speech_lines(lines):
    """The speech step's lines, less what opening from disk costs by design: the browser refuses
    the speech rules (data files, read with XMLHttpRequest) and the refusal surfaces as a script
    error; `javascripts/mathjax.js` then keeps the next page's formulas rendering."""
    return [line for line in lines if not line.startswith("script error:")
            and not (line.startswith("a local file failed") and _SPEECH_RULES in line)]


def browser_checks(site: Path, browser, screenshot: Path):
    """The checks in the browser; returns (failures, each page's state, search hits)."""
    failures, counts, hits = [], {}, None
    watch = _Watch()
    with browser.new_context(viewport={"width": 1280, "height": 2000},
                             device_scale_factor=1) as context:
        context.route("**/*", watch.route)
        page = context.new_page()
        page.on("requestfailed", watch.request_failed)
        page.on("pageerror", watch.page_error)

        def open_page(rel):
            watch.take()
            page.goto((site / rel).resolve().as_uri(), wait_until="load", timeout=60_000)
            return page.evaluate(_PAGE_STATE)

        for path in sorted(site.rglob("*.html")):
            rel = path.relative_to(site).as_posix()
            if rel == "404.html":
                continue  # only a web server shows it, with absolute links
            state = counts[rel] = open_page(rel)
            failures += [f"{rel}: {line}" for line in watch.take()]
            failures += _page_failures(rel, state)
            if rel == "index.html":
                hits = page.evaluate(_SEARCH)
                if not isinstance(hits, int):
                    failures.append(f"{rel}: the search found nothing for 'entropy' ({hits})")
                failures += [f"{rel} (search): {line}" for line in watch.take()]
            if rel == "math.html":
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=screenshot)
        # last, since the menu remembers the setting: MathJax's speech loads its rules on
        # demand, and they must come from the site
        open_page("math.html")
        watch.take()
        speech = page.evaluate(_SPEECH)
        if speech:
            failures.append(f"math.html: the speech explorer could not be turned on: {speech}")
        failures += [f"math.html (speech): {line}" for line in _speech_lines(watch.take())]
        # and with the explorer remembered as on, the next page still renders its formulas
        state = open_page("index.html")
        if state["untypeset"] or not state["arithmatex"]:
            failures.append(f"index.html, after the speech explorer was turned on: "
                            f"{state['untypeset']} of {state['arithmatex']} formulas not typeset")
        failures += [f"index.html (after speech): {line}" for line in watch.take()]
    return failures, counts, hits


def _page_failures(rel, state):
    failures = []
    if state["untypeset"] or state["raw"] or state["errors"]:
        failures.append(
            f"{rel}: {state['untypeset']} of {state['arithmatex']} formulas not typeset, "
            f"{state['raw']} with raw TeX left, {state['errors']} TeX errors"
        )
    if state["fontErrors"]:
        failures.append(f"{rel}: fonts failed to load: {', '.join(state['fontErrors'])}")
    if state["blank"]:
        failures.append(f"{rel}: {state['blank']} typeset formulas are blank (no width)")
    if state["nested"]:
        failures.append(f"{rel}: {state['nested']} formulas typeset twice (one inside another)")
    for table in state["tables"]:
        if table["scrollers"] != (1 if table["wide"] else 0):
            width = "wider" if table["wide"] else "narrower"
            failures.append(
                f"{rel}: table '{table['head'].strip()}' ({width} than the column) has "
                f"{table['scrollers']} horizontal scroll containers"
            )
    for image in state["images"]:
        if not image["loaded"]:
            failures.append(f"{rel}: image {image['src']} did not load")
        if not image["linked"]:
            failures.append(f"{rel}: image {image['src']} does not link to its full-size file")
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default="site", type=Path)
    parser.add_argument(
        "--screenshot", type=Path,
        default=Path(tempfile.gettempdir()) / "fisherdyn-docs-check" / "math.png",
    )
    parser.add_argument("--chromium", help="the browser to drive (default: chromium on PATH)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"error: {args.site}/index.html not found: build the site first (make docs)")
        return 2
    chromium = args.chromium or find_chromium()
    if chromium is None:
        print("error: Chromium not found: install it (Debian: apt-get install chromium)")
        return 2
    if sync_playwright is None:
        print("error: Playwright not installed: run make docs-check, "
              "or pip install -e '.[docs-check]'")
        return 2

    start = time.monotonic()
    failures, external = static_checks(args.site)
    pages = len(list(args.site.rglob("*.html")))
    print(f"static: {pages} pages, {external} external fetch URLs, "
          f"{len(failures)} failures")
    with sync_playwright() as playwright:
        try:
            # the host-resolver rule backs up the route for anything it cannot see
            browser = playwright.chromium.launch(
                executable_path=chromium, args=["--host-resolver-rules=MAP * ~NOTFOUND"])
        except PlaywrightError as exc:
            print(f"error: {chromium} did not start under Playwright: "
                  f"{str(exc).strip().splitlines()[0]}")
            return 2
        with browser:
            browser_failures, counts, hits = browser_checks(args.site, browser, args.screenshot)
    failures += browser_failures
    formulas = sum(c["arithmatex"] for c in counts.values())
    typeset = sum(c["arithmatex"] - c["untypeset"] for c in counts.values())
    math = counts.get("math.html", {"arithmatex": 0, "untypeset": 0, "containers": 0})
    print(f"browser: {len(counts)} pages from file://, {typeset} of {formulas} formulas typeset;"
          f" math page: {math['arithmatex'] - math['untypeset']} of {math['arithmatex']}"
          f" ({math['containers']} mjx-container); search hits for 'entropy': {hits}")
    print(f"screenshot of the math page: {args.screenshot}")
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{'ok' if not failures else f'{len(failures)} failures'} "
          f"in {time.monotonic() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
