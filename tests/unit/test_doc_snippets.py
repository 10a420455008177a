"""Checks of particular doc snippets beyond running them (test_doc_blocks.py runs every block)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[tuple[str, int, str]]:
    """Every ```python block of the README and docs/: (doc, index, code)."""
    docs = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
    return [(doc, i, m.group(1)) for doc in docs
            for i, m in enumerate(re.finditer(r"```python\n(.*?)```", (ROOT / doc).read_text(encoding="utf-8"), re.S))]


def test_every_python_snippet_of_the_docs_is_valid_python():
    blocks = python_blocks()
    assert len(blocks) >= 7  # README, distributed, launch, optimizers, training at least
    for doc, i, code in blocks:
        compile(code, f"{doc} (python block {i})", "exec")  # a SyntaxError names the doc and block


def test_the_in_process_cluster_example_runs(capsys):
    text = (ROOT / "docs/distributed.md").read_text(encoding="utf-8")
    code = re.search(r"## Testing helpers.*?```python\n(.*?)```", text, flags=re.S).group(1)
    exec(compile(code, "docs/distributed.md (testing helpers)", "exec"), {})
    assert capsys.readouterr().out.count("array([2., 2., 2., 2.]") == 2
