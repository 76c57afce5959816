"""MkDocs hook: let a list start right after a paragraph line.

The docstrings follow diffrax's style, `**Arguments:**` directly followed by `- ...` items
without a blank line. Python-Markdown would fold those items into the paragraph, so this
preprocessor inserts the blank line, for the pages and for the docstrings mkdocstrings
renders (it reuses the site's Markdown extensions).
"""

import re

from markdown import Extension
from markdown.preprocessors import Preprocessor

_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+\S")
_FENCE = re.compile(r"^\s*(```|~~~)")


class _BlankLineBeforeLists(Preprocessor):
    def run(self, lines):
        out, in_fence = [], False
        for line in lines:
            if _FENCE.match(line):
                in_fence = not in_fence
            elif (
                not in_fence
                and _ITEM.match(line)
                and out
                and out[-1].strip()
                and not _ITEM.match(out[-1])
                and not out[-1].startswith((" ", "\t", "|", ">"))
            ):
                out.append("")
            out.append(line)
        return out


class BlankLineBeforeLists(Extension):
    def extendMarkdown(self, md):
        md.preprocessors.register(_BlankLineBeforeLists(md), "blank_line_before_lists", 35)


def on_config(config, **kwargs):
    config.markdown_extensions.append(BlankLineBeforeLists())
    return config
