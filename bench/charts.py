"""The benchmark charts of docs/benchmarks.md: PNGs in docs/img/ from the current runs in bench/results/.

Usage (needs matplotlib: ``pip install -c requirements/constraints.txt -e '.[bench]'``)::

    python bench/charts.py [-o docs/img]

The runs are the ones ``bench/report.py`` names (:data:`report.SOURCES`), so the charts,
the summary table and the README's sentences show the same numbers:

* ``local.png`` — the local store's GB/s per workload, pskv and MXNet 1.9.1;
* ``dist.png`` — W=2 on loopback, pskv/MXNet and pskv/Gloo per workload and server count;
* ``train.png`` — training on 2 workers, steps/s of pskv (1 and 2 servers) over PyTorch DDP;
* ``sparse.png`` — a DLRM-style step's time against the embedding table's rows, pskv's
  table on the servers vs DDP with a dense or ``sparse=True`` table.
"""

from __future__ import annotations

import argparse
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


CHARTS = {"local.png": ("local", chart_local), "dist.png": ("dist", chart_dist), "train.png": ("train", chart_train),
          "sparse.png": ("sparse", chart_sparse)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=OUT, help="folder for the PNGs (default docs/img)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (source, draw) in CHARTS.items():
        draw(report.load(source), args.out / name)
        print(f"wrote {args.out / name} from bench/results/{report.SOURCES[source]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
