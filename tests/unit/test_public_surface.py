"""The public surface is declared once, in the table of pskv/__init__.py's docstring.

Every name a row lists imports from its namespace and is exported; the API reference (the
``docs/api`` pages of ``mkdocs.yml``'s nav) documents every namespace and listed name of the
table, and nothing outside it; the ``pskv`` command row names every subcommand.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import pskv
from pskv.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "``pskv`` command"  # the row of the command line, not a namespace


def table() -> dict[str, list[str]]:
    """The rows of the table: first column -> the ````names```` of the second (line breaks as spaces)."""
    lines = (pskv.__doc__ or "").split("Public surface", 1)[1].splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+ +=+", line)]
    split = lines[rules[0]].index(" =") + 1
    rows: dict[str, str] = {}
    first = ""
    for line in lines[rules[0] + 1:rules[1]]:
        if line[:split].strip():
            first = line[:split].strip()
            rows[first] = ""
        rows[first] += " " + line[split:].strip()
    return {first: re.findall(r"``([^`]+)``", text) for first, text in rows.items()}


def surface() -> dict[str, list[str]]:
    """Namespace -> the names its row lists (a dotted name, ``kv.push``, is an example, not a name of it)."""
    return {first.strip("`"): [n for n in names if n.isidentifier()] for first, names in table().items()
            if first != COMMAND}


def api_pages() -> list[str]:
    """The pages of the nav's "API reference" section of mkdocs.yml."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = text.split("  - API reference:\n", 1)[1]
    section = re.split(r"\n  - |\n[a-z_]+:", section, maxsplit=1)[0]
    return re.findall(r"(api/[\w/.-]+\.md)\s*$", section, flags=re.M)


def documented() -> dict[str, str]:
    """Every ``::: identifier`` of the API pages -> its page."""
    found = {}
    for page in api_pages():
        for ident in re.findall(r"^::: ([\w.]+)\s*$", (ROOT / "docs" / page).read_text(encoding="utf-8"), flags=re.M):
            found[ident] = page
    return found


def namespace_of(ident: str) -> str | None:
    """The longest namespace of the table that ``ident`` is or lies in."""
    within = [ns for ns in surface() if ident == ns or ident.startswith(ns + ".")]
    return max(within, key=len, default=None)


def test_the_table_has_the_namespaces_users_import():
    assert {"pskv", "pskv.optimizer", "pskv.compression", "pskv.parallel", "pskv.metrics", "pskv.timeline",
            "pskv.errors", "pskv.server", "pskv.testing", "pskv.checkpoints"} <= set(surface())
    assert {"DistStore", "BytePSStore", "AllreduceStore", "ClusterConfig", "KVStoreBase"} <= set(surface()["pskv"])


@pytest.mark.parametrize("namespace", sorted(surface()))
def test_each_listed_name_imports_from_its_namespace_and_is_exported(namespace):
    module = importlib.import_module(namespace)
    for name in surface()[namespace]:
        assert getattr(module, name) is not None
        assert name in module.__all__, f"{namespace}.{name} is public but not in __all__"


def test_the_command_row_names_every_subcommand():
    (row,) = table()[COMMAND]
    listed = set(re.findall(r"[\w-]+", row)) - {"pskv"}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert listed == set(sub.choices)  # type: ignore[arg-type]


def test_the_api_pages_are_the_nav_section_and_exist():
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs" / "api").glob("*.md")}
    assert set(api_pages()) == pages


def test_the_api_reference_documents_only_the_table():
    for ident, page in documented().items():
        namespace = namespace_of(ident)
        assert namespace is not None, f"docs/{page} documents {ident}, outside the table of pskv/__init__.py"
        if ident != namespace:
            name = ident[len(namespace) + 1:].split(".")[0]
            module = importlib.import_module(namespace)
            assert name in module.__all__, f"docs/{page} documents {ident}: not exported by {namespace}"


def test_the_api_reference_documents_every_namespace_and_listed_name_of_the_table():
    idents = set(documented())
    for namespace, names in surface().items():
        assert any(namespace_of(i) == namespace for i in idents), f"docs/api documents nothing of {namespace}"
        for name in names:
            full = f"{namespace}.{name}"
            assert any(i == full or i.startswith(full + ".") for i in idents), f"docs/api does not document {full}"


def test_every_error_class_is_exported_at_the_top():
    from pskv import errors

    for name in errors.__all__:
        assert getattr(pskv, name) is getattr(errors, name)
