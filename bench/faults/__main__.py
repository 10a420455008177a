"""Options, the pool of runs, the table and the JSON file: ``python bench/bench_faults.py [options]``."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from . import __doc__ as package_doc
from . import settings
from .harness import log, reap_all
from .hostile import hostile_markdown, hostile_rows
from .report import markdown, summarize
from .settings import COMMON_ENV, DEFAULT_HB, REPO, SHORT_HB
from .trials import GROUPS, ROWS, Trial, plan, run_trial


def _git(*args: str, check: bool = False) -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30,
                              check=check).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        if check:
            raise
        return ""


def environment() -> dict[str, Any]:
    """Versions, commit, CPU and load of this run (imports the measured pskv)."""
    import numpy
    import zmq

    import pskv

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "numpy": numpy.__version__, "pyzmq": zmq.__version__,
            "pskv": getattr(pskv, "__version__", "?"), "git_commit": _git("rev-parse", "HEAD"),
            "pskv_dirty": bool(_git("status", "--porcelain", "--", "pskv")), "cpu": cpu, "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "platform": platform.platform()}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(package_doc or "").split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per row (default 3)")
    ap.add_argument("--parallel", type=int, default=3, help="jobs at the same time (default 3)")
    ap.add_argument("--only", default="", help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("--fuzz-count", type=int, default=1400, help="hostile messages per fuzz run")
    ap.add_argument("--pskv-commit", default=None, metavar="REV",
                    help="measure pskv/ as committed in REV (git archive to a temporary directory); default: the checkout")
    ap.add_argument("--deadline", type=float, default=900.0, help="hard limit for the whole run in seconds")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "faults.json"))
    return ap.parse_args(argv)


def _use_commit(rev: str, root: Path) -> str:
    """Export ``pskv/`` of ``rev`` under ``root/src`` and measure it; returns the description of what is measured.

    Raises:
        OSError, subprocess.SubprocessError: git or tar failed.
    """
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}", check=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "pskv"],
                             capture_output=True, check=True, timeout=60).stdout
    (root / "src").mkdir()
    subprocess.run(["tar", "-x", "-C", str(root / "src")], input=archive, check=True, timeout=60)
    settings.use_source(root / "src")
    return f"pskv/ of commit {commit} (--pskv-commit {rev})"


def _run_all(trials: list[Trial], root: Path, parallel: int, deadline: float) -> list[dict[str, Any]]:
    """Every trial on a pool of ``parallel`` threads; past ``deadline`` s the rest is stopped and reported."""
    pool = ThreadPoolExecutor(max(1, parallel))
    futures = [pool.submit(run_trial, tr, root) for tr in trials]
    _, late = wait(futures, timeout=deadline)
    if late:  # a hard limit for the whole run: stop every process still running, so every wait ends
        log(f"--deadline {deadline:.0f} s passed with {len(late)} runs unfinished; stopping them")
        for f in late:
            f.cancel()
        reap_all()
    pool.shutdown(wait=True, cancel_futures=True)
    return [f.result() if f.done() and not f.cancelled() else
            {"ok": False, "label": tr.label, "failure": "not run: --deadline passed", "wall_s": 0.0}
            for f, tr in zip(futures, trials)]


def _write_json(path: Path, out: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def _on_term(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen rows, print the table, write the JSON file; returns the exit status."""
    args = _parse(argv)
    rows = ROWS if not args.only else [r for g in args.only.split(",") for r in GROUPS[g.strip()]]
    signal.signal(signal.SIGTERM, _on_term)
    root = Path(tempfile.mkdtemp(prefix="pskv-bench-faults-"))
    measured = "pskv/ of this checkout" + (" (with uncommitted changes)" if _git("status", "--porcelain", "--", "pskv")
                                           else "")
    if args.pskv_commit:
        try:
            measured = _use_commit(args.pskv_commit, root)
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"--pskv-commit {args.pskv_commit}: {exc}")
            shutil.rmtree(root, ignore_errors=True)
            return 2
        log(f"measuring {measured}")
    env = environment()
    env["pskv_measured"] = measured
    import pskv

    env["pskv_imported_from"] = str(Path(pskv.__file__).parent)
    trials = plan(rows, args.repeats, args.fuzz_count)
    log(f"{len(trials)} runs, {args.parallel} at a time")
    start = time.monotonic()
    try:
        results = _run_all(trials, root, args.parallel, args.deadline)
    finally:
        reap_all()
        shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - start
    env["loadavg_end"] = os.getloadavg()
    table_rows, defects = summarize(results, args.repeats)
    table = markdown(table_rows)
    print(table)
    hostile = hostile_rows(results)
    hostile_table = hostile_markdown(hostile) if hostile else ""
    if hostile:
        print("\nHostile inputs:\n\n" + hostile_table)
        defects += [f"hostile {r['category']}: {r['crashes']} crashes, {r['hangs']} hangs, {r['wrong_values']} "
                    "wrong values" for r in hostile if r["crashes"] or r["hangs"] or r["wrong_values"]]
    print(f"total wall time {wall:.0f} s; {len(trials)} runs, {args.parallel} at a time")
    if defects:
        print("\nDEFECTS:\n" + "\n".join(f"- {d}" for d in defects))
    out = {"settings": {"repeats": args.repeats, "parallel": args.parallel, "rows": rows, "fuzz_count": args.fuzz_count,
                        "default_heartbeat": DEFAULT_HB, "short_heartbeat": SHORT_HB, "common_env": COMMON_ENV,
                        "wall_s": round(wall, 1)},
           "environment": env, "rows": table_rows, "defects": defects, "table_markdown": table,
           "hostile": hostile, "hostile_markdown": hostile_table, "runs": results}
    _write_json(Path(args.json), out)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
