"""The README's performance paragraph and docs/benchmarks.md's summary table, rendered from bench/results/*.json.

Both texts live between marker comments (``<!-- bench/report.py: NAME begin -->`` ...
``end``) and are written only by this script, from the same result files, so they cannot
disagree with each other or with the results::

    python bench/report.py           # rewrite both from the results
    python bench/report.py --check   # exit 1 if the committed text is not what the results give

``tests/unit/test_bench_report.py`` runs the check. Which file is the current run of each
benchmark is :data:`SOURCES`: point it at a new run's file (and run this script) when a
new run replaces the old one. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: The current run of each benchmark (docs/benchmarks.md describes each).
SOURCES = {
    "local": "local.json",  # bench_local.py: the local store vs MXNet 1.9.1
    "dist": "dist.json",  # bench_dist.py: W=2 on loopback vs MXNet dist_sync and Gloo
    "train": "train.json",  # bench_train.py: W=2 training vs PyTorch DDP (Gloo)
    "sparse": "sparse_d694b02.json",  # bench_sparse.py: embedding tables, 100k-30M rows (charts only)
}
TARGETS = {"README.md": "performance", "docs/benchmarks.md": "summary"}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / SOURCES[name]).read_text(encoding="utf-8"))
    return data


def x(ratio: float) -> str:
    """A throughput ratio as the docs write it: 0.93x, 1.18x, 3.6x (two decimals below 2, where they matter)."""
    return f"{ratio:.2f}x" if ratio < 2 else f"{ratio:.1f}x"


def span(ratios: list[float]) -> str:
    """A range of ratios: ``3.6x`` when they round alike, else ``5.3-8.3x``."""
    lo, hi = x(min(ratios)), x(max(ratios))
    return lo if lo == hi else f"{lo[:-1]}-{hi}"


def local_ratio(local: dict[str, Any], workload: str) -> float:
    row = next(r for r in local["summary"] if r["workload"] == workload)
    return float(row["pskv_over_mxnet"])


def dist_ratios(dist: dict[str, Any], workload: str, system: str, mode: str, against: str) -> list[float]:
    """pskv/other over the server counts (S=1, S=2) of one workload, system and call."""
    return [float(r[f"pskv_over_{against}"]) for r in dist["summary"]
            if r["workload"] == workload and r["pskv_system"] == system and r["pskv_mode"] == mode]


def train_rows(train: dict[str, Any]) -> list[tuple[str, list[float]]]:
    """(model name, pskv/DDP steps/s per server count) in the order of the results."""
    models: dict[str, list[float]] = {}
    for r in train["summary"]:
        if r["pskv_over_ddp"] is not None:
            models.setdefault(r["name"], []).append(float(r["pskv_over_ddp"]))
    return list(models.items())


def when(data: dict[str, Any]) -> str:
    env = data["environment"]
    return f"{env['date_utc'][:10]}, commit `{env['git_commit']}`"


def render_performance() -> str:
    local, dist, train = load("local"), load("dist"), load("train")
    trained = "; ".join(f"{name} {span(ratios)}" for name, ratios in train_rows(train))
    text = (
        "Performance on this project's 2-core machine (medians; ratios are pskv/other throughput, "
        "> 1: pskv faster; details in [docs/benchmarks.md](docs/benchmarks.md); this paragraph is "
        "written by `bench/report.py` from `bench/results/local.json`, `dist.json` and `train.json`): "
        f"the `local` store is {x(local_ratio(local, 'ResNet-50 (161 keys)'))} MXNet 1.9.1 on the ResNet-50 "
        f"parameter list, {x(local_ratio(local, '64 MB'))} on a 64 MB key "
        f"and {x(local_ratio(local, '4 KB'))} per 4 KB operation; with 2 workers (1 or 2 servers) the parameter "
        f"server moves the ResNet-50 list at {span(dist_ratios(dist, 'resnet50', 'pskv', 'push_pull', 'mxnet'))} "
        f"MXNet's `dist_sync` and {span(dist_ratios(dist, 'resnet50', 'pskv', 'push_pull', 'gloo'))} Gloo's "
        "bucketed all-reduce (co-located processes use shared memory; over sockets alone it is "
        f"{span(dist_ratios(dist, 'resnet50', 'pskv_tcp', 'push_pull', 'mxnet'))} MXNet), a 64 MB key at "
        f"{span(dist_ratios(dist, '64mb', 'pskv', 'push_pull', 'mxnet'))} MXNet, and a 4 KB push + pull at "
        f"{span(dist_ratios(dist, '4kb', 'pskv', 'push_pull', 'mxnet'))} MXNet (`pushpull` "
        f"{span(dist_ratios(dist, '4kb', 'pskv', 'pushpull', 'mxnet'))}). Training on 2 workers "
        f"(steps/s vs PyTorch DDP with Gloo, 1 or 2 servers): {trained}."
    )
    for glued in ("4 KB", "64 MB", "> 1", "1 or 2", "2 workers"):  # kept on one line (no line starts with ">")
        text = text.replace(glued, glued.replace(" ", "\xa0"))
    return textwrap.fill(text, width=95, break_long_words=False, break_on_hyphens=False).replace("\xa0", " ") + "\n"


def render_summary() -> str:
    local, dist, train = load("local"), load("dist"), load("train")
    lines = [
        "Summary of the current runs (pskv/other throughput, > 1: pskv faster; written by",
        "`bench/report.py` from the result files named, as the README's performance paragraph is):",
        "",
        "| benchmark | workload | compared with | pskv/other | results |",
        "|---|---|---|---|---|",
    ]
    src = f"`{SOURCES['local']}` ({when(local)})"
    for r in local["summary"]:
        lines.append(f"| local store | {r['workload']} | MXNet 1.9.1 `local` | {x(r['pskv_over_mxnet'])} | {src} |")
    src = f"`{SOURCES['dist']}` ({when(dist)})"
    names = {r["workload"]: r["name"] for r in dist["summary"]}
    for workload in names:
        for system, mode, what in [("pskv", "push_pull", "push+pull"), ("pskv", "pushpull", "pushpull"),
                                   ("pskv_tcp", "push_pull", "push+pull, sockets only")]:
            for against, other in [("mxnet", "MXNet `dist_sync`"), ("gloo", "Gloo all-reduce")]:
                ratios = dist_ratios(dist, workload, system, mode, against)
                if ratios:
                    lines.append(f"| W=2, S=1 / S=2 ({what}) | {names[workload]} | {other} | "
                                 f"{' / '.join(x(v) for v in ratios)} | {src} |")
    src = f"`{SOURCES['train']}` ({when(train)})"
    for name, ratios in train_rows(train):
        lines.append(f"| training, W=2, S=1 / S=2 | {name} | PyTorch DDP (Gloo), steps/s | "
                     f"{' / '.join(x(v) for v in ratios)} | {src} |")
    return "\n".join(lines) + "\n"


RENDER = {"performance": render_performance, "summary": render_summary}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench/report.py: {name} begin -->\n", f"<!-- bench/report.py: {name} end -->"


def replaced(text: str, name: str, body: str, where: str) -> str:
    begin, end = markers(name)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"{where}: needs exactly one {begin.strip()} ... {end} pair")
    return pattern.sub(lambda _: begin + body + end, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed text differs from the results")
    args = parser.parse_args(argv)
    stale = []
    for doc, name in TARGETS.items():
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        new = replaced(text, name, RENDER[name](), doc)
        if new != text:
            stale.append(doc)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"not what bench/results gives: {', '.join(stale)} (run python bench/report.py)", file=sys.stderr)
        return 1
    print(("stale: " if args.check else "rewritten: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
