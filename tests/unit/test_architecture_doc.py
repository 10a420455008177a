"""docs/architecture.md names every module of pskv (one line each), so the map stays true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sections() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    parts = re.split(r"^### `([^`]+)`.*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_module_has_its_line_in_the_architecture_map():
    found = sections()
    missing = []
    for path in sorted((ROOT / "pskv").rglob("*.py")):
        rel = path.relative_to(ROOT / "pskv")
        section = "pskv/" if len(rel.parts) == 1 else f"{rel.parts[0]}/"
        if f"`{rel.name}`" not in found.get(section, ""):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md does not describe: {missing}"


def test_the_diagram_image_is_generated_from_its_source():
    dot = (ROOT / "docs" / "architecture.dot").read_text(encoding="utf-8")
    svg = (ROOT / "docs" / "architecture.svg").read_text(encoding="utf-8")
    for label in re.findall(r'label="([A-Za-z]+) \(', dot):  # each box's first word is in the image
        assert label in svg


def test_every_file_the_diagram_names_exists():
    dot = (ROOT / "docs" / "architecture.dot").read_text(encoding="utf-8")
    labels = " ".join(re.findall(r'label="([^"]*)"', dot)).replace("\\n", " ")
    missing = []
    for folder, name in re.findall(r"\b(?:([a-z_]+)/)?([a-z_]+\.py)\b", labels):
        found = (ROOT / "pskv" / folder / name).exists() if folder else any((ROOT / "pskv").rglob(name))
        if not found:
            missing.append(f"{folder}/{name}" if folder else name)
    assert not missing, f"docs/architecture.dot names files pskv does not have: {missing} (update it, then dot -Tsvg)"
