"""MkDocs hook: the built site needs no network, opened from disk or served.

- MathJax is served from the site. Its files come from the `django-static-mathjax` package (in
  the `docs` extra; MathJax 3.2.2 under the Apache-2.0 licence, no Django dependency). After
  each build the TeX component and what it loads on demand (TeX extensions, its fonts, the
  menu and its accessibility tools) are copied to `javascripts/mathjax/`, where `mkdocs.yml`'s
  `extra_javascript` points.
- Material's `offline` plugin makes the search work from `file://` but adds its Web Worker shim
  from a CDN; the hook swaps in the copy in `docs/javascripts/`.
"""

import importlib.util
import shutil
from pathlib import Path

from mkdocs.exceptions import PluginError

_DEST = Path("javascripts") / "mathjax"
_COMPONENT = "tex-chtml.js"
# what the component fetches after start-up: autoloaded TeX packages, fonts, the context menu
_ON_DEMAND = ["input", "output/chtml", "ui", "a11y", "sre"]
_WORKER_SHIM = "javascripts/iframe-worker-shim.js"


def _mathjax_root() -> Path:
    spec = importlib.util.find_spec("mathjax")
    for location in (spec.submodule_search_locations or []) if spec else []:
        root = Path(location) / "static" / "mathjax" / "es5"
        if (root / _COMPONENT).is_file():
            return root
    raise PluginError(
        "MathJax files not found: install the docs extra, `pip install -e '.[docs]'` "
        "(it brings the django-static-mathjax package)."
    )


def on_config(config, **kwargs):
    _mathjax_root()  # fail before building, not after
    polyfills = config.extra.get("polyfills", [])
    config.extra["polyfills"] = [
        _WORKER_SHIM if "iframe-worker" in str(p) else p for p in polyfills
    ]
    return config


def on_post_build(config, **kwargs):
    root = _mathjax_root()
    dest = Path(config.site_dir) / _DEST
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / _COMPONENT, dest / _COMPONENT)
    for sub in _ON_DEMAND:
        shutil.copytree(root / sub, dest / sub, dirs_exist_ok=True)
    shutil.copy2(root.parent / "LICENSE", dest / "LICENSE")
