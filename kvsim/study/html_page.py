"""The parts of a ``report.html`` (kvsim.study.html_report): one self-contained page a
person opens from disk, with no network at view time.

Everything it shows is in the file: the styles and a small script inline, each plot a PNG
as a ``data:`` URI (no CDN, no font, no file beside it but the run folders it links to).
Every string that comes from a user's files (a study's comments, axis values, variant
names, config values, error messages) is HTML-escaped (``esc``). A table of class
``sortable`` sorts by any column on a click on its header (``kvsimSort``: numbers in
numeric order by each cell's ``data-v``, text in natural order, empty cells last either
way; a second click reverses). The page is written whole (kvsim.run.outputs.write_whole:
a scratch file renamed into place).
"""

from __future__ import annotations

import base64
import html
import math
import struct
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from kvsim.config.keypaths import ABSENT
from kvsim.study.table import fmt

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:1400px;padding:0 1em;color:#1d1d1f;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.question{background:#f6f8fa;border-left:4px solid #4a7ebb;padding:.1em 1em;font-size:.95em;
max-width:60em}.question pre{padding:0;margin:.4em 0}
.meta{color:#555;font-size:.9em}.meta code,.axes code{background:#f3f3f3;padding:0 .25em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #d0d7de;padding:.25em .5em;text-align:right;vertical-align:top;white-space:nowrap}
th{background:#eef2f6;position:sticky;top:0}td.t,th.t{text-align:left}
table.sortable th{cursor:pointer;user-select:none;white-space:nowrap}
table.sortable th:hover{background:#dde6f0}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tr.bad td{background:#fdecea}tr.warn td{background:#fff8e1}
.rel{color:#666;font-size:.85em}td.status{white-space:normal;min-width:14em;max-width:30em}
.err{color:#a40000;text-align:left;font-size:.9em;white-space:normal}td.err{min-width:18em;max-width:40em}
figure{display:inline-block;margin:.5em 1em .5em 0;vertical-align:top}
figure img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:.8em;color:#555}
table.diff td{max-width:60em;overflow-wrap:anywhere;white-space:normal}
details{margin:.2em 0}summary{cursor:pointer}pre{background:#f6f8fa;padding:.6em;overflow-x:auto;
font-size:.85em}
"""

SCRIPT = """
function kvsimSort(th){
  var table=th.closest('table'),body=table.tBodies[0],i=th.cellIndex;
  var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
  Array.prototype.forEach.call(th.parentNode.cells,function(h){h.removeAttribute('aria-sort');});
  th.setAttribute('aria-sort',dir===1?'ascending':'descending');
  function key(r){var c=r.cells[i];if(!c)return '';var v=c.getAttribute('data-v');
    return v===null?c.textContent.trim():v;}
  var rows=Array.prototype.slice.call(body.rows);
  rows.sort(function(a,b){
    var x=key(a),y=key(b);
    if(x==='')return y===''?0:1;
    if(y==='')return -1;
    var nx=Number(x),ny=Number(y),c;
    if(!isNaN(nx)&&!isNaN(ny))c=nx-ny;
    else c=x.localeCompare(y,undefined,{numeric:true});
    return dir*c;
  });
  rows.forEach(function(r){body.appendChild(r);});
}
"""


def esc(v: Any) -> str:
    """``v`` as text, HTML-escaped (quotes too: safe in an attribute)."""
    return html.escape(str(v), quote=True)


def href(rel: str) -> str:
    """A link to a path relative to the page, each part percent-encoded."""
    return esc(quote(rel, safe="/"))


def sort_value(v: Any) -> str:
    """A cell's ``data-v``: a number's full value, '' for none (sorted last), else text."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, float)):
        return repr(v)
    return str(v)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG from its header; ValueError if ``data`` is not a PNG."""
    if len(data) < 24 or data[:8] != PNG_MAGIC or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def figure(path: Path, caption: str) -> str:
    """A plot inlined as a ``data:`` URI, with its caption; a file that is not a PNG or
    cannot be read says so instead."""
    try:
        data = Path(path).read_bytes()
        w, h = png_size(data)
    except (OSError, ValueError) as e:
        return f'<p class="err">{esc(caption)}: cannot be shown ({esc(e)})</p>'
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (f'<figure><img src="{uri}" width="{w}" height="{h}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def figures(paths: Iterable[Path], root: Path) -> str:
    """The plots in ``paths`` (captioned by their path under ``root``), or a line saying
    there are none."""
    out = []
    for p in paths:
        try:
            cap = str(Path(p).relative_to(root))
        except ValueError:
            cap = Path(p).name
        out.append(figure(Path(p), cap))
    return "\n".join(out) if out else '<p class="meta">no plots were drawn</p>'


def cell(v: Any, *, text: str | None = None, cls: str = "", extra: str = "",
         sort: Any = ...) -> str:
    """A ``<td>``: ``text`` (already HTML) or ``fmt(v)`` escaped; sorted by ``sort``
    (default ``v``)."""
    body = text if text is not None else esc(fmt(v))
    if cls == "" and v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
        cls = "t"
    key = v if sort is ... else sort
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-v="{esc(sort_value(key))}">{body}{extra}</td>'


def table(header: list[tuple[str, str]], rows: list[tuple[str, list[str]]], ident: str) -> str:
    """A sortable table: ``header`` (label, tooltip) per column; ``rows``: (the row's
    class, its ``<td>`` cells)."""
    ths = "".join(f'<th class="t" onclick="kvsimSort(this)" title="{esc(tip or "click to sort")}">'
                  f"{esc(label)}</th>" for label, tip in header)
    trs = "\n".join(f'<tr{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{"".join(cells)}</tr>'
                    for cls, cells in rows)
    return (f'<div class="scroll"><table class="sortable" id="{esc(ident)}"><thead><tr>{ths}</tr></thead>'
            f"<tbody>\n{trs}\n</tbody></table></div>")


def show_value(key: str, v: Any) -> str:
    """A config value in words: a size in GiB where the key is a size field."""
    if v is ABSENT:
        return "(absent)"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        from kvsim.study.labels import axis_label

        name, scale = axis_label(key, key)
        if scale == 2.0 ** -30:
            return f"{v * scale:g} GiB"
        if name.endswith("(s)"):
            return f"{v:g} s"
        if isinstance(v, float):
            return f"{v:.6g}"
    if isinstance(v, (dict, list)) or v is None or isinstance(v, bool):
        import json

        return json.dumps(v, separators=(", ", ": "))
    return str(v)


def diff_table(diff: list[tuple[str, Any, Any]], label: str = "this") -> str:
    if not diff:
        return '<p class="meta">the same as the base config</p>'
    rows = "".join(f'<tr><td class="t"><code>{esc(k)}</code></td><td class="t">{esc(show_value(k, a))}</td>'
                   f'<td class="t">{esc(show_value(k, b))}</td></tr>' for k, a, b in diff)
    return (f'<table class="diff"><thead><tr><th class="t">key</th><th class="t">base</th>'
            f'<th class="t">{esc(label)}</th></tr></thead><tbody>{rows}</tbody></table>')


def leading_comment(path: str | Path) -> str:
    """The comment block a study or tune file starts with (its question, as the shipped
    studies write it), ``#`` taken off; '' without one."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    out = []
    for line in lines:
        s = line.strip()
        if not s.startswith("#"):
            if s or out:
                break
            continue
        if s.startswith("#!"):
            continue
        out.append(s[1:][1:] if s[1:2] == " " else s[1:])
    return "\n".join(out).strip("\n")


def prose(text: str) -> str:
    """A comment block as HTML: its lines joined into paragraphs (a blank line between
    two), an indented line (a command, as the shipped studies write them) kept as code."""
    out, para = [], []

    def flush() -> None:
        if para:
            out.append(f"<p>{esc(' '.join(para))}</p>")
            para.clear()

    for line in text.splitlines():
        if not line.strip():
            flush()
        elif line[:1].isspace():
            flush()
            out.append(f"<pre>{esc(line.strip())}</pre>")
        else:
            para.append(line.strip())
    flush()
    return "".join(out)


def page(title: str, body: str) -> str:
    """The whole HTML document."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style><script>{SCRIPT}</script></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def write_page(path: Path, text: str) -> Path:
    """``path`` written whole (a scratch file beside it, renamed into place)."""
    from kvsim.run.outputs import write_whole

    write_whole(path, text.encode("utf-8"))
    return path
