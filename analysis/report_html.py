"""A small report writer: one list of blocks rendered both as a standalone HTML page and as
Markdown. Images are PNG files next to the report, referenced by relative paths, so the folder
can be moved, zipped or served as it is. The HTML has no external resources (no CDN, no web
fonts) and carries a tiny self-check script that records broken images and script errors on
the <body> element (data-* attributes), which a headless browser can read back."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from infersim.simulator.metrics.plots import REPRODUCIBLE_PNG, write_figure
from infersim.simulator.yamlio import write_atomic

# ------------------------------------------------------------------ plotting helpers (shared)


def save_figure(fig, path: Path) -> None:
    """Save with fixed metadata (identical inputs give identical PNGs), atomically."""
    write_figure(fig, path, **REPRODUCIBLE_PNG)


# ------------------------------------------------------------------ blocks


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    highlight: set[int] = field(default_factory=set)  # row indexes to emphasise
    numeric: set[int] = field(default_factory=set)  # column indexes aligned right
    caption: str = ""


@dataclass
class Image:
    src: str  # relative to the report
    alt: str
    caption: str = ""


@dataclass
class Report:
    title: str
    subtitle: str = ""
    verdict: list[str] = field(default_factory=list)  # lines (light Markdown: **bold**, `code`)
    blocks: list[Any] = field(
        default_factory=list
    )  # ("h2", text) | ("p", text) | Table | Image | ("details", summary, [blocks])

    def h2(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def add(self, block) -> None:
        self.blocks.append(block)

    def details(self, summary: str, blocks: list) -> None:
        self.blocks.append(("details", summary, blocks))

    def write(self, folder: Path, stem: str = "report") -> tuple[Path, Path]:
        folder = Path(folder)
        h, m = folder / f"{stem}.html", folder / f"{stem}.md"
        write_atomic(h, render_html(self))
        write_atomic(m, render_markdown(self))
        return h, m


def md_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return out


def frame_md_table(df, cols: Sequence[str], fmt: dict[str, str] | None = None) -> str:
    """The columns `cols` of a DataFrame as a Markdown table: a cell formatted by `fmt[col]`
    (str.format) where given, '-' where missing (None or NaN)."""

    def cell(c, v):
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return fmt[c].format(v) if c in (fmt or {}) else str(v)

    return "\n".join(md_table(cols, [[cell(c, r[c]) for c in cols] for _, r in df.iterrows()])) + "\n"


# ------------------------------------------------------------------ Markdown


def _md_block(b, out: list[str]) -> None:
    if isinstance(b, Table):
        rows = [
            [f"**{v}**" if i in b.highlight and j == 0 else v for j, v in enumerate(r)] for i, r in enumerate(b.rows)
        ]
        out += md_table(b.columns, rows)
        if b.caption:
            out += ["", f"*{b.caption}*"]
    elif isinstance(b, Image):
        out.append(f"![{b.alt}]({b.src})")
        if b.caption:
            out += ["", f"*{b.caption}*"]
    elif b[0] == "h2":
        out.append(f"## {b[1]}")
    elif b[0] == "p":
        out.append(b[1])
    elif b[0] == "ul":
        out += [f"- {x}" for x in b[1]]
    elif b[0] == "details":
        out.append(f"### {b[1]}")
        for sub in b[2]:
            out.append("")
            _md_block(sub, out)
    out.append("")


def render_markdown(r: Report) -> str:
    out = [f"# {r.title}", ""]
    if r.subtitle:
        out += [r.subtitle, ""]
    if r.verdict:
        out += ["> **Verdict**", ">"] + [f"> {line}" for line in r.verdict] + [""]
    for b in r.blocks:
        _md_block(b, out)
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------ HTML

_CSS = """
:root { --fg:#1f2933; --muted:#616e7c; --line:#e4e7eb; --accent:#2e86ab; --good:#2f9e44; --bg:#ffffff; --soft:#f5f7fa; }
* { box-sizing: border-box; }
body { margin:0; background:var(--soft); color:var(--fg);
       font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 28px 32px 48px; background: var(--bg); min-height: 100vh; }
h1 { font-size: 26px; margin: 0 0 4px; letter-spacing: -0.01em; }
.subtitle { color: var(--muted); margin: 0 0 20px; }
h2 { font-size: 19px; margin: 34px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 18px 0 8px; }
.verdict { border-left: 5px solid var(--good); background: #ebfbee; padding: 14px 18px; border-radius: 6px; margin: 8px 0 12px; }
.verdict p { margin: 4px 0; }
.verdict .label { font-weight: 700; text-transform: uppercase; font-size: 12px; letter-spacing: .08em; color: var(--good); }
table { border-collapse: collapse; width: 100%; margin: 8px 0 6px; font-size: 13.5px; }
th, td { padding: 6px 9px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
.table-wrap { overflow-x: auto; }
tbody td:first-child { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #ebfbee; font-weight: 600; }
tbody tr:hover td { background: #f0f4f8; }
.caption { color: var(--muted); font-size: 13px; margin: 2px 0 14px; }
figure { margin: 14px 0 22px; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
code { background: var(--soft); padding: 1px 4px; border-radius: 3px; font-size: 90%; }
details { margin: 12px 0; } summary { cursor: pointer; font-weight: 600; }
ul { padding-left: 22px; } li { margin: 3px 0; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""

# Records broken images and script errors on <body> once the page has loaded, so a headless
# browser (or anyone with the developer tools) can check that the report rendered whole.
_CHECK_JS = """
(function () {
  var errors = [];
  window.addEventListener('error', function (e) {
    var t = e.target;
    if (t && t.tagName === 'IMG') { errors.push('image failed to load: ' + t.getAttribute('src')); }
    else { errors.push('script error: ' + (e.message || 'unknown')); }
  }, true);
  window.addEventListener('load', function () {
    var imgs = document.images, broken = [];
    for (var i = 0; i < imgs.length; i++) {
      if (!imgs[i].complete || imgs[i].naturalWidth === 0) { broken.push(imgs[i].getAttribute('src')); }
    }
    var b = document.body;
    b.setAttribute('data-images', String(imgs.length));
    b.setAttribute('data-broken-images', broken.join(' '));
    b.setAttribute('data-errors', errors.join(' | '));
    b.setAttribute('data-render-check', 'done');
  });
})();
"""


def _inline(text: str) -> str:
    """Escape, then the light Markdown used in report text: **bold** and `code`."""
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
    t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
    return t


def _html_block(b, out: list[str]) -> None:
    if isinstance(b, Table):
        out.append('<div class="table-wrap"><table>')
        out.append(
            "<thead><tr>"
            + "".join(
                f'<th class="num">{_inline(c)}</th>' if j in b.numeric else f"<th>{_inline(c)}</th>"
                for j, c in enumerate(b.columns)
            )
            + "</tr></thead><tbody>"
        )
        for i, r in enumerate(b.rows):
            cls = ' class="best"' if i in b.highlight else ""
            out.append(
                f"<tr{cls}>"
                + "".join(
                    f'<td class="num">{_inline(v)}</td>' if j in b.numeric else f"<td>{_inline(v)}</td>"
                    for j, v in enumerate(r)
                )
                + "</tr>"
            )
        out.append("</tbody></table></div>")
        if b.caption:
            out.append(f'<p class="caption">{_inline(b.caption)}</p>')
    elif isinstance(b, Image):
        out.append(
            f'<figure><img src="{html.escape(b.src, quote=True)}" alt="{html.escape(b.alt, quote=True)}" '
            f'loading="eager">'
        )
        if b.caption:
            out.append(f"<figcaption>{_inline(b.caption)}</figcaption>")
        out.append("</figure>")
    elif b[0] == "h2":
        slug = re.sub(r"[^a-z0-9]+", "-", b[1].lower()).strip("-")
        out.append(f'<h2 id="{slug}">{_inline(b[1])}</h2>')
    elif b[0] == "p":
        out.append(f"<p>{_inline(b[1])}</p>")
    elif b[0] == "ul":
        out.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b[1]) + "</ul>")
    elif b[0] == "details":
        out.append(f"<details><summary>{_inline(b[1])}</summary>")
        for sub in b[2]:
            _html_block(sub, out)
        out.append("</details>")


def render_html(r: Report) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(r.title)}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_CHECK_JS}</script>",
        "</head>",
        "<body>",
        "<main>",
        f"<h1>{_inline(r.title)}</h1>",
    ]
    if r.subtitle:
        out.append(f'<p class="subtitle">{_inline(r.subtitle)}</p>')
    if r.verdict:
        out.append('<section class="verdict"><div class="label">Verdict</div>')
        out += [f"<p>{_inline(line)}</p>" for line in r.verdict]
        out.append("</section>")
    for b in r.blocks:
        _html_block(b, out)
    out.append(
        "<footer>Generated by infersim. Simulated results: see the method section for what they assume." "</footer>"
    )
    out += ["</main>", "</body>", "</html>", ""]
    return "\n".join(out)
