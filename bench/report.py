"""The README's performance paragraph and docs/benchmarks.md's summary table, rendered from bench/results/*.json.

Both texts live between marker comments (``<!-- bench/report.py: NAME begin -->`` ...
``end``) and are written only by this script, from the same result files, so they cannot
disagree with each other or with the results::

    python bench/report.py           # rewrite both from the results
    python bench/report.py --check   # exit 1 if the committed text is not what the results give

``tests/unit/test_bench_report.py`` runs the check. Which file is the current run of each
benchmark is :data:`SOURCES`: point it at a new run's file (and run this script) when a
new run replaces the old one. Standard library (and ``git``) only.

**Staleness.** Each text names every result's date and the commit it measured, and says
which results are older than the code they measure: a result is current only while git
shows no commit changing ``pskv/`` after the one it measured (:func:`later_commits`); one
whose commit git cannot find (no history, a shallow clone) counts as older too. The
flag is part of the rendered text, so when the first change to ``pskv/`` lands after a
run, ``--check`` fails until the texts are rendered again and say so; ``--check`` also
prints, per result, how many commits changed ``pskv/`` since.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
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
    "dist4kb": "dist_4kb_20261129_session10_b.json",  # bench_dist.py --only 4kb: the 4 KB rows (newer than dist's)
    "train": "train.json",  # bench_train.py: W=2 training vs PyTorch DDP (Gloo)
    "hosts2": "hosts_a_1gbit_20261129_paced.json",  # bench_hosts.py (a): 2 simulated hosts, 1 Gbit/s links
    "hosts8": "hosts_b_20261129_paced.json",  # bench_hosts.py --setup b: 4 worker + 4 server hosts, 300 Mbit/s
    "scaling": "hosts_scaling_20261129_paced.json",  # bench_hosts.py --setup c: W = 2, 4, 8 worker + server hosts, 100 Mbit/s
    "train_hosts": "train_hosts_20261129_100mbit.json",  # bench_train_hosts.py: 4 worker + 4 server hosts vs DDP
    "sparse": "sparse_d694b02.json",  # bench_sparse.py: embedding tables, 100k-30M rows (charts only)
}
#: The results the two texts quote, in the order they are named.
QUOTED = ("local", "dist", "dist4kb", "hosts2", "hosts8", "scaling", "train_hosts", "train")
#: The code the results measure: a later commit changing it makes a result older than the code.
MEASURED = "pskv"
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
            if r["workload"] == workload and r["pskv_system"] == system and r["pskv_mode"] == mode
            and r[f"pskv_over_{against}"] is not None]  # (a run without that side: --no-gloo)


def train_rows(train: dict[str, Any]) -> list[tuple[str, list[float]]]:
    """(model name, pskv/DDP steps/s per server count) in the order of the results."""
    models: dict[str, list[float]] = {}
    for r in train["summary"]:
        if r["pskv_over_ddp"] is not None:
            models.setdefault(r["name"], []).append(float(r["pskv_over_ddp"]))
    return list(models.items())


def measured(data: dict[str, Any]) -> tuple[str, str]:
    """(date, commit) of a run: ``environment`` in bench_local/dist/train's files, top level in bench_hosts's."""
    env = data.get("environment", data)
    return env["date_utc"][:10], str(env.get("git_commit") or env.get("commit"))


def when(data: dict[str, Any]) -> str:
    date, commit = measured(data)
    base, _, dirty = commit.partition("+")
    return f"{date}, commit `{base}`" + ("+edits" if dirty else "")


def later_commits(commit: str) -> int | None:
    """How many commits changed ``pskv/`` after ``commit`` (``+dirty`` ignored); None when git cannot say."""
    base = commit.partition("+")[0]
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--count", f"{base}..HEAD", "--", MEASURED],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def older_than_code() -> dict[str, int | None]:
    """The quoted results that are older than the code they measure, with their later commits (None: unknown)."""
    later = {name: later_commits(measured(load(name))[1]) for name in QUOTED}
    return {name: n for name, n in later.items() if n != 0}


def staleness_sentence() -> str:
    older = older_than_code()
    if not older:
        return "Every run measured the current code."
    files = "every run" if len(older) == len(QUOTED) else ", ".join(f"`{SOURCES[n]}`" for n in older)
    return (f"Older than the code they measure: {files} (`{MEASURED}/` changed after the commit measured; "
            "`python bench/report.py --check` counts the commits): run them again before relying on a number.")


def hosts_ratios(hosts: dict[str, Any], workload: str, placement: str | None = None) -> list[float]:
    """pskv/Gloo of a simulated-hosts run over its pskv calls (push + pull, pushpull)."""
    return [float(r["ratio_vs_gloo"]) for r in hosts["rows"]
            if r["workload"] == workload and r.get("placement") == placement]


def source(name: str) -> str:
    return f"`{SOURCES[name]}`, {when(load(name))}"


def single_host_text() -> str:
    local, dist, small = load("local"), load("dist"), load("dist4kb")
    return (
        f"**One host.** The `local` store ({source('local')}) is {x(local_ratio(local, 'ResNet-50 (161 keys)'))} "
        f"MXNet 1.9.1 on the ResNet-50 parameter list, {x(local_ratio(local, '64 MB'))} on a 64 MB key and "
        f"{x(local_ratio(local, '4 KB'))} per 4 KB operation. With 2 workers (1 or 2 servers; {source('dist')}) "
        "the parameter server moves the ResNet-50 list at "
        f"{span(dist_ratios(dist, 'resnet50', 'pskv', 'push_pull', 'mxnet'))} MXNet's `dist_sync` and "
        f"{span(dist_ratios(dist, 'resnet50', 'pskv', 'push_pull', 'gloo'))} Gloo's bucketed all-reduce "
        f"(co-located processes use shared memory) and a 64 MB key at "
        f"{span(dist_ratios(dist, '64mb', 'pskv', 'push_pull', 'mxnet'))} MXNet. **Sockets only** (`PSKV_SHM=0`, "
        f"loopback, same run): the ResNet-50 list at {span(dist_ratios(dist, 'resnet50', 'pskv_tcp', 'push_pull', 'mxnet'))} "
        f"MXNet but {span(dist_ratios(dist, 'resnet50', 'pskv_tcp', 'push_pull', 'gloo'))} Gloo. A 4 KB push + pull "
        f"({source('dist4kb')}) at {span(dist_ratios(small, '4kb', 'pskv', 'push_pull', 'mxnet'))} MXNet's speed "
        f"(`pushpull` {span(dist_ratios(small, '4kb', 'pskv', 'pushpull', 'mxnet'))})."
    )


def between_hosts_text() -> str:
    two, eight = load("hosts2"), load("hosts8")
    return (
        "**Between hosts** (simulated: network namespaces joined by shaped veth links on this machine; "
        f"no real network measured). Two hosts at 1 Gbit/s ({source('hosts2')}): the ResNet-50 list at "
        f"{span(hosts_ratios(two, 'resnet50'))} Gloo, a 64 MB key at {span(hosts_ratios(two, '64mb'))}. Four "
        f"worker hosts at 300 Mbit/s ({source('hosts8')}), the ResNet-50 list: "
        f"{span(hosts_ratios(eight, 'resnet50', 'dedicated'))} Gloo with four dedicated server hosts, "
        f"{span(hosts_ratios(eight, 'resnet50', 'colocated'))} with the servers on the worker hosts. "
        f"{scaling_text()} {train_hosts_text()}"
    )


def scaling_text() -> str:
    """bench_hosts.py --setup c: how a worker's throughput holds as workers and servers are added."""
    scaling = load("scaling")
    rows = sorted(scaling["rows"], key=lambda r: r["workers"])
    counts = ", ".join(str(r["workers"]) for r in rows)
    return (f"{counts} worker hosts with as many server hosts at {scaling['rate'].replace('mbit', ' Mbit/s')} "
            f"({source('scaling')}), one 16 MB key: pskv's throughput per worker at W = {rows[-1]['workers']} is "
            f"{scaling['flatness']['pskv']:.2f} of W = {rows[0]['workers']}'s (Gloo's ring: "
            f"{scaling['flatness']['gloo']:.2f}), {', '.join(x(r['ratio_vs_gloo']) for r in rows)} Gloo.")


def train_hosts_text() -> str:
    """bench_train_hosts.py: training steps/s between hosts against DDP."""
    train = load("train_hosts")
    trained = ", ".join(f"{r['label']} {x(r['ratio_vs_ddp'])}" for r in train["rows"] if r["system"] != "ddp")
    return (f"Training between {train['workers']} worker and {train['servers']} server hosts at "
            f"{train['rate'].replace('mbit', ' Mbit/s')} ({source('train_hosts')}; steps/s vs DDP): {trained}.")


def render_performance() -> str:
    trained = "; ".join(f"{name} {span(ratios)}" for name, ratios in train_rows(load("train")))
    text = (
        "Performance on this project's 2-core machine (medians; ratios are pskv/other throughput, "
        "> 1: pskv faster; details in [docs/benchmarks.md](docs/benchmarks.md); this paragraph is "
        "written by `bench/report.py` from the result files in `bench/results` it names, each with "
        f"its date and the commit it measured). {single_host_text()} {between_hosts_text()} **Training** "
        f"on 2 workers ({source('train')}; steps/s vs PyTorch DDP with Gloo, 1 or 2 servers): {trained}. "
        f"{staleness_sentence()}"
    )
    for glued in ("4 KB", "64 MB", "> 1", "1 or 2", "2 workers", "1 Gbit/s", "300 Mbit/s", "push + pull"):  # kept on one line (no line starts with ">")
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
    small = load("dist4kb")  # the 4 KB rows: a newer run of that workload alone
    names = {r["workload"]: r["name"] for r in dist["summary"]}
    for workload in names:
        data, name = (small, "dist4kb") if workload == "4kb" else (dist, "dist")
        src = f"`{SOURCES[name]}` ({when(data)})"
        for system, mode, what in [("pskv", "push_pull", "push+pull"), ("pskv", "pushpull", "pushpull"),
                                   ("pskv_tcp", "push_pull", "push+pull, sockets only")]:
            for against, other in [("mxnet", "MXNet `dist_sync`"), ("gloo", "Gloo all-reduce")]:
                ratios = dist_ratios(data, workload, system, mode, against)
                if ratios:
                    lines.append(f"| W=2, S=1 / S=2 ({what}) | {names[workload]} | {other} | "
                                 f"{' / '.join(x(v) for v in ratios)} | {src} |")
    lines += hosts_summary_rows()
    src = f"`{SOURCES['train']}` ({when(train)})"
    for name, ratios in train_rows(train):
        lines.append(f"| training, W=2, S=1 / S=2 | {name} | PyTorch DDP (Gloo), steps/s | "
                     f"{' / '.join(x(v) for v in ratios)} | {src} |")
    lines += ["", staleness_sentence()]
    return "\n".join(lines) + "\n"


def hosts_summary_rows() -> list[str]:
    """The simulated-hosts rows: pskv/Gloo for push + pull / pushpull."""
    rows = []
    for name, where, placement in [("hosts2", "2 simulated hosts, 1 Gbit/s", None),
                                   ("hosts8", "4 worker hosts, 4 dedicated server hosts, 300 Mbit/s", "dedicated"),
                                   ("hosts8", "4 worker hosts, servers on them, 300 Mbit/s", "colocated")]:
        data = load(name)
        names = {r["workload"]: r["name"] for r in data["rows"]}
        for workload in names:
            ratios = hosts_ratios(data, workload, placement)
            if ratios:
                rows.append(f"| {where} (push+pull / pushpull) | {names[workload]} | Gloo all-reduce | "
                            f"{' / '.join(x(v) for v in ratios)} | `{SOURCES[name]}` ({when(data)}) |")
    scaling = load("scaling")
    for r in sorted(scaling["rows"], key=lambda r: r["workers"]):
        rows.append(f"| {r['workers']} worker hosts, {r['workers']} dedicated server hosts, {scaling['rate']} "
                    f"(pushpull) | 16 MB key | Gloo all-reduce | {x(r['ratio_vs_gloo'])} | "
                    f"`{SOURCES['scaling']}` ({when(scaling)}) |")
    train = load("train_hosts")
    for r in train["rows"]:
        if r["system"] != "ddp":
            rows.append(f"| training, {train['workers']} worker + {train['servers']} server hosts, {train['rate']} | "
                        f"{r['model']}, {r['label']} | PyTorch DDP (Gloo), steps/s | {x(r['ratio_vs_ddp'])} | "
                        f"`{SOURCES['train_hosts']}` ({when(train)}) |")
    return rows


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
    for name, later in older_than_code().items():
        date, commit = measured(load(name))
        count = "an unknown number of" if later is None else str(later)
        print(f"older than the code: {SOURCES[name]} measured {commit} on {date}; {count} later commits change "
              f"{MEASURED}/")
    if args.check and stale:
        print(f"not what bench/results gives: {', '.join(stale)} (run python bench/report.py)", file=sys.stderr)
        return 1
    print(("stale: " if args.check else "rewritten: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
