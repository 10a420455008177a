"""A/B of pskv's per-call cost between two commits, alternating on one machine (issue 21's hot-path bar).

Usage::

    python bench/bench_ab.py [--a 835c445] [--b HEAD] [--store local|loopback] [--pairs 7] [--iters 3000]
                             [--json PATH]

``git archive`` puts ``pskv/`` of each commit into a temporary directory (``--b WORKTREE`` measures this
checkout's ``pskv/``, uncommitted edits included). Each *pair* then runs one child process per commit, in
alternating order (A B, B A, ...), so a drift of the shared machine hits both sides alike. A child imports
only its commit's pskv and times, with one 4 KB float32 key and 4 values per push (the values of 4
devices, summed by the store), on ``--store``:

* ``local`` (default): a ``local`` store; ``push_pull`` is ``kv.push(0, values)`` then ``kv.pull(0, out=out)``;
* ``loopback``: a ``dist_sync`` store of one worker whose server lives in the same process
  (:mod:`pskv.testing.loopback`: the real worker and server code, every message encoded and decoded, no
  socket, no thread): the Python work of a distributed call on both sides, without the transport.
  ``push_pull`` is ``kv.push(0, values, block=False)`` then ``kv.pull(0, out=out)``, as in
  ``bench_dist.py`` (issue 23's small-message profile, docs/benchmarks.md);

and ``pushpull`` is ``kv.pushpull(0, values, out=out)``; times in ms per iteration.

Every child checks the pulled sum once, and counts per call the bytecodes run, the Python calls and the C
calls (``sys.settrace`` / ``sys.setprofile`` over 50 calls after the timing): a deterministic measure of
the work a call does, for a machine too noisy for the times alone. Per commit and call the median time over
the pairs is reported, with the range, and the ratio ``B / A`` of the medians (``<= 1``: B no slower); the raw samples, both commits and the
machine go to ``--json`` (default ``bench/results/ab_local.json``). This is the local half of the A/B; the
``dist_sync`` half with SGD on the servers is ``bench/bench_dist.py --only 4kb,resnet50_sgd --pskv-commit
REV`` run for both commits in one session (docs/benchmarks.md, *Hot path A/B*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_dist import export_pskv  # git archive of pskv/ at a commit

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_JSON = BENCH_DIR / "results" / "ab_local.json"
CALLS = ("push_pull", "pushpull")

CHILD = r"""
import json, sys, time
import numpy as np
import pskv

iters, store = int(sys.argv[1]), sys.argv[2]
if store == "loopback":
    from pskv.testing.loopback import loopback_store
    kv = loopback_store("dist_sync")
else:
    kv = pskv.create("local")
kv.init(0, np.zeros(1024, np.float32))
values = [np.full(1024, i + 1, np.float32) for i in range(4)]
out = np.zeros(1024, np.float32)
quiet = store == "loopback"  # bench_dist's push_pull: a non-blocking push, then the pull

def push_pull():
    kv.push(0, values, block=not quiet)
    kv.pull(0, out=out)

def pushpull():
    kv.pushpull(0, values, out=out)

result = {}
for name, call in (("push_pull", push_pull), ("pushpull", pushpull)):
    for _ in range(iters // 10):
        call()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            call()
        samples.append((time.perf_counter() - start) / iters * 1e3)
    assert (out == 10).all(), out[:4]
    result[name] = min(samples)


def counted(call, n=50):
    # bytecodes, Python calls and C calls per call: deterministic, unlike the times on a shared machine
    counts = {"bytecodes": 0, "py_calls": 0, "c_calls": 0}

    def per_op(frame, event, arg):
        if event == "opcode":
            counts["bytecodes"] += 1
        return per_op

    def on_call(frame, event, arg):
        frame.f_trace_opcodes = True
        return per_op

    def on_profile(frame, event, arg):
        if event == "call":
            counts["py_calls"] += 1
        elif event == "c_call":
            counts["c_calls"] += 1

    sys.settrace(on_call)
    sys.setprofile(on_profile)
    for _ in range(n):
        call()
    sys.settrace(None)
    sys.setprofile(None)
    return {k: v / n for k, v in counts.items()}


result["counts"] = {"push_pull": counted(push_pull), "pushpull": counted(pushpull)}
kv.close()
result["pskv_file"] = pskv.__file__
print(json.dumps(result))
"""


def export(rev: str, dest: Path) -> tuple[Path, str]:
    """``pskv/`` of ``rev`` under ``dest`` (``WORKTREE``: this checkout's directory; a directory holding a
    ``pskv/``: that one, e.g. a copy with some edits undone); returns (path, commit)."""
    if Path(rev).is_dir() and (Path(rev) / "pskv").is_dir():
        return Path(rev).resolve(), f"directory {Path(rev).resolve()}"
    if rev == "WORKTREE":
        head = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        return REPO_DIR, f"{head}+worktree"
    return export_pskv(rev, dest)


def child(src: Path, iters: int, store: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(iters), store], cwd=str(src), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child for {src} failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    where = Path(result.pop("pskv_file")).resolve()
    if not where.is_relative_to(src.resolve()):
        raise RuntimeError(f"child imported {where}, not the pskv under {src}")
    return result


def summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", default="835c445", help="commit A (default 835c445)")
    p.add_argument("--b", default="HEAD",
                   help="commit B (default HEAD; WORKTREE: this checkout's pskv/; or a directory holding a pskv/)")
    p.add_argument("--pairs", type=int, default=7, help="A/B pairs, alternating order (default 7)")
    p.add_argument("--iters", type=int, default=3000, help="calls per timed sample (default 3000)")
    p.add_argument("--store", choices=("local", "loopback"), default="local",
                   help="local store, or dist_sync with an in-process server (default local)")
    p.add_argument("--json", type=Path, default=None,
                   help="result file (default bench/results/ab_local.json, with --store loopback ab_loopback.json)")
    args = p.parse_args(argv)
    if args.json is None:
        args.json = DEFAULT_JSON if args.store == "local" else DEFAULT_JSON.with_name("ab_loopback.json")
    with tempfile.TemporaryDirectory(prefix="pskv-ab-") as tmp:
        src_a, commit_a = export(args.a, Path(tmp) / "a")
        src_b, commit_b = export(args.b, Path(tmp) / "b")
        raw: dict[str, dict[str, list[float]]] = {"a": {c: [] for c in CALLS}, "b": {c: [] for c in CALLS}}
        counts: dict[str, Any] = {}
        for i in range(args.pairs):
            order = (("a", src_a), ("b", src_b)) if i % 2 == 0 else (("b", src_b), ("a", src_a))
            for side, src in order:
                result = child(src, args.iters, args.store)
                counts[side] = result["counts"]  # the same in every run of a commit
                for call in CALLS:
                    raw[side][call].append(float(result[call]))
            print(f"pair {i + 1}/{args.pairs}: " + ", ".join(
                f"{c} A {raw['a'][c][-1]:.4f} B {raw['b'][c][-1]:.4f} ms" for c in CALLS), file=sys.stderr)
    table: dict[str, Any] = {}
    for call in CALLS:
        a, b = summary(raw["a"][call]), summary(raw["b"][call])
        table[call] = {"a_ms": a, "b_ms": b, "ratio_b_over_a": b["median"] / a["median"],
                       "a_counts": counts["a"][call], "b_counts": counts["b"][call]}
        print(f"{call:10s} A {a['median']:.4f} ms [{a['min']:.4f}-{a['max']:.4f}]  "
              f"B {b['median']:.4f} ms [{b['min']:.4f}-{b['max']:.4f}]  B/A {b['median'] / a['median']:.3f}")
        print("           per call, A -> B: " + ", ".join(
            f"{k} {counts['a'][call][k]:g} -> {counts['b'][call][k]:g}" for k in counts["a"][call]))
    doc = {"a": {"rev": args.a, "commit": commit_a}, "b": {"rev": args.b, "commit": commit_b},
           "pairs": args.pairs, "iters": args.iters, "store": args.store, "key_bytes": 4096, "values": 4,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "results": table, "raw": raw}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
