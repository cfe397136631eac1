"""docs/DESIGN.md lists every module of meshplan/, one line each, and nothing that is gone.

The list is the fenced block under "## Packages and modules": a line ``meshplan/NAME.py``
names a top-level module, a line ``meshplan/PKG/`` opens a package, and the indented lines
below it name that package's files (several may share a line, separated by ", ").
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"


def listed_files(text: str) -> set[str]:
    """Paths (relative to the repository root) that the module list of DESIGN.md names."""
    section = text.split("## Packages and modules", 1)[1]
    block = section.split("```", 2)[1]
    out, package = set(), None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            name = line.split()[0]
            if name.endswith("/"):
                package = name
            else:
                out.add(name)
                package = None
            continue
        head = re.split(r"\s{2,}", line.strip())[0]
        if package is None or not re.match(r"[\w./]+(\.py|\.toml)(,|$)", head):
            continue                        # a continuation of the line above
        out.update(package + n.strip() for n in head.split(","))
    # "data/gpus.toml, clusters.toml": the second name is in the first one's folder
    fixed = set()
    for path in out:
        p = Path(path)
        if p.suffix == ".toml" and p.parent.name != "data":
            p = p.parent / "data" / p.name
        fixed.add(str(p))
    return fixed


def test_every_module_is_listed_and_every_listed_file_exists():
    listed = listed_files(DESIGN.read_text())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "meshplan").rglob("*.py")}
    assert sorted(modules - listed) == [], "modules missing from docs/DESIGN.md"
    assert sorted(p for p in listed if not (ROOT / p).exists()) == [], \
        "docs/DESIGN.md lists files that do not exist"


def test_the_parser_reads_packages_shared_lines_and_data_files():
    text = ("## Packages and modules\n\n```\nmeshplan/cli.py   the CLI\n\nmeshplan/pkg/   a package\n"
            "  a.py            does A\n  b.py, c.py      B and C\n"
            "                  (continued text.py here)\n"
            "  data/x.toml, y.toml   data\n```\n")
    assert listed_files(text) == {"meshplan/cli.py", "meshplan/pkg/a.py", "meshplan/pkg/b.py",
                                  "meshplan/pkg/c.py", "meshplan/pkg/data/x.toml",
                                  "meshplan/pkg/data/y.toml"}
