"""benchmarks/README.md names every script and data file at the top of benchmarks/, and
nothing that is gone: the index a reader opens first stays true as scripts come and go."""

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = re.compile(r"\.(py|sh|toml)$")


def named_in_index(text: str) -> set[str]:
    """File names the index writes in code spans (``foo.py``), folders and paths left out."""
    return {n for n in re.findall(r"`([^`\s/]+)`", text) if SCRIPT.search(n)}


def test_every_script_is_listed():
    on_disk = {p.name for p in BENCH.iterdir() if p.is_file() and SCRIPT.search(p.name)}
    listed = named_in_index((BENCH / "README.md").read_text())
    assert sorted(on_disk - listed) == [], "scripts missing from benchmarks/README.md"
    assert sorted(listed - on_disk) == [], "benchmarks/README.md names files that are gone"


def test_the_reader_finds_names_only_in_code_spans():
    text = "| `a.py`, `b.sh` | uses `sets/x.toml` and c.py; `--flag` `moeh2_device.sh` |"
    assert named_in_index(text) == {"a.py", "b.sh", "moeh2_device.sh"}
