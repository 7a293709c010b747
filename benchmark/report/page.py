"""The self-contained HTML report (``leaderboard.html``), written beside leaderboard.md.

One file, no external assets: CSS and a few lines of JavaScript inline, every mosaic and plot
as a base64 data URI. It reads offline in any browser, uses the window's width and reads on a
phone-sized screen (a table row is one line: tables scroll sideways inside their box; images
shrink to the width; running text keeps a readable measure). Every table sorts by a click on
its header (numbers numerically, by the value behind the cell, e.g. a metric's mean; empty
cells last; a second click reverses). Under each block's main table, a folded list links each
setting's run folders (relative links: they resolve where the report sits beside its runs, e.g.
results/demo/reference/runs), and the rules the table was ranked by are folded under a summary.
Same content and order as leaderboard.md (``layout``).
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dfbench.benchmark.report.layout import PageMeta, Section, Table, failures_table, sections, summary
from dfbench.benchmark.report.names import is_unranked_name
from dfbench.benchmark.report.tables import hardware_line

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:1em 1.5em;color:#1d1d1f;
line-height:1.45;font-size:15px}
p,ul.note,.legend{max-width:120ch}
h1{font-size:1.6em;margin:.3em 0}h2{font-size:1.3em;margin-top:2em;border-bottom:2px solid #e4e4e7;padding-bottom:.2em}
h3{font-size:1.05em;margin:1.4em 0 .3em}
nav{background:#f6f6f7;border:1px solid #e4e4e7;border-radius:6px;padding:.5em .8em;font-size:14px}
nav a{margin-right:1em;white-space:nowrap;display:inline-block}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;margin:.6em 0;border:1px solid #e4e4e7;border-radius:6px;
width:fit-content;max-width:100%}.scroll.wide{width:auto}
table{border-collapse:collapse;font-size:13.5px}table.main{min-width:100%}
th,td{padding:5px 9px;text-align:left;vertical-align:top;border-bottom:1px solid #ececef;white-space:nowrap}
th{background:#f3f3f5;position:sticky;top:0;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th::after{content:" \\2195";color:#aaa;font-size:.85em}
th[aria-sort=ascending]::after{content:" \\2191";color:#333}th[aria-sort=descending]::after{content:" \\2193";color:#333}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.baseline td{color:#666;font-style:italic}
tbody tr:hover td{background:#fafaf0}
.headline{font-size:1.02em;background:#f0f6ff;border-left:4px solid #3b82f6;padding:.5em .8em;border-radius:4px}
.note{color:#555;font-size:13px}.bad{color:#a00}
.legend{margin:.3em 0 .6em;padding-left:1.2em}.legend li{margin:.1em 0}
details.runs li{margin:.15em 0}details.runs a{margin-right:.5em}
details{margin:.5em 0}summary{cursor:pointer;color:#333}
img{max-width:100%;height:auto;border:1px solid #e4e4e7;border-radius:4px;margin:.5em 0}
figure{margin:1em 0}figcaption{font-size:13px;color:#555}
a{color:#1d4ed8}
@media (max-width:600px){body{padding:.5em;font-size:14px}th,td{padding:4px 6px}}
"""

# Click a header: sort the body rows by that column's data-k (numbers numerically, else text;
# rows without a value last, whichever the direction); a second click reverses.
_JS = """
(function(){
  function key(row, i){
    var c = row.cells[i]; if(!c) return null;
    var k = c.getAttribute('data-k'); if(k === null || k === '') return null;
    return c.getAttribute('data-t') === 'n' ? parseFloat(k) : k.toLowerCase();
  }
  function sortBy(table, i, th){
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    var dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
    rows.sort(function(a, b){
      var x = key(a, i), y = key(b, i);
      if(x === null && y === null) return 0;
      if(x === null) return 1;
      if(y === null) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function(r){ body.appendChild(r); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function(h){ h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
  }
  document.querySelectorAll('table.sortable').forEach(function(table){
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function(th, i){
      th.setAttribute('title', 'sort by ' + th.textContent);
      th.addEventListener('click', function(){ sortBy(table, i, th); });
    });
  });
})();
"""

esc = html.escape


def _bold(text: str) -> str:
    """The layout's markdown **bold** as <b>, the rest escaped."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", esc(text))


def _code(text: str) -> str:
    return re.sub(r"`(.+?)`", r"<code>\1</code>", _bold(text))


def _key_attrs(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ' data-k=""'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f' data-t="n" data-k="{float(value)!r}"' if math.isfinite(value) else f' data-t="n" data-k="{"1e308" if value > 0 else "-1e308"}"'
    return f' data-k="{esc(str(value))}"'


def _table(t: Table, table_id: str, baseline_rows: Sequence[bool] = (), main: bool = False) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in t.headers)
    body = []
    for r, (row, keys) in enumerate(zip(t.rows, t.sort_keys)):
        cells = []
        for c, (text, key) in enumerate(zip(row, keys)):
            cls = ' class="num"' if c < len(t.numeric) and t.numeric[c] else ""
            cells.append(f"<td{cls}{_key_attrs(key)}>{esc(text)}</td>")
        cls = ' class="baseline"' if r < len(baseline_rows) and baseline_rows[r] else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    kind = "sortable main" if main else "sortable"  # the main table spans the window; the others take their width
    out = f'<div class="scroll{" wide" if main else ""}"><table class="{kind}" id="{esc(table_id)}"><thead><tr>{head}</tr></thead>' \
          f"<tbody>{''.join(body)}</tbody></table></div>"
    if t.note:
        out += f'<p class="note">{esc(t.note)}</p>'
    return out


def _run_folders(s: Section) -> str:
    """The block's run folders, one line per setting, folded under a summary (the main table stays one line a row)."""
    n = sum(len(links) for _, links in s.runs)
    items = "".join(f"<li>{esc(label)}: " + " ".join(f'<a href="{esc(href)}">{esc(seed)}</a>' for seed, href in links) + "</li>"
                    for label, links in s.runs)
    return f'<details class="runs"><summary>Run folders ({n} runs)</summary><ul class="note">{items}</ul></details>'


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _nav_label(title: str) -> str:
    """A block's link text: its title without a spec's options ("gmm:dim8 (k=8, ...) / iid" -> "gmm:dim8 / iid"),
    since a link does not wrap; the section's own heading keeps them."""
    return re.sub(r"^(\S+) \([^)]*\)( / )", r"\1\2", title)


def _section(s: Section, images: Mapping[str, Path]) -> str:
    parts = [f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>', f'<p class="headline">{_bold(s.headline)}</p>']
    baseline = [is_unranked_name(row[1]) for row in s.main.rows]
    parts.append(_table(s.main, f"{s.anchor}-main", baseline, main=True))
    if s.legend:
        parts.append('<ul class="note legend">' + "".join(f"<li>{_code(line)}</li>" for line in s.legend) + "</ul>")
    if s.rules:
        parts.append('<details class="rules"><summary>How the ranks, intervals and verdicts are computed</summary>'
                     f'<p class="note">{_code(s.rules)}</p></details>')
    if s.runs:
        parts.append(_run_folders(s))
    for i, t in enumerate(s.secondary):
        parts.append(f"<h3>{esc(t.title or '')}</h3>")
        parts.append(_table(t, f"{s.anchor}-{i}", [is_unranked_name(row[1]) for row in t.rows]))
    if s.provenance or s.not_computed:
        items = [esc(p) for p in s.provenance] + [f"not computed: {esc(n)}" for n in s.not_computed]
        parts.append("<details><summary>How the metrics were computed</summary><ul class=\"note\">"
                     + "".join(f"<li>{i}</li>" for i in items) + "</ul></details>")
    if s.shared:
        parts.append("<details><summary>Config every setting shares</summary><p class=\"note\">"
                     + esc(", ".join(f"{k}={v}" for k, v in sorted(s.shared.items()))) + "</p></details>")
    if s.mosaic and s.mosaic in images:
        parts.append(f'<figure><img alt="sample grids {esc(s.dataset)} {esc(s.partition)}" src="{_data_uri(images[s.mosaic])}">'
                     f"<figcaption>Fixed-noise sample grids of every setting (one seed each).</figcaption></figure>")
    parts.append("</section>")
    return "\n".join(parts)


def write_html(table: pd.DataFrame, metrics: Sequence[str], meta: PageMeta, out_dir: Path,
               images: Mapping[str, Path]) -> Path:
    """leaderboard.html: the self-contained report. `images`: key (mosaic_*, plot_*) -> PNG path."""
    secs = sections(table, metrics, meta, images)
    plots = {k: v for k, v in images.items() if k.startswith("plot_")}
    # a link does not wrap: a spec's options (block_title's "(k=8, rank=2, ...)") are left to the section's own title
    nav = [f'<a href="#{esc(s.anchor)}">{esc(_nav_label(s.title))}</a>' for s in secs]
    nav += ['<a href="#failures">failed runs</a>'] + (['<a href="#plots">plots</a>'] if plots else [])
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>dfbench leaderboard</title><style>{_CSS}</style></head><body>",
        "<h1>dfbench leaderboard</h1>",
        f"<p>{esc(summary(table, meta))}</p>",
    ]
    if meta.hardware:
        parts.append(f'<p class="note">{esc(hardware_line(meta.hardware))}</p>')
    parts.append("<nav>" + " ".join(nav) + "</nav>")  # (spaces: the links wrap on a narrow screen)
    parts += [_section(s, images) for s in secs]
    parts.append('<section id="failures"><h2>Failed and diverged runs</h2>')
    parts.append(_table(failures_table(meta), "failures") if meta.failures else "<p>None.</p>")
    parts.append("</section>")
    if plots:
        parts.append('<section id="plots"><h2>Plots</h2>')
        for key, path in plots.items():
            parts.append(f'<figure><h3>{esc(key[5:].replace("_", " "))}</h3><img alt="{esc(key)}" src="{_data_uri(path)}"></figure>')
        parts.append("</section>")
    if meta.notes:
        parts.append("<h2>Skipped</h2><ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in meta.notes) + "</ul>")
    if meta.warnings:
        parts.append("<h2>Read warnings</h2><ul class=\"note bad\">" + "".join(f"<li>{esc(w)}</li>" for w in meta.warnings) + "</ul>")
    parts.append(f"<script>{_JS}</script></body></html>")
    path = out_dir / "leaderboard.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
