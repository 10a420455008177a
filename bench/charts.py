"""The benchmark charts of docs/benchmarks.md: PNGs in docs/img/ from the current runs in bench/results/.

Usage (needs matplotlib: ``pip install -c requirements/constraints.txt -e '.[bench]'``)::

    python bench/charts.py [-o docs/img] [--only hosts_scaling.png,...]

The runs are the ones ``bench/report.py`` names (:data:`report.SOURCES`), so the charts,
the summary table and the README's sentences show the same numbers:

* ``local.png`` — the local store's GB/s per workload, pskv and MXNet 1.9.1;
* ``dist.png`` — W=2 on loopback, pskv/MXNet and pskv/Gloo per workload and server count;
* ``train.png`` — training on 2 workers, steps/s of pskv (1 and 2 servers) over PyTorch DDP;
* ``sparse.png`` — a DLRM-style step's time against the embedding table's rows, pskv's
  table on the servers vs DDP with a dense or ``sparse=True`` table;
* ``hosts_scaling.png`` — ``bench_hosts.py --setup c``: per-worker throughput of pskv
  (dedicated servers) and Gloo's ring against the number of worker hosts W, with each
  one's bound (a run that :data:`CHART_SOURCES` names: report.py quotes no number of it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (bench/report.py: the same result files)

OUT = report.ROOT / "docs" / "img"
#: Runs only charted (not quoted by report.py's texts): the current run of each.
CHART_SOURCES = {
    "hosts_scaling": "hosts_scaling_20261129_paced.json",  # bench_hosts.py --setup c: W = 2, 4, 8, 100 Mbit/s
}
PSKV, OTHER, THIRD = "#08519c", "#bdbdbd", "#fd8d3c"


def save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})  # the same bytes for the same results
    plt.close(fig)


def chart_local(local: dict[str, Any], path: Path) -> None:
    rows = local["summary"]
    names = [r["workload"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    at = range(len(rows))
    ax.bar([i - 0.2 for i in at], [r["pskv_gbps"] for r in rows], 0.4, color=PSKV, label="pskv")
    ax.bar([i + 0.2 for i in at], [r["mxnet_gbps"] for r in rows], 0.4, color=OTHER, label="MXNet 1.9.1")
    for i, r in enumerate(rows):
        ax.annotate(report.x(r["pskv_over_mxnet"]), (i, max(r["pskv_gbps"], r["mxnet_gbps"])),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(at), names, fontsize=8)
    ax.set_ylabel("GB/s (one value / iteration time)")
    ax.set_title(f"Local store, 4 devices: push + pull ({report.SOURCES['local']})", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


def chart_ratios(groups: list[tuple[str, list[tuple[str, float, str]]]], title: str, path: Path) -> None:
    """Horizontal bars of ratios (1 = parity), one block of bars per group."""
    labels, values, colors = [], [], []
    for group, bars in groups:
        for label, value, color in bars:
            labels.append(f"{group}: {label}")
            values.append(value)
            colors.append(color)
    fig, ax = plt.subplots(figsize=(7.5, 0.28 * len(values) + 1.2))
    at = list(range(len(values)))[::-1]
    ax.barh(at, values, color=colors)
    for y, v in zip(at, values):
        ax.annotate(report.x(v), (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(at, labels, fontsize=7)
    ax.set_xscale("log")
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16) if min(values) / 2 <= t <= max(values) * 2]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("pskv / other throughput (log scale; > 1: pskv faster)")
    ax.set_title(title, fontsize=10)
    save(fig, path)


def chart_dist(dist: dict[str, Any], path: Path) -> None:
    names = {r["workload"]: r["name"] for r in dist["summary"]}
    groups = []
    for workload, name in names.items():
        bars = []
        for system, what in [("pskv", "push+pull"), ("pskv_tcp", "sockets only")]:
            for against, color in [("mxnet", PSKV), ("gloo", THIRD)]:
                for servers, ratio in enumerate(report.dist_ratios(dist, workload, system, "push_pull", against), 1):
                    bars.append((f"{what}, S={servers} vs {'MXNet' if against == 'mxnet' else 'Gloo'}", ratio, color))
        groups.append((name, bars))
    chart_ratios(groups, f"W=2 on loopback: pskv vs MXNet dist_sync and Gloo ({report.SOURCES['dist']})", path)


def chart_train(train: dict[str, Any], path: Path) -> None:
    groups = [(name, [(f"S={s}", ratio, PSKV) for s, ratio in enumerate(ratios, 1)])
              for name, ratios in report.train_rows(train)]
    chart_ratios(groups, f"Training, 2 workers: steps/s over PyTorch DDP ({report.SOURCES['train']})", path)


def chart_sparse(sparse: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for system, label, color in [("pskv", "pskv (table on 2 servers)", PSKV), ("ddp_dense", "DDP, dense table", OTHER),
                                 ("ddp_sparse", "DDP, sparse=True", THIRD)]:
        runs = [r for r in sparse["results"] if r["system"] == system and r.get("median_s") is not None]
        ax.plot([r["rows"] for r in runs], [r["median_s"] * 1e3 for r in runs], "o-", color=color, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("embedding table rows")
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"Sparse embeddings, 2 workers ({report.SOURCES['sparse']})", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


def chart_scaling(run: dict[str, Any], path: Path) -> None:
    """Per-worker MB/s against W: pskv and the ring (measured, solid) and their bounds (dashed)."""
    rows = run["rows"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for who, label, color in [("pskv", "pskv, W dedicated server hosts", PSKV), ("gloo", "Gloo all-reduce (ring)", THIRD)]:
        have = [r for r in rows if who in r]
        at = [r["workers"] for r in have]
        ax.plot(at, [r[who]["bytes_per_s"] / 1e6 for r in have], "o-", color=color, label=label)
        if have and have[0][who].get("bound_bytes_per_s"):
            ax.plot(at, [r[who]["bound_bytes_per_s"] / 1e6 for r in have], "--", color=color, linewidth=1,
                    label=f"{'pskv' if who == 'pskv' else 'ring'} bound ({'link rate' if who == 'pskv' else 'rate x n/(2(n-1))'})")
    for r in rows:
        if r.get("ratio_vs_gloo") and "pskv" in r:
            ax.annotate(f"pskv/Gloo {report.x(r['ratio_vs_gloo'])}", (r["workers"], r["pskv"]["bytes_per_s"] / 1e6),
                        xytext=(0, -13), textcoords="offset points", ha="center", fontsize=7, color=PSKV)
    workers = [r["workers"] for r in rows]
    ax.set_xscale("log", base=2)
    ax.set_xticks(workers, [str(w) for w in workers])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("worker hosts W (and W server hosts for pskv)")
    ax.set_ylabel("MB/s per worker (value bytes / iteration)")
    ax.set_title(f"Scaling, {run['workload']['name']}, links {run['rate']} ({CHART_SOURCES['hosts_scaling']}, "
                 f"{run['date_utc'][:10]}, {run['commit']})", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")
    save(fig, path)


CHARTS = {"local.png": ("local", chart_local), "dist.png": ("dist", chart_dist), "train.png": ("train", chart_train),
          "sparse.png": ("sparse", chart_sparse), "hosts_scaling.png": ("hosts_scaling", chart_scaling)}


def load(source: str) -> dict[str, Any]:
    """A run that report.py names, or one of :data:`CHART_SOURCES`."""
    if source in report.SOURCES:
        return report.load(source)
    data: dict[str, Any] = json.loads((report.RESULTS / CHART_SOURCES[source]).read_text(encoding="utf-8"))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=OUT, help="folder for the PNGs (default docs/img)")
    parser.add_argument("--only", default=None, help=f"charts to draw, comma-separated (default all: {', '.join(CHARTS)})")
    args = parser.parse_args(argv)
    wanted = [n.strip() for n in args.only.split(",")] if args.only else list(CHARTS)
    if set(wanted) - set(CHARTS):
        parser.error(f"--only: expected some of {', '.join(CHARTS)}, got {args.only!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (source, draw) in ((n, CHARTS[n]) for n in wanted):
        draw(load(source), args.out / name)
        print(f"wrote {args.out / name} from bench/results/{report.SOURCES.get(source) or CHART_SOURCES[source]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
