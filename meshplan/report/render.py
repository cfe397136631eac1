"""Write a report's sections as self-contained HTML, Markdown with PNGs, and CSVs.

The HTML embeds every figure as a base64 ``data:image/png`` URI and carries its own CSS, so
the single file opens anywhere without a network. The Markdown links the PNGs written beside
it. Every table is also written as CSV with the raw numbers (no units formatting).

Output directories: a directory that exists and is not empty is refused unless ``force``;
with ``force`` only the files listed in the previous report's manifest
(``.meshplan-report.json``, written by this module) are removed, never anything else.
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.planner.planfile import check_creatable
from meshplan.report.style import png_bytes
from meshplan.report.tables import to_markdown

MANIFEST = ".meshplan-report.json"


@dataclass(frozen=True, kw_only=True)
class Table:
    name: str            # file stem of the CSV
    title: str
    raw: Any             # DataFrame written to CSV
    display: Any         # DataFrame shown in HTML/Markdown
    notes: tuple[str, ...] = ()   # footnotes under the table (e.g. uneven stage splits)


@dataclass(frozen=True, kw_only=True)
class FigureItem:
    name: str            # file stem of the PNG
    figure: Any
    caption: str


@dataclass(frozen=True, kw_only=True)
class Section:
    anchor: str
    title: str
    text: str = ""       # plain text paragraphs separated by blank lines
    tables: tuple[Table, ...] = ()
    figures: tuple[FigureItem, ...] = ()
    items: tuple[Any, ...] = field(default=())   # order of figures and tables if given


def check_output_dir(path: str | Path, *, force: bool) -> Path:
    """Refuse, without touching anything, a report directory that cannot be written: a
    file, a non-empty directory without ``force``, a parent that is a file or read-only."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise MeshplanError(f"output path {str(out)!r} exists and is not a directory; "
                            f"a report is a directory (e.g. {str(out.parent / 'report')!r})")
    if out.is_dir():
        existing = sorted(p.name for p in out.iterdir())
        if existing and not force:
            shown = ", ".join(existing[:5]) + (", …" if len(existing) > 5 else "")
            raise MeshplanError(
                f"output directory {str(out)!r} is not empty ({shown}); pass --force "
                f"(force=True) to replace a previous report there, or choose another directory")
    check_creatable(out, f"output directory {str(out)!r}")
    return out


def prepare_output_dir(path: str | Path, *, force: bool) -> Path:
    """Create ``path`` or check it may be written; with ``force`` remove only our old files."""
    out = check_output_dir(path, force=force)
    if out.is_dir():
        existing = any(out.iterdir())
        if existing and force:
            for name in _previous_files(out):
                p = out / name
                if p.is_file() and p.parent == out:
                    p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _previous_files(out: Path) -> list[str]:
    mf = out / MANIFEST
    if not mf.is_file():
        return []
    try:
        names = json.loads(mf.read_text()).get("files", [])
    except (json.JSONDecodeError, OSError, AttributeError):
        return []
    # only plain names inside the directory: a manifest never points elsewhere
    return [n for n in names if isinstance(n, str) and n == os.path.basename(n)
            and not n.startswith(".")] + [MANIFEST]


def _png_cache(sections: list[Section]) -> dict[str, bytes]:
    return {f.name: png_bytes(f.figure) for s in sections for f in s.figures}


CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#222;margin:0;
background:#fafafa;line-height:1.45}
main{max-width:1040px;margin:0 auto;padding:24px 28px 60px;background:#fff}
h1{font-size:1.6em;margin:0.2em 0}h2{font-size:1.25em;border-bottom:2px solid #0072B2;
padding-bottom:3px;margin-top:2em}h3{font-size:1.02em;margin:1.4em 0 0.4em}
.meta{color:#555;font-size:0.92em}.rec{background:#EAF3FA;border-left:4px solid #0072B2;
padding:10px 14px;margin:14px 0}nav a{margin-right:12px;font-size:0.9em}
table.tbl{border-collapse:collapse;font-size:0.82em;margin:6px 0 4px;width:100%}
table.tbl th{background:#f0f0f0;text-align:left;padding:4px 6px;border-bottom:1px solid #ccc}
table.tbl td{padding:3px 6px;border-bottom:1px solid #eee;white-space:nowrap}
table.notes td:last-child{white-space:normal;min-width:16em}
.scroll{overflow-x:auto}figure{margin:10px 0 18px}figure img{width:100%;height:auto;
border:1px solid #eee}figcaption{color:#555;font-size:0.88em}.csv{font-size:0.8em;color:#777}
.note{font-size:0.8em;color:#555;margin:2px 0;overflow-wrap:anywhere}
"""


def _paragraphs_html(text: str) -> str:
    out = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        cls = ' class="rec"' if para.startswith("Recommendation") else ""
        out.append(f"<p{cls}>{html.escape(para)}</p>")
    return "\n".join(out)


def render_html(title: str, meta: str, sections: list[Section], pngs: dict[str, bytes]) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body><main>",
             f"<h1>{html.escape(title)}</h1>", f'<p class="meta">{html.escape(meta)}</p>',
             "<nav>" + "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>'
                               for s in sections) + "</nav>"]
    for s in sections:
        parts.append(f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>')
        parts.append(_paragraphs_html(s.text))
        for item in _ordered(s):
            if isinstance(item, FigureItem):
                b64 = base64.b64encode(pngs[item.name]).decode("ascii")
                parts.append(f'<figure><img alt="{html.escape(item.caption)}" '
                             f'src="data:image/png;base64,{b64}">'
                             f"<figcaption>{html.escape(item.caption)}</figcaption></figure>")
            else:
                if item.title:
                    parts.append(f"<h3>{html.escape(item.title)}</h3>")
                # a free-text last column (the planner's reasons) wraps; numbers never do
                cls = "tbl notes" if list(item.display.columns)[-1:] == ["note"] else "tbl"
                parts.append('<div class="scroll">' + item.display.to_html(
                    index=False, border=0, classes=cls, escape=True, na_rep="–") + "</div>")
                parts.extend(f'<p class="note">{html.escape(n)}</p>' for n in item.notes)
                parts.append(f'<p class="csv">data: {html.escape(item.name)}.csv</p>')
        parts.append("</section>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _ordered(s: Section) -> list[Any]:
    return list(s.items) if s.items else [*s.figures, *s.tables]


def render_markdown(title: str, meta: str, sections: list[Section]) -> str:
    lines = [f"# {title}", "", f"_{meta}_", ""]
    lines += [f"- [{s.title}](#{s.anchor})" for s in sections] + [""]
    for s in sections:
        lines += [f'<a id="{s.anchor}"></a>', f"## {s.title}", ""]
        for para in (p.strip() for p in s.text.split("\n\n")):
            if para:
                lines += [("> " + para) if para.startswith("Recommendation") else para, ""]
        for item in _ordered(s):
            if isinstance(item, FigureItem):
                lines += [f"![{item.caption}]({item.name}.png)", "", f"_{item.caption}_", ""]
            else:
                if item.title:
                    lines += [f"### {item.title}", ""]
                lines += [to_markdown(item.display), ""]
                lines += [ln for n in item.notes for ln in (n, "")]
                lines += [f"Data: [{item.name}.csv]({item.name}.csv)", ""]
    return "\n".join(lines)


def write_report(out: Path, title: str, meta: str, sections: list[Section]) -> dict[str, Path]:
    """Write report.html, report.md, the PNGs and CSVs into ``out``; return their paths."""
    pngs = _png_cache(sections)
    written: dict[str, Path] = {}
    for name, data in pngs.items():
        written[f"{name}.png"] = _write_bytes(out / f"{name}.png", data)
    for s in sections:
        for t in s.tables:
            p = out / f"{t.name}.csv"
            t.raw.to_csv(p, index=False)
            written[p.name] = p
    written["report.html"] = _write_bytes(out / "report.html",
                                          render_html(title, meta, sections, pngs).encode())
    written["report.md"] = _write_bytes(out / "report.md",
                                        render_markdown(title, meta, sections).encode())
    (out / MANIFEST).write_text(json.dumps({"files": sorted(written)}, indent=1) + "\n")
    return written


def _write_bytes(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
