"""MkDocs hooks (mkdocs.yml ``hooks:``): links to the source tree, and the docstrings' Sphinx roles.

Links from a guide page to a file of the source tree: the guide pages are read in the source tree too, where ``[bench/README.md](../bench/README.md)``
is a working link. The site holds only ``docs/``, so such a link would be dead there: this hook
checks that the target exists in the tree (a missing one fails the build, naming page and
link) and renders it as the file's path in the source tree, in code type.

The docstrings name objects Sphinx's way (``:class:`~pskv.arrays.rowsparse.RowSparse```);
the API pages show such a name in code type (``RowSparse``: after ``~`` its last part), not
the role's markup.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[([^\]]+)\]\((\.\./[^)\s]+)\)")
ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>")
FENCE = re.compile(r"^( *)(```|~~~).*?^\1\2", re.S | re.M)


def _outside(match: re.Match[str], page_dir: Path, page: str) -> str:
    text, target = match.group(1), match.group(2)
    path = (page_dir / target.split("#", 1)[0]).resolve()
    try:
        rel = path.relative_to(ROOT).as_posix()
    except ValueError:
        raise PluginError(f"{page}: link {target!r} points outside the repository") from None
    if not path.exists():
        raise PluginError(f"{page}: link {target!r}: {rel} does not exist in the source tree")
    shown = text.strip("`")
    if shown in (rel, rel.rstrip("/") + "/", Path(rel).name) or rel.startswith(shown.rstrip("/")):
        return f"`{rel}`"
    return f"{text} (`{rel}` in the source tree)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    page_dir = (Path(config["docs_dir"]) / page.file.src_path).parent
    parts, last = [], 0
    for fence in FENCE.finditer(markdown):  # links inside code blocks are left alone
        parts.append(LINK.sub(lambda m: _outside(m, page_dir, page.file.src_path), markdown[last:fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(lambda m: _outside(m, page_dir, page.file.src_path), markdown[last:]))
    return "".join(parts)


def _role(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return ROLE.sub(_role, html)
