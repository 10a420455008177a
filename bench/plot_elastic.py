#!/usr/bin/env python
"""``docs/img/elastic_timeline.svg``: the timeline of one real elastic job with a shrink and a grow.

Reads the ``timeline`` run of a ``bench/bench_elastic.py --json`` result (3 workers, slot 1 SIGKILLs itself
mid-step, later a fourth slot joins) and draws, per worker slot, a lane of its committed steps over time;
the kill, the scheduler's views (failure, grow), the survivors' restore and redo, the work voided, and the
joiner's start, its wait to be admitted at a commit, its pull of the model and its first step. Below, two
zooms: the shrink and the grow. Needs matplotlib (``pip install -e '.[bench]'``).

    python bench/plot_elastic.py /tmp/elastic.json                  # -> docs/img/elastic_timeline.svg
    python bench/plot_elastic.py RESULT.json --out /tmp/timeline.svg
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "elastic_timeline.svg"
COLORS = {"commit": "#1f77b4", "kill": "#d62728", "failure": "#d62728", "grow": "#2ca02c", "restore": "#ff7f0e",
          "voided": "#bbbbbb", "startup": "#c7d7ea", "held": "#f2d48f", "pull": "#9467bd"}


def timeline_run(result: dict[str, Any]) -> dict[str, Any]:
    """The result's timeline run (its first, if several)."""
    for run in result["runs"]:
        if run["case"] == "timeline":
            return dict(run)
    raise SystemExit("the result has no timeline run (bench_elastic.py without --no-timeline)")


def of(events: Sequence[dict[str, Any]], kind: str, slot: int | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and (slot is None or e["slot"] == slot)]


def draw(ax: Axes, events: Sequence[dict[str, Any]], t0: float, labels: bool) -> None:
    """Every lane and mark of the run on ``ax`` (times relative to ``t0``)."""
    slots = sorted({e["slot"] for e in events if e["kind"] == "start"})
    rel = {id(e): e["t"] - t0 for e in events}
    for slot in slots:
        y = slot
        start = of(events, "start", slot)[0]
        started = next(iter(of(events, "started", slot)), None)  # a joiner: when the launcher started it
        joined = next(iter(of(events, "joined", slot)), None)
        begin = rel[id(started)] if started else rel[id(start)]
        if joined:
            ax.barh(y, rel[id(joined)] - begin, left=begin, height=0.5, color=COLORS["startup"], zorder=1)
        waits, pulled = next(iter(of(events, "waits", slot)), None), next(iter(of(events, "pulled", slot)), None)
        if waits and joined:  # held by the scheduler until the admitting commit
            ax.barh(y, rel[id(joined)] - rel[id(waits)], left=rel[id(waits)], height=0.5, color=COLORS["held"], zorder=2)
        if pulled and joined:
            ax.barh(y, float(pulled["text"]), left=rel[id(pulled)] - float(pulled["text"]), height=0.5,
                    color=COLORS["pull"], zorder=2)
        ticks = [rel[id(e)] for e in of(events, "commit", slot)]
        ax.vlines(ticks, y - 0.3, y + 0.3, color=COLORS["commit"], linewidth=0.8, zorder=3)
        for kill in of(events, "kill", slot):
            ax.plot(rel[id(kill)], y, "x", color=COLORS["kill"], markersize=9, markeredgewidth=2, zorder=5)
        for restore in of(events, "restore", slot):
            done = [e for e in of(events, "commit", slot) if e["t"] < restore["t"]]
            redo = next((e for e in of(events, "commit", slot) if e["t"] > restore["t"]), None)
            if done:  # the work since the last commit, voided by the failure view
                ax.barh(y, rel[id(restore)] - rel[id(done[-1])], left=rel[id(done[-1])], height=0.5,
                        color=COLORS["voided"], hatch="//", zorder=2)
            if redo:
                ax.barh(y, rel[id(redo)] - rel[id(restore)], left=rel[id(restore)], height=0.5,
                        color=COLORS["restore"], alpha=0.6, zorder=2)
            ax.plot(rel[id(restore)], y, "v", color=COLORS["restore"], markersize=6, zorder=5)
    last = max(e["t"] for e in of(events, "commit"))
    shown = [v for v in of(events, "view") if v["text"] in ("failure", "grow") and v["t"] <= last]
    for row, view in enumerate(shown):  # not the views of the job's end (every worker leaves then)
        color = COLORS["failure" if view["text"] == "failure" else "grow"]
        ax.axvline(rel[id(view)], color=color, linestyle="--", linewidth=1, zorder=4)
        if labels:  # staggered rows; near the end, to the line's left
            right = rel[id(view)] > 0.75 * (last - t0)
            ax.text(rel[id(view)], -1.25 + 0.3 * (row % 2), f" view {view['step']}: {view['text']}, "
                    f"slots {','.join(map(str, view['members']))} ", color=color, fontsize=8, va="top",
                    ha="right" if right else "left")
    for mark in of(events, "grow"):
        ax.axvline(rel[id(mark)], color=COLORS["grow"], linestyle=":", linewidth=1, zorder=4)
        if labels:
            ax.text(rel[id(mark)], -0.6, f" hosts file: {mark['text']} slots", color=COLORS["grow"], fontsize=8,
                    va="top")
    ax.set_yticks(slots, [f"slot {s}" for s in slots])
    ax.set_ylim(len(slots) - 0.5, -1.35)
    ax.grid(axis="x", linewidth=0.3)


def legend(ax: Axes) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Line2D([], [], color=COLORS["commit"], marker="|", linestyle="", markersize=10, label="committed step"),
               Line2D([], [], color=COLORS["kill"], marker="x", linestyle="", label="SIGKILL (mid-step)"),
               Line2D([], [], color=COLORS["restore"], marker="v", linestyle="", label="restore"),
               Patch(facecolor=COLORS["voided"], hatch="//", label="work voided (since the last commit)"),
               Patch(facecolor=COLORS["restore"], alpha=0.6, label="redo to the next commit"),
               Patch(facecolor=COLORS["startup"], label="process start, imports, registration"),
               Patch(facecolor=COLORS["held"], label="held until the next commit"),
               Patch(facecolor=COLORS["pull"], label="joiner pulls the model"),
               Line2D([], [], color=COLORS["failure"], linestyle="--", label="failure view"),
               Line2D([], [], color=COLORS["grow"], linestyle="--", label="grow view")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def plot(result: dict[str, Any], out: Path) -> None:
    """Draw the figure of ``result``'s timeline run into ``out`` (SVG)."""
    run = timeline_run(result)
    events, m = run["events"], run.get("metrics", {})
    t0 = min(e["t"] for e in events if e["kind"] == "start")
    kill = of(events, "kill")[0]["t"] - t0
    grow_view = next(e for e in of(events, "view") if e["text"] == "grow")["t"] - t0
    fig = plt.figure(figsize=(12, 6.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1], hspace=0.45, wspace=0.12, right=0.8)
    top = fig.add_subplot(grid[0, :])
    draw(top, events, t0, labels=True)
    legend(top)
    top.set_title(f"pskv launch -n 2:4, 3 workers: slot 1 SIGKILLed, later slot 3 joins "
                  f"({result.get('date_utc', '?')}, commit {result.get('commit', '?')})", fontsize=10)
    top.set_xlabel("seconds since the first worker process started")
    zooms = [(kill, f"the shrink: kill -> failure view {1e3 * m.get('kill_detect', float('nan')):.0f} ms, "
                    f"survivors' stall {1e3 * m.get('kill_stall', float('nan')):.0f} ms"),
             (grow_view, f"the grow: joiner started -> 1st commit {m.get('join_start_to_first_commit', float('nan')):.2f} s,"
                         f" members' stall {1e3 * m.get('join_stall', float('nan')):.0f} ms")]
    for col, (center, name) in enumerate(zooms):
        ax = fig.add_subplot(grid[1, col])
        draw(ax, events, t0, labels=False)
        ax.set_xlim(center - 0.25, center + 0.35)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("seconds")
        if col:
            ax.set_yticklabels([])
        top.axvspan(center - 0.25, center + 0.35, color="#eeeeee", zorder=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    plt.rcParams["svg.hashsalt"] = "pskv"  # the same run gives the same file
    svg = out.suffix == ".svg"  # another suffix (.png) is for looking at it
    fig.savefig(out, **({"format": "svg", "metadata": {"Date": None}} if svg else {"dpi": 90}))
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("result", type=Path, help="a bench_elastic.py --json result with a timeline run")
    p.add_argument("--out", type=Path, default=OUT, help=f"the SVG (default {OUT.relative_to(ROOT)})")
    args = p.parse_args(argv)
    plot(json.loads(args.result.read_text(encoding="utf-8")), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
