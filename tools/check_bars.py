"""The size bars of the package, checked in CI (`.ci/run`): hubs stay wiring, modules stay readable.

- no module under ``pskv/`` over 600 lines; the three hubs (``worker/kv_worker.py``, ``worker/client.py``,
  ``kvstore/dist.py``) at most 450;
- no function or method over 60 lines (decorators and docstring included, as written);
- McCabe complexity at most 15: ruff's C901 (``[tool.ruff.lint.mccabe]`` in pyproject.toml), run by ``ruff check``.

``python tools/check_bars.py`` prints each breach and exits 1 if there is one; ``--report`` prints the largest
modules and functions as well.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pskv"

MODULE_LINES = 600
HUB_LINES = 450
HUBS = ("worker/kv_worker.py", "worker/client.py", "kvstore/dist.py")
FUNCTION_LINES = 60


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def functions(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function in ``path``, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                last = child.end_lineno or child.lineno
                found.append((f"{prefix}{child.name}", child.lineno, last - first + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def breaches() -> list[str]:
    out: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        limit = HUB_LINES if rel in HUBS else MODULE_LINES
        n = module_lines(path)
        if n > limit:
            out.append(f"pskv/{rel}: {n} lines (at most {limit})")
        for name, line, length in functions(path):
            if length > FUNCTION_LINES:
                out.append(f"pskv/{rel}:{line} {name}: {length} lines (at most {FUNCTION_LINES})")
    return out


def report(top: int) -> None:
    sizes = sorted(((module_lines(p), p.relative_to(PACKAGE).as_posix()) for p in PACKAGE.rglob("*.py")), reverse=True)
    print("largest modules:")
    for n, rel in sizes[:top]:
        print(f"  {n:5d}  pskv/{rel}")
    funcs = sorted(
        ((length, f"pskv/{p.relative_to(PACKAGE).as_posix()}:{line} {name}") for p in PACKAGE.rglob("*.py")
         for name, line, length in functions(p)),
        reverse=True,
    )
    print("longest functions:")
    for length, where in funcs[:top]:
        print(f"  {length:5d}  {where}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="also print the largest modules and functions")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    if args.report:
        report(args.top)
    found = breaches()
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} breaches of the size bars (tools/check_bars.py)")
        return 1
    print("size bars hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
