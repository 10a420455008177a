"""Every code block of README.md and docs/ runs as written, so none goes stale.

A block's fence names its language, and the language says what this test does with it:

* ``python`` — run as a script (``python -`` in the document's work directory);
* ``bash`` / ``sh`` / ``shell`` — run as one ``bash -e`` script;
* ``console`` — its ``$ `` lines run as one ``bash -e`` script (the other lines are output);
* ``json`` — parsed; ``text``, ``yaml``, ``toml``, ``ini``, ``dot``, ``diff`` — not run
  (output, file formats, pictures: nothing to execute);
* a fence without a language, or any other language, fails: say what the block is.

An HTML comment on the line before the fence (invisible on the rendered page) changes that:

* ``<!-- doc-block: skip REASON -->`` — not run, and the reason says why (it needs a
  real cluster, ssh hosts, a GPU, root, minutes of benchmarks, installs into the
  current environment...); a skip without a reason fails;
* ``<!-- doc-block: file NAME -->`` — the block is written to NAME in the document's work
  directory for later blocks of the same document (``pskv launch ... -- python NAME``);
  a file no later block names fails;
* ``<!-- doc-block: run`` + lines + ``-->`` — a python block run after those lines of
  set-up (the variables a fragment takes as given);
* ``<!-- doc-block: launch ARGS`` [+ set-up lines] ``-->`` — a python block (a worker
  program) run as ``pskv launch ARGS -- python BLOCK``.

The blocks of one document run in order in one temporary directory (with ``examples``
and ``requirements`` of the source tree linked into it); each with a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))]
RUN_PYTHON = {"python", "py"}
RUN_SHELL = {"bash", "sh", "shell"}
NOT_RUN = {"text", "yaml", "toml", "ini", "dot", "diff"}
LINKED = ("examples", "requirements")  # source-tree folders a block may name relatively
TIMEOUT = 90  # seconds for one block (a pskv launch job with small sizes takes a few)
PARALLEL = 3  # documents run at a time

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-block:\s*(?P<verb>\w+)[ \t]*(?P<arg>[^\n]*?)[ \t]*(?:\n(?P<setup>.*?))?-->\s*\Z", re.S)


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    code: str
    verb: str | None = None  # skip / file / run / launch (None: by language)
    arg: str = ""
    setup: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang or 'no language'} block)"


def dedent(body: str, indent: str) -> str:
    return "".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines(True))


def blocks_of(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        block = Block(doc, text.count("\n", 0, m.start()) + 1, m.group("info").strip().split(" ")[0].lower(),
                      dedent(m.group("body"), m.group("indent")))
        before = text[:m.start()].rstrip()
        start = before.rfind("<!--")
        marker = MARKER.search(before[start:]) if start >= 0 and before.endswith("-->") else None
        if marker:
            block.verb, block.arg = marker.group("verb"), marker.group("arg").strip()
            block.setup = dedent(marker.group("setup") or "", "")
        found.append(block)
    return found


def work_dir(tmp_path: Path) -> Path:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return tmp_path


def environment() -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)  # this interpreter's python, pip and pskv come first
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    for name in [n for n in env if n.startswith(("DMLC_", "PS_", "PSKV_"))]:
        del env[name]  # a block sees a user's plain environment, not a test job's
    env["PYTHONUNBUFFERED"] = "1"
    return env


def console_commands(code: str) -> str:
    """The commands of a ``console`` block: its ``$ `` lines (a ``\\``-ended line goes on)."""
    lines, going_on = [], False
    for line in code.splitlines():
        if line.startswith("$ ") or going_on:
            lines.append(line[2:] if line.startswith("$ ") and not going_on else line)
            going_on = line.endswith("\\")
    return "\n".join(lines) + "\n"


def check_marker(block: Block, later: list[Block]) -> None:
    verb = block.verb
    assert verb in (None, "skip", "file", "run", "launch"), f"{block.where}: unknown doc-block marker {verb!r}"
    if verb == "skip":
        assert len(block.arg.split()) >= 3, f"{block.where}: a skipped block says why (doc-block: skip REASON)"
    if verb in ("run", "launch"):
        assert block.lang in RUN_PYTHON, f"{block.where}: doc-block: {verb} is for python blocks"
    if verb == "launch":
        assert block.arg, f"{block.where}: doc-block: launch ARGS (e.g. -n 2 -s 1)"
    if verb == "file":
        name = block.arg
        assert name and "/" not in name and not name.startswith("."), f"{block.where}: doc-block: file NAME"
        assert any(name in b.code or name in b.arg for b in later), \
            f"{block.where}: no later block of {block.doc} uses the file {name}"


def run(block: Block, cwd: Path) -> None:
    lang, verb = block.lang, block.verb
    if verb == "launch":
        script = cwd / f"_block_{block.line}.py"
        script.write_text(block.setup + block.code, encoding="utf-8")
        argv = ["pskv", "launch", *shlex.split(block.arg), "--timeout", str(TIMEOUT - 10), "--",
                sys.executable, script.name]
        given = None
    elif lang in RUN_PYTHON:
        argv, given = [sys.executable, "-"], block.setup + block.code
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-s"]
        given = console_commands(block.code) if lang == "console" else block.code
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=environment(), text=True, start_new_session=True)  # its own group: reaped whole
    try:
        out, err = proc.communicate(given, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{block.where} ran past {TIMEOUT} s:\n{out[-4000:]}{err[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        pytest.fail(f"{block.where} exited with code {proc.returncode}:\n--- block\n{block.code}"
                    f"--- stdout\n{out[-4000:]}--- stderr\n{err[-4000:]}")


def test_every_doc_is_found():
    assert "README.md" in DOCS and "docs/launch.md" in DOCS and len(DOCS) >= 10


def run_doc(doc: str, tmp_path: Path) -> None:
    """Check and run the blocks of ``doc`` in order (in ``tmp_path``); fails at the first failing block."""
    blocks = blocks_of(doc)
    cwd = work_dir(tmp_path)
    for i, block in enumerate(blocks):
        check_marker(block, blocks[i + 1:])
        if block.verb == "skip":
            continue
        if block.verb == "file":
            (cwd / block.arg).write_text(block.code, encoding="utf-8")
            continue
        if block.verb is None and block.lang == "json":
            try:
                json.loads(block.code)
            except ValueError as exc:
                pytest.fail(f"{block.where} is not JSON: {exc}")
            continue
        if block.verb is None and block.lang in NOT_RUN:
            continue
        assert block.lang in RUN_PYTHON | RUN_SHELL | {"console"}, (
            f"{block.where}: name the block's language — python, bash, console (run), or text, yaml, json... "
            f"(not run); a block that cannot run here is marked <!-- doc-block: skip REASON -->")
        run(block, cwd)


@pytest.fixture(scope="module")
def doc_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[None]]]:
    """The selected documents' runs, PARALLEL at a time (a launch job mostly waits: start-up, registration)."""
    selected = [item.callspec.params["doc"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_every_block_of_the_doc_runs" and hasattr(item, "callspec")]
    with ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="doc") as pool:
        yield {doc: pool.submit(run_doc, doc, tmp_path_factory.mktemp("doc")) for doc in selected}


@pytest.mark.timeout(400)  # waits for its document's run, which shares the machine with PARALLEL - 1 others
@pytest.mark.parametrize("doc", DOCS)
def test_every_block_of_the_doc_runs(doc: str, doc_runs: dict[str, Future[None]]) -> None:
    doc_runs[doc].result()


# The parser and the rules themselves, on small documents (so a broken parser cannot pass the docs silently).

def test_the_parser_reads_fences_markers_and_setup(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```python\nprint(1)\n```\n\n<!-- doc-block: skip needs a real SLURM cluster -->\n"
                   "```bash\nsrun hostname\n```\n\n- item\n\n  ```\n  output\n  ```\n\n"
                   "<!-- doc-block: run\nx = 2\n-->\n```python\nprint(x)\n```\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = blocks_of("x.md")
    assert [(b.lang, b.verb, b.arg) for b in found] == [
        ("python", None, ""), ("bash", "skip", "needs a real SLURM cluster"), ("", None, ""), ("python", "run", "")]
    assert found[2].code == "output\n" and found[3].setup == "x = 2\n" and found[0].line == 3


def test_a_failing_block_fails_and_names_its_place(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"x.md:7 \(bash block\) exited with code 3"):
        run(Block("x.md", 7, "bash", "echo fine\nexit 3\n"), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="x.md:1"):
        run(Block("x.md", 1, "python", "print(undefined_name)\n"), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="x.md:2"):
        run(Block("x.md", 2, "console", "$ true\nsome output\n$ false\n"), tmp_path)
    run(Block("x.md", 3, "python", "print(x)\n", "run", setup="x = 1\n"), tmp_path)


def test_a_skip_needs_a_reason_and_a_file_a_user():
    with pytest.raises(AssertionError, match="says why"):
        check_marker(Block("x.md", 1, "bash", "ls\n", "skip", "slow"), [])
    with pytest.raises(AssertionError, match="uses the file t.py"):
        check_marker(Block("x.md", 1, "python", "pass\n", "file", "t.py"), [Block("x.md", 5, "bash", "ls\n")])
    check_marker(Block("x.md", 1, "python", "pass\n", "file", "t.py"), [Block("x.md", 5, "bash", "python t.py\n")])
