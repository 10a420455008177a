"""The chart of issue 11's simulated-host benchmarks: ``docs/hosts.svg`` from the JSON of ``bench_hosts.py``.

Usage (needs matplotlib: ``pip install -e '.[bench]'``)::

    python bench/plot_hosts.py [--a RESULT_A.json] [--b RESULT_B.json] [-o docs/hosts.svg]

Left, benchmark (a) (``--setup a``, two hosts): pskv / Gloo per workload and pskv call,
the bar at the ratio of the medians, the whisker over the per-round ratios. Right,
benchmark (b) (``--setup b``, four worker hosts on shaped links): iterations per second
of the ResNet-50 list for Gloo's ring and pskv with servers co-located and on dedicated
server hosts (bar: the slower worker's median; whisker: every sample's range), with the
rates the links alone allow (1x the model each way per worker link for dedicated
servers, 2(n-1)/n for the ring) and the target (1.3x Gloo). Defaults: the newest (by
their ``date_utc``) ``bench/results/hosts2_*.json`` and ``hosts8b_*.json`` that are not quick runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"
MODE_LABEL = {"push_pull": "push(block=False)+pull", "pushpull": "pushpull"}
COLORS = {"gloo": "#7f7f7f", "colocated": "#6baed6", "dedicated": "#08519c"}


def newest(pattern: str) -> Path | None:
    """The newest (by its ``date_utc``) result matching ``pattern`` that is not a quick run."""
    found = []
    for path in RESULTS.glob(pattern):
        data = json.loads(path.read_text(encoding="utf-8"))
        if not data.get("quick") and "rows" in data:
            found.append((str(data.get("date_utc", "")), path.name, path))
    return max(found)[2] if found else None


def plot_a(ax: Any, data: dict[str, Any], name: str) -> None:
    """Benchmark (a): pskv / Gloo by workload and call, whiskers over the rounds."""
    rows = data["rows"]
    labels = [f"{r['name'].split(' (')[0]}\n{MODE_LABEL.get(r['mode'], r['mode'])}" for r in rows]
    ratios = [r["ratio_vs_gloo"] or 0.0 for r in rows]
    lo = [x - min(r["ratio_by_round"] or [x]) for x, r in zip(ratios, rows)]
    hi = [max(r["ratio_by_round"] or [x]) - x for x, r in zip(ratios, rows)]
    xs = range(len(rows))
    ax.bar(xs, ratios, color=COLORS["colocated"], yerr=[lo, hi], capsize=4)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.text(-0.45, 1.02, "target 1.0x (Gloo)", ha="left", va="bottom", fontsize=8)
    for x, r in zip(xs, ratios):
        ax.text(x, r / 2, f"{r:.2f}x", ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("pskv throughput / Gloo's (> 1: pskv faster)")
    rate = data.get("rate") or "unshaped"
    ax.set_title(f"(a) 2 hosts, links {rate}: pskv vs Gloo\n{name}, commit {data.get('commit', '?')}", fontsize=9)


def plot_b(ax: Any, data: dict[str, Any], name: str) -> None:
    """Benchmark (b): it/s of Gloo, pskv co-located, pskv dedicated; link bounds; target."""
    rows = [r for r in data["rows"] if r["workload"] == "resnet50"]
    gloo = rows[0]["gloo"]
    bars: list[tuple[str, str, dict[str, Any]]] = [("Gloo ring\n(all-reduce)", "gloo", gloo)]
    for placement, title in (("colocated", "pskv co-located"), ("dedicated", "pskv dedicated")):
        for r in rows:
            if r["placement"] == placement and "pskv" in r:  # a run of --systems may lack a placement
                bars.append((f"{title}\n{MODE_LABEL.get(r['mode'], r['mode'])}", placement, r["pskv"]))
    xs = list(range(len(bars)))
    medians = [b[2]["median"] for b in bars]
    lo = [m - b[2]["range"][0] for m, b in zip(medians, bars)]
    hi = [b[2]["range"][1] - m for m, b in zip(medians, bars)]
    ax.bar(xs, medians, color=[COLORS[b[1]] for b in bars], yerr=[lo, hi], capsize=4)
    for x, m, b in zip(xs, medians, bars):
        note = f"{m:.3g}" + (f"\n{m / gloo['median']:.2f}x" if b[1] != "gloo" else "")
        ax.text(x, m / 2, note, ha="center", va="center", color="white", fontsize=8)
    lines = [(1.3 * gloo["median"], "target: 1.3x Gloo", "-.")]
    if gloo.get("link_bound_s"):
        lines.append((1 / gloo["link_bound_s"], "link rate, ring / co-located (1.5x model each way)", ":"))
    dedicated = next((r["pskv"] for r in rows if r["placement"] == "dedicated"), None)
    if dedicated and dedicated.get("link_bound_s"):
        lines.append((1 / dedicated["link_bound_s"], "link rate, dedicated servers (1x model each way)", "--"))
    for y, label, style in lines:
        ax.axhline(y, color="black", linestyle=style, linewidth=1)
        ax.text(-0.45, y, label, ha="left", va="bottom", fontsize=7)
    ax.set_xticks(xs, [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("ResNet-50 list (97.5 MiB): iterations / s")
    ax.set_title(f"(b) 4 worker hosts, links {data.get('rate')}: dedicated vs co-located servers vs ring\n"
                 f"{name}, commit {data.get('commit', '?')}", fontsize=9)


def main(argv: Sequence[str] | None = None) -> int:
    """Read the results, draw both panels, write the SVG."""
    p = argparse.ArgumentParser(description="docs/hosts.svg from bench_hosts.py results (issue 11, a and b)")
    p.add_argument("--a", type=Path, default=None, help="benchmark (a) JSON (default: newest hosts2_*.json)")
    p.add_argument("--b", type=Path, default=None, help="benchmark (b) JSON (default: newest hosts8b_*.json)")
    p.add_argument("-o", "--output", type=Path, default=BENCH_DIR.parent / "docs" / "hosts.svg")
    args = p.parse_args(argv)
    path_a, path_b = args.a or newest("hosts2_*.json"), args.b or newest("hosts8b_*.json")
    if path_a is None or path_b is None:
        print(f"need both results: (a) {path_a}, (b) {path_b}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "pskv-hosts"  # stable ids: the same results give the same file
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [4, 5]})
    plot_a(left, json.loads(path_a.read_text(encoding="utf-8")), path_a.name)
    plot_b(right, json.loads(path_b.read_text(encoding="utf-8")), path_b.name)
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, format="svg", metadata={"Date": None})
    print(f"wrote {args.output} from {path_a.name} and {path_b.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
