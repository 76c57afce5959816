"""MkDocs hook: the studies page quotes the committed figure JSON.

`docs/guides/studies.md` holds the prose; each `<!-- study: NAME -->` marker is replaced at
build time by that study's figures, caption, headline and recorded comparisons, read from
`figures/NAME.json`, so the page cannot drift from the files the studies write.
"""

import json
import math
import re
from pathlib import Path

_MARKER = re.compile(r"^<!-- study: (\w+) -->$", re.M)


def _fmt(x):
    if x is None:
        return "—"
    if isinstance(x, bool) or isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if x == 0:
            return "0"
        return f"{x:.4g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.2e}"
    return str(x).replace("|", "\\|")


def _study(root: Path, name: str) -> str:
    data = json.loads((root / "figures" / f"{name}.json").read_text())
    lines = [f"![{data['title']}](../figures/{image})\n" for image in data["images"]]
    lines += [data["caption"], ""]
    lines += [f"- {text}" for text in data["headline"].values()] + [""]
    comparisons = data["comparisons"]
    lines += [
        f'??? info "The {len(comparisons)} recorded comparisons"',
        "",
        "    | quantity | measured | predicted | tolerance | holds |",
        "    |---|---|---|---|---|",
    ]
    for c in comparisons:
        key = c["key"] + (f" ({c['explain']})" if c.get("explain") else "")
        holds = "note" if c["kind"] == "note" else ("yes" if c["ok"] else "**no**")
        lines.append(
            f"    | {key.replace('|', chr(92) + '|')} | {_fmt(c['measured'])} | "
            f"{_fmt(c['predicted'])} | {_fmt(c['tol'])} | {holds} |"
        )
    lines.append("")
    bad = [c for c in comparisons if c["kind"] != "note" and not c["ok"]]
    if bad:
        lines += ["Recorded disagreements with the expectation:", ""]
        lines += [f"- {c['key']}: measured {_fmt(c['measured'])}, expected "
                  f"{_fmt(c['predicted'])}" for c in bad]
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != "guides/studies.md":
        return markdown
    root = Path(config.config_file_path).parent
    return _MARKER.sub(lambda m: _study(root, m.group(1)), markdown)
