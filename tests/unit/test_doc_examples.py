"""The Python examples of docs/*.md run as written. Users copy-paste them, and until this
test nothing ran them: a name renamed, an argument dropped or a block that reads a name no
block defines failed on the user's machine instead (tests/unit/test_readme_examples.py does
the same for README.md).

Every ```python block of the top-level docs (docs/*.md, not docs/benchmarks/) is a test,
named "FILE:N" (the N-th python block of FILE, counting from 1). It runs with ``exec`` in a
fresh namespace, its stdout captured, in a temporary directory that holds links to the
checkout's ``docs/`` and ``benchmarks/``: the blocks are written to run from the root of a
checkout (they read committed profiles and model files there) and whatever they write stays
in the temporary directory. A block passes if it runs without an exception; the outputs
quoted in its comments (step times, MFU, byte counts) are not compared, they are the
numbers of the day the block was written and move with the cost model.

Fragments: a block that reads a name it neither assigns nor imports (builtins aside; e.g.
``mp`` from an ``import meshplan as mp`` above) continues the blocks above it. It runs as
one program with the earlier blocks of its file back to the nearest self-contained one (a
block with no such names). A block is best written self-contained; this rule keeps short
continuations readable.

Opt-out: a block that cannot run on a CPU-only machine (it launches the executor on GPUs,
reads a file only a GPU calibration writes, or takes minutes) has, on the line just before
its fence, ``<!-- not run by tests: REASON -->``. The reason is required, and OPTED_OUT
below lists every opted-out block: a new one is a decision made here, in review.

PENDING_FIX: blocks known to be broken in docs that are being edited elsewhere; they must
fail (``xfail(strict=True)``), so an entry goes once its block is fixed."""

import ast
import builtins
import contextlib
import io
import linecache
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
OPT_OUT = re.compile(r"<!--\s*not run by tests:\s*(.*?)\s*-->")

# every opted-out block, and why (the marker in the doc carries the reason as well)
OPTED_OUT = {
    "executor.md:2": "run_local spawns torchrun on the plan's GPUs",
}
# broken blocks of docs being edited elsewhere: each must fail until its doc is fixed
PENDING_FIX: dict[str, str] = {}
# longer than ~10 s on the 2-core machine: the blocks that plan many layouts or write a
# report (seconds measured there, 2026-12-05)
SLOW = {
    "DESIGN.md:1": "13 s: plans gpt3-175b on 1024 A100 and writes a 3-size report",
    "report.md:1": "10-14 s: a 5-size report with a 3-GPU comparison",
}


@dataclass(frozen=True)
class Block:
    doc: str          # file name, e.g. "moe.md"
    index: int        # 1-based among the file's python blocks
    line: int         # 1-based line of the opening fence
    code: str
    opt_out: str | None   # the marker's reason; None if the block runs

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.index}"


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, each with the opt-out marker (if any) of the
    line just before its fence."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            m = OPT_OUT.fullmatch(lines[i - 1].strip()) if i else None
            out.append(Block(path.name, len(out) + 1, i + 1, "\n".join(lines[i + 1:end]) + "\n",
                             m.group(1) if m else None))
            i = end
        i += 1
    return out


def free_names(code: str) -> set[str]:
    """Names the code reads but never binds (assignment, import, def, argument, except ...
    as), builtins aside."""
    bound, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound - set(dir(builtins))


def chain(blocks: list[Block], k: int) -> list[Block]:
    """Block ``k`` of a file and the earlier blocks it runs after: back to the nearest
    self-contained one (just itself if it is self-contained)."""
    start = k
    while start > 0 and free_names(blocks[start].code):
        start -= 1
    return blocks[start:k + 1]


BY_DOC = {p.name: python_blocks(p) for p in DOCS}
ALL = [b for blocks in BY_DOC.values() for b in blocks]
RUN = [(b, chain(BY_DOC[b.doc], b.index - 1)) for b in ALL if b.opt_out is None]


def case(block: Block, blocks: list[Block]):
    marks = []
    if block.id in SLOW:
        marks.append(pytest.mark.slow)
    if block.id in PENDING_FIX:
        marks.append(pytest.mark.xfail(strict=True, reason=PENDING_FIX[block.id]))
    return pytest.param(blocks, id=block.id, marks=marks)


def test_the_docs_have_the_blocks_this_test_runs():
    assert len(DOCS) >= 9 and len(ALL) >= 25
    ids = {b.id for b in ALL}
    for name in (OPTED_OUT, PENDING_FIX, SLOW):
        assert set(name) <= ids, "an entry names a block that is gone (or renumbered)"


def test_opt_outs_are_marked_with_a_reason_and_listed_here():
    opted = {b.id: b.opt_out for b in ALL if b.opt_out is not None}
    assert all(opted.values()), f"an opt-out marker without a reason: {opted}"
    assert set(opted) == set(OPTED_OUT), "opt-outs differ from OPTED_OUT"
    assert len(opted) <= 3, "opt out only what cannot run on a CPU; make the rest runnable"
    # a marker anywhere but on the line just before a ```python fence is ignored: refuse it
    for path in DOCS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "not run by tests" in line:
                nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
                assert OPT_OUT.fullmatch(line.strip()) and nxt == "```python", \
                    f"{path.name}:{i + 1}: a misplaced or malformed opt-out marker"


def test_fragments_continue_a_block_that_runs():
    for block, blocks in RUN:
        assert not free_names(blocks[0].code), \
            f"{block.id} reads {sorted(free_names(blocks[0].code))}, defined by no block above"
        assert all(b.opt_out is None for b in blocks), \
            f"{block.id} continues an opted-out block: opt it out too, or make it self-contained"


def test_the_fragment_rule():
    blocks = [Block("x.md", i + 1, 1, code, None) for i, code in enumerate(
        ["import meshplan as mp\n", "a = mp.Job\n", "b = a\n", "import math\nc = math.pi\n",
         "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    print(e)\n"])]
    assert [len(chain(blocks, k)) for k in range(5)] == [1, 2, 3, 1, 1]
    assert free_names("for x in range(3):\n    y = [z * x for z in w]\n") == {"w"}


@pytest.mark.parametrize("blocks", [case(b, c) for b, c in RUN])
def test_doc_example_runs(blocks, tmp_path, monkeypatch):
    for name in ("docs", "benchmarks"):      # paths relative to a checkout's root resolve
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    code = "".join(b.code for b in blocks)
    name = f"<{' + '.join(b.id for b in blocks)}>"    # a traceback shows the source lines
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    # a block may change the warning filters (planner.md's simplefilter("error", ...))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, name, "exec"), {"__name__": "__doc_example__"})
