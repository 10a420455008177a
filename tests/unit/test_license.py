"""The license the package declares is the one its LICENSE file holds (and the wheel ships)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_declared_license_is_the_license_file():
    declared = re.search(r'^license = "([^"]+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)[1]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert declared == "Apache-2.0"
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
