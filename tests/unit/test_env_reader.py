"""``pskv.config`` is the only reader of the environment: every variable a pskv module reads is in one of its
tables and in docs/env.md (``PSKV_TORCH_STORE`` was read by ``pskv.torch.runtime`` itself)."""

from __future__ import annotations

import ast
from pathlib import Path

from pskv.config import TORCH_ENV_VARS, torch_store_name

REPO = Path(__file__).resolve().parents[2]
ALLOWED = {"pskv/config.py", "pskv/testing/jobs.py"}  # the reader; a test helper that builds a child's environment


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines of ``os.environ`` / ``os.getenv`` / ``os.putenv`` uses (also ``from os import environ``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in ("environ", "getenv", "environb") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_no_module_but_config_reads_the_environment() -> None:
    readers = {}
    for path in sorted((REPO / "pskv").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name not in ALLOWED:
            lines = _reads_environment(ast.parse(path.read_text(encoding="utf-8")))
            if lines:
                readers[name] = lines
    assert readers == {}


def test_pskv_torch_variables_are_documented_and_read_through_config() -> None:
    text = (REPO / "docs" / "env.md").read_text(encoding="utf-8")
    for var in TORCH_ENV_VARS:
        assert f"`{var}`" in text, var
    assert torch_store_name({"PSKV_TORCH_STORE": " byteps\n"}) == "byteps"
    assert torch_store_name({}) == torch_store_name({"PSKV_TORCH_STORE": ""}) == ""
