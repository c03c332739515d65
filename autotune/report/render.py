"""A report as data (sections of text, tables and images) and its Markdown and HTML forms.

The builders (:mod:`autotune.report.build`, :mod:`autotune.report.crossstudy`) decide
*what* a report says; this module only decides how it looks. Images are links relative
to the report file, so a report directory can be moved, zipped or served as it is.

>>> r = Report("t", meta=["study: demo"], sections=[Section("A", [Text("x < y")])])
>>> print(render(r, "md").splitlines()[0])
# t
>>> "x &lt; y" in render(r, "html")
True
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

import pandas as pd

__all__ = ["Text", "Table", "Image", "Code", "Section", "Report", "render", "FORMATS"]

FORMATS = ("md", "html")


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    caption: str = ""


@dataclass(frozen=True)
class Image:
    src: str
    """Path relative to the report file."""
    alt: str


@dataclass(frozen=True)
class Code:
    text: str


Block = Text | Table | Image | Code


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
    anchor: str = ""

    def __post_init__(self) -> None:
        if not self.anchor:
            self.anchor = "-".join(re.sub(r"[^a-z0-9 -]", "", self.title.lower()).split())


@dataclass
class Report:
    title: str
    meta: list[str] = field(default_factory=list)
    """Lines under the title: what, where, when."""
    sections: list[Section] = field(default_factory=list)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is pd.NA or value is pd.NaT:
        return ""
    return str(value)


def _md_table(frame: pd.DataFrame) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(esc(str(c)) for c in frame.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---"
                          for c in frame.columns) + "|"
    body = ["| " + " | ".join(esc(_cell(v)) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _markdown(report: Report) -> str:
    out = [f"# {report.title}", ""]
    out += [f"- {line}" for line in report.meta]
    out += ["", "Contents: " + " · ".join(f"[{s.title}](#{s.anchor})"
                                          for s in report.sections), ""]
    for s in report.sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Text):
                out += [b.text, ""]
            elif isinstance(b, Table):
                if b.caption:
                    out += [f"*{b.caption}*", ""]
                out += [_md_table(b.frame) if len(b.frame) else "(none)", ""]
            elif isinstance(b, Image):
                out += [f"![{b.alt}]({b.src})", ""]
            else:
                out += ["```", b.text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #212121; line-height: 1.45; padding: 0 1em; }
h1 { border-bottom: 2px solid #1565c0; padding-bottom: .2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #e0e0e0; }
table { border-collapse: collapse; font-size: .88em; margin: .6em 0; }
th, td { border: 1px solid #e0e0e0; padding: .25em .6em; text-align: left; }
td { white-space: nowrap; } td:last-child, td.text { white-space: normal; }
td.text { min-width: 16em; }
.wide { overflow-x: auto; }
.bleed { width: max-content; max-width: calc(100vw - 2em); position: relative; left: 50%;
         transform: translateX(-50%); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f5f5f5; }
img { max-width: 100%; border: 1px solid #eeeeee; }
pre { background: #f5f5f5; padding: .8em; white-space: pre-wrap; }
.meta { color: #616161; } caption { text-align: left; font-style: italic; }
nav a { margin-right: 1em; }
"""


def _html_table(table: Table) -> str:
    frame = table.frame
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    # Headers may break after an underscore (process_start, device_setup).
    head = "".join(f"<th>{html.escape(str(c)).replace('_', '_<wbr>')}</th>"
                   for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        # A long text cell wraps (a reason, a timing breakdown): a table wider than the
        # page hid its right-hand columns behind a scroll bar.
        tags = ("<td class='num'>" if num else "<td class='text'>" if len(_cell(v)) > 48
                else "<td>" for num, v in zip(numeric, row, strict=True))
        cells = "".join(f"{tag}{html.escape(_cell(v))}</td>"
                        for tag, v in zip(tags, row, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    # A table of many columns may use the window's width, not only the text column's.
    cls = "wide bleed" if len(frame.columns) > 8 else "wide"
    return (f"<div class='{cls}'><table>{caption}<thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _html(report: Report) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(report.title)}</h1>", "<ul class=\"meta\">",
             *[f"<li>{e(line)}</li>" for line in report.meta], "</ul>",
             "<nav>" + "".join(f"<a href=\"#{e(s.anchor)}\">{e(s.title)}</a>"
                               for s in report.sections) + "</nav>"]
    for s in report.sections:
        parts.append(f"<h2 id=\"{e(s.anchor)}\">{e(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, Text):
                parts.append(f"<p>{e(b.text)}</p>")
            elif isinstance(b, Table):
                parts.append(_html_table(b) if len(b.frame) else "<p>(none)</p>")
            elif isinstance(b, Image):
                parts.append(f"<p><img src=\"{e(b.src)}\" alt=\"{e(b.alt)}\"></p>")
            else:
                parts.append(f"<pre>{e(b.text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render(report: Report, fmt: str) -> str:
    """The report as Markdown (``md``) or a standalone HTML page (``html``)."""
    if fmt == "md":
        return _markdown(report)
    if fmt == "html":
        return _html(report)
    raise ValueError(f"format {fmt!r}; allowed: {', '.join(FORMATS)}")
