"""MkDocs hook: let a list start right after a paragraph line.

The docstrings follow diffrax's style, `**Arguments:**` directly followed by `- ...` items
without a blank line. Python-Markdown would fold those items into the paragraph, so this
preprocessor inserts the blank line, for the pages and for the docstrings mkdocstrings
renders (it reuses the site's Markdown extensions). Lines inside code fences, display math
or an open inline `$...$` are left alone, so a formula wrapped before a `-` stays whole.
"""

import re

from markdown import Extension
from markdown.preprocessors import Preprocessor

_ITEM = re.compile(r"^\s*(?:-|\d+\.)\s+\S")
_FENCE = re.compile(r"^\s*(```|~~~)")
_DOLLAR = re.compile(r"(?<!\\)\$")


class _BlankLineBeforeLists(Preprocessor):
    def run(self, lines):
        out, in_fence, in_display, inline_open = [], False, False, False
        for line in lines:
            stripped = line.strip()
            if _FENCE.match(line):
                in_fence = not in_fence
            elif in_fence:
                pass
            elif stripped == "$$" or (stripped.startswith("$$") and not stripped.endswith("$$")):
                in_display = not in_display
            elif stripped.startswith("$$") and stripped.endswith("$$") and len(stripped) > 2:
                pass
            elif in_display:
                pass
            else:
                if not stripped:
                    inline_open = False
                elif (
                    not inline_open
                    and _ITEM.match(line)
                    and out
                    and out[-1].strip()
                    and not _ITEM.match(out[-1])
                    and not out[-1].startswith((" ", "\t", "|", ">"))
                ):
                    out.append("")
                if len(_DOLLAR.findall(line.replace("$$", ""))) % 2:
                    inline_open = not inline_open
            out.append(line)
        return out


class BlankLineBeforeLists(Extension):
    def extendMarkdown(self, md):
        md.preprocessors.register(_BlankLineBeforeLists(md), "blank_line_before_lists", 35)


def on_config(config, **kwargs):
    config.markdown_extensions.append(BlankLineBeforeLists())
    return config
