"""Every relative link in README.md, benchmarks/README.md and docs/**/*.md resolves: the
file (or folder) exists, and a ``#fragment`` into a Markdown file names one of its headings
(GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
               *(ROOT / "docs").rglob("*.md")])
# [text](target) and ![alt](target), the target up to the first space or ")"; and
# reference definitions "[label]: target"
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation other than
    '-' and '_' dropped, spaces to '-'; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken(md: Path) -> list[str]:
    out = []
    for target in links(md.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):      # http:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: no such heading")
    return out


@pytest.mark.parametrize("md", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(md):
    assert broken(md) == []


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with punctuation!\n## Again\n## Again\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [gone](missing.md) ![img](nope.png) [web](https://x.org)\n"
                    "[anchor](there.md#a-heading-with-punctuation) [again](there.md#again-1)\n"
                    "[bad](there.md#nothing) [self](#title) [dir](./)\n\n[ref]: missing/dir/\n"
                    "`[not a link](in-code.md)`\n```\n[nor](in-fence.md)\n```\n# Title\n")
    assert broken(page) == ["missing.md: no such file", "nope.png: no such file",
                            "there.md#nothing: no such heading", "missing/dir/: no such file"]
