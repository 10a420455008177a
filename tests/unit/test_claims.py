"""docs/claims.md: every guarantee the docs make names the tests that prove it, and those tests exist.

The table sits between ``<!-- claims table begin -->`` and ``<!-- claims table end -->``; its
third column names tests as `` `path::function` `` (or `` `path::Class::method` ``). A row
that names none, a file that is missing, or a function that file does not define (read with
:mod:`ast`, so nothing is imported) fails the check: a guarantee that loses its test is
caught here, not by a user.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "claims.md"
BEGIN, END = "<!-- claims table begin -->", "<!-- claims table end -->"
STATUSES = {"tested", "tested with root", "untested"}
TEST_REF = re.compile(r"`([^`\s]+\.py(?:::[A-Za-z_]\w*)+)`")


@dataclass(frozen=True)
class Claim:
    line: int
    guarantee: str
    proved_by: tuple[str, ...]
    status: str


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row (no pipes inside cells in this table)."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def parse_claims(text: str) -> list[Claim]:
    """The rows of the claims table in ``text`` (header and separator left out)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"needs exactly one {BEGIN} ... {END} pair")
    start = text[: text.index(BEGIN)].count("\n") + 1
    rows = text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines()
    claims = []
    for offset, row in enumerate(rows):
        if not row.startswith("|") or set(row) <= set("|-: ") or row.startswith("| guarantee |"):
            continue
        guarantee, _said_in, proved_by, status = (cells(row) + ["", "", "", ""])[:4]
        claims.append(Claim(start + offset, guarantee, tuple(TEST_REF.findall(proved_by)), status))
    return claims


def defines(path: Path, names: list[str]) -> bool:
    """Whether the module at ``path`` defines ``names`` (a function, or a class and its method)."""
    body = ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body
    for name in names:
        found = [n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                 and n.name == name]
        if not found:
            return False
        body = getattr(found[0], "body", [])
    return True


def problems(claims: list[Claim], root: Path) -> list[str]:
    """What is wrong with ``claims``: one line per row without a test, or test that does not exist."""
    found = []
    for claim in claims:
        where = f"docs/claims.md:{claim.line} ({claim.guarantee[:60]})"
        if not claim.proved_by:
            found.append(f"{where}: no test named")
        if claim.status not in STATUSES:
            found.append(f"{where}: status {claim.status!r} is none of {sorted(STATUSES)}")
        for ref in claim.proved_by:
            path, *names = ref.split("::")
            if not (root / path).is_file():
                found.append(f"{where}: {path} does not exist")
            elif not defines(root / path, names):
                found.append(f"{where}: {path} defines no {'::'.join(names)}")
    return found


def test_every_guarantee_names_tests_that_exist():
    claims = parse_claims(CLAIMS.read_text(encoding="utf-8"))
    assert len(claims) >= 30, "the table lost its rows"
    assert not problems(claims, ROOT), "\n".join(problems(claims, ROOT))


def test_the_untested_rows_are_the_ones_that_need_a_gpu():
    for claim in parse_claims(CLAIMS.read_text(encoding="utf-8")):
        needs_gpu = any("cuda" in ref.lower() or "gpu" in ref.lower() for ref in claim.proved_by)
        assert (claim.status == "untested") == needs_gpu, claim


SYNTHETIC = f"""
{BEGIN}
| guarantee | said in | proved by | status |
|---|---|---|---|
| kept | README.md | `tests/test_x.py::test_kept` | tested |
| a method | README.md | `tests/test_x.py::TestGroup::test_method` | tested |
| lost its test | README.md | (none yet) | tested |
| renamed test | README.md | `tests/test_x.py::test_old_name` | tested |
| missing file | README.md | `tests/test_gone.py::test_kept` | tested |
| unknown status | README.md | `tests/test_x.py::test_kept` | works |
{END}
"""


def test_the_check_fails_for_a_guarantee_that_loses_its_test(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_kept():\n    pass\n\n\nclass TestGroup:\n    def test_method(self):\n        pass\n")
    claims = parse_claims(SYNTHETIC)
    assert [c.guarantee for c in claims] == ["kept", "a method", "lost its test", "renamed test", "missing file",
                                             "unknown status"]
    found = problems(claims, tmp_path)
    assert len(found) == 4, found
    assert "(lost its test): no test named" in found[0]
    assert "tests/test_x.py defines no test_old_name" in found[1]
    assert "tests/test_gone.py does not exist" in found[2]
    assert "status 'works'" in found[3]
    assert not problems(claims[:2], tmp_path)  # the intact rows pass


def test_a_table_without_its_markers_is_an_error():
    with pytest.raises(ValueError, match="claims table begin"):
        parse_claims("| guarantee | said in | proved by | status |\n")
