"""The self-contained code snippets of the docs run as written (a snippet that does not run is a defect)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def first_python_block(doc: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert match, f"{doc} has no python block"
    return match.group(1)


@pytest.mark.parametrize("doc", ["README.md", "docs/optimizers.md"])
def test_the_first_snippet_runs(doc, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # it may write files
    exec(compile(first_python_block(doc), doc, "exec"), {})
