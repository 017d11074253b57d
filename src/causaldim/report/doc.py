"""A report as a list of blocks (headings, paragraphs, lists, tables, figures), written
out both as Markdown and as self-contained HTML."""

from __future__ import annotations

import base64
import html
import re
from functools import lru_cache
from pathlib import Path

# a cell of figures (counts, ratios, intervals, growth factors), set right; prose left
NUMERIC = re.compile(r"(?:[-+x]?[\d.,]+%?|n/a|\[[^\]]*\]|[\s*/()<>=-])+")


@lru_cache(maxsize=1)
def _renderer():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False})


def inline(text: str) -> str:
    """A block's text, its Markdown (bold, code, links) rendered, anything else escaped."""
    return _renderer().renderInline(text)


def _cell_md(cell: str) -> str:
    return cell.replace("|", "\\|")  # a bar inside a cell would end it


class Doc:
    """A report as a list of blocks, written out both as Markdown and as HTML."""

    def __init__(self):
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def ul(self, items: list[str]):
        if items:
            self.blocks.append(("ul", items))

    def table(self, header: list[str], rows: list[list]):
        self.blocks.append(("table", header, [[str(c) for c in r] for r in rows]))

    def img(self, path: Path, alt: str):
        self.blocks.append(("img", path, alt))

    def markdown(self, base: Path) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "ul":
                out.append("\n".join(f"- {x}" for x in b[1]))
            elif b[0] == "table":
                out.append(
                    "\n".join(
                        "| " + " | ".join(map(_cell_md, r)) + " |"
                        for r in [b[1], ["---"] * len(b[1]), *b[2]]
                    )
                )
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1].relative_to(base).as_posix()})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        """A whole page, its figures inlined so that the file travels alone."""
        return "\n".join(
            [
                "<!doctype html><html><head><meta charset='utf-8'>",
                f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;"
                "max-width:1180px;margin:2em auto;line-height:1.45}table{border-collapse:"
                "collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:"
                "left;vertical-align:top}td.n{text-align:right;white-space:nowrap}th{background:"
                "#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 2px;font-size:85%}"
                ".wide{max-width:100%;overflow-x:auto}"
                "</style></head><body>",
                self.html_body(),
                "</body></html>\n",
            ]
        )

    def html_body(self) -> str:
        """The blocks as an HTML fragment (a notebook cell's display)."""
        e = html.escape
        out = []
        for b in self.blocks:
            if b[0] == "h":  # the anchor Markdown's readers (GitHub) give it too
                anchor = re.sub(r"[^\w\- ]", "", b[2].lower()).strip().replace(" ", "-")
                out.append(f"<h{b[1]} id='{e(anchor)}'>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "ul":
                out.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b[1]) + "</ul>")
            elif b[0] == "table":
                head = "".join(f"<th>{inline(c)}</th>" for c in b[1])
                body = "".join(
                    "<tr>"
                    + "".join(
                        f"<td class='n'>{inline(c)}</td>"
                        if NUMERIC.fullmatch(c)
                        else f"<td>{inline(c)}</td>"
                        for c in r
                    )
                    + "</tr>"
                    for r in b[2]
                )
                # a wide table scrolls inside the page instead of running off its edge
                out.append(f"<div class='wide'><table><tr>{head}</tr>{body}</table></div>")
            elif b[0] == "img":
                data = base64.b64encode(b[1].read_bytes()).decode()
                out.append(f"<img alt='{e(b[2])}' src='data:image/png;base64,{data}'>")
        return "\n".join(out)
