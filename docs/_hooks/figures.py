"""MkDocs hook: a figure opens full size on click.

The study figures are drawn at about 2,000 px and shown at the text width, so each image in a
page's content is wrapped in a link to its own file, unless it already sits inside a link.
"""

import re

_IMG = re.compile(r"<img\b[^>]*>")
_SRC = re.compile(r'\bsrc="([^"]+)"')
_OPEN_A = re.compile(r"<a[\s>]")


def _inside_link(html: str, pos: int) -> bool:
    before = html[:pos]
    last_open = max((m.start() for m in _OPEN_A.finditer(before)), default=-1)
    return last_open > before.rfind("</a>")


def on_page_content(html, page, config, files, **kwargs):
    out, last = [], 0
    for m in _IMG.finditer(html):
        src = _SRC.search(m.group(0))
        if src is None or _inside_link(html, m.start()):
            continue
        out += [html[last:m.start()],
                f'<a class="fd-figure" href="{src.group(1)}" title="Open full size">',
                m.group(0), "</a>"]
        last = m.end()
    out.append(html[last:])
    return "".join(out)
