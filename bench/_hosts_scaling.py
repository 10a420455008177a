"""Benchmark (c) of ``bench/bench_hosts.py`` (issue 23): the scaling curve, W = 2, 4, 8 worker hosts.

Usage (needs root, as the rest of ``bench_hosts.py``)::

    python bench/bench_hosts.py --setup c [--workers 2,4,8] [--rate 100mbit] [--quick] [--json PATH]

One set of ``2 * max(W)`` simulated hosts (:class:`~pskv.testing.hosts.SimulatedHosts`,
every link shaped with ``tc tbf`` to ``--rate`` both ways): hosts ``0..W-1`` run the
workers, hosts ``max(W)..max(W)+W-1`` the servers. Per round and per W (the order of the
W and of the two systems alternates between rounds, so a drift of the shared machine
favours neither):

* **pskv, dedicated servers**: ``pskv launch -n W -s W --launcher ssh -H <W worker hosts>
  --server-hostfile <W server hosts>`` running ``bench/_dist_worker_pskv.py`` (``pushpull``);
* **Gloo**: ``bench/_dist_worker_gloo.py`` on the W worker hosts (ring all-reduce).

**Why 100 Mbit/s and a 16 MB key.** Sixteen namespaces at W = 8 mean 17 pskv processes
(or 8 Gloo ranks) on the 2 cores of the machine this was written on; at 100 Mbit/s
(12.5 MB/s) all eight worker links together carry 100 MB/s each way, which those cores
move with room to spare, so the links, not the CPUs, set the pace (at 300 Mbit/s,
setup b's rate, W = 8 would need 300 MB/s each way through Python servers on 2 cores).
One 16 MB key (4 Mi float32) is the workload: a parameter server's link time is
1.3 s per iteration at 100 Mbit/s, the ring's 2.0-2.3 s at W = 4-8, so a job of a
few iterations takes seconds, and the ResNet-50 list (102 MB; ~15 s per ring iteration at
W = 8) would make one round take many minutes. A single key also asks pskv to split one
array evenly over W servers (its partitions), which is what keeps its curve flat.
``--only resnet50`` (or ``64mb``) runs the larger workloads of ``bench_dist.py`` instead.

**Per-worker throughput** = bytes of gradient one worker exchanges per second = one
value's bytes (M) / the slower worker's median time per iteration. **Bounds** (each
worker link carries, each way, per iteration): pskv with dedicated servers M (push out,
pull in), so at most the link rate; the ring 2(n-1)/n x M, so at most
rate x n / (2(n-1)) (rate at n = 2, 2/3 at 4, 4/7 at 8). The issue's goal: pskv flat
within 10 % from W = 2 to 8, the ring falling toward 1/1.75 of pskv.
Every job checks its pulled values once (1 + 2 + ... + W), as the other setups do.
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
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench_dist import DistWorkload, make_workloads

from pskv.testing.hosts import SimulatedHosts, Unavailable

C_RATE = "100mbit"
C_WORKERS = (2, 4, 8)
C_QUICK_WORKERS = (2, 4)
C_ROUNDS = 2
C_REPEATS = 3
C_MODE = "pushpull"  # one pskv call per iteration: the parameter server's all-reduce
FLAT_WITHIN = 0.10  # issue 23: pskv's per-worker throughput within 10 % from W = 2 to the largest W


def scaling_workloads(quick: bool) -> list[DistWorkload]:
    """The 16 MB key and ``bench_dist.py``'s ResNet-50 list and 64 MB key, pskv ``pushpull``."""
    mine = DistWorkload("16mb", "16 MB key", ((4 << 20,),), False, "GB/s", 1, 1, pskv_modes=(C_MODE,))
    others = [DistWorkload(w.id, w.name, w.shapes, w.as_list, w.unit, w.iters, w.warmup, pskv_modes=(C_MODE,))
              for w in make_workloads(quick) if w.id in ("resnet50", "64mb")]
    return [mine, *others]


def ring_bound_factor(workers: int) -> float:
    """The ring's per-worker throughput bound as a fraction of the link rate: n / (2(n-1))."""
    return workers / (2 * (workers - 1))


def parse_workers(text: str) -> list[int]:
    """``2,4,8`` -> [2, 4, 8] (sorted, distinct, each 2..125); ValueError otherwise."""
    counts = sorted({int(x) for x in text.split(",") if x.strip()})
    if not counts or counts[0] < 2 or counts[-1] > 125:
        raise ValueError(f"worker counts must be 2..125, got {text!r}")
    return counts


def throughput_rows(runs: dict[int, dict[str, list[list[dict[str, Any]]]]], work: DistWorkload,
                    bits: float | None, summarize: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per W: both systems' median time per iteration, per-worker throughput (bytes/s), bound and its share."""
    rows = []
    for workers, by_system in sorted(runs.items()):
        base = summarize(by_system, [work])[0]
        row: dict[str, Any] = {"workers": workers, "workload": work.id, "value_bytes": work.value_bytes,
                               "mode": C_MODE, "ratio_vs_gloo": base["ratio_vs_gloo"],
                               "ratio_by_round": base["ratio_by_round"]}
        for who, factor in (("pskv", 1.0), ("gloo", ring_bound_factor(workers))):
            if who not in base:
                continue
            stats = {k: base[who][k] for k in ("median_s", "min_s", "max_s")}
            stats["bytes_per_s"] = work.value_bytes / stats["median_s"]
            stats["bound_bytes_per_s"] = factor * bits / 8 if bits else None
            stats["bound_fraction"] = stats["bytes_per_s"] / stats["bound_bytes_per_s"] if bits else None
            row[who] = stats
        rows.append(row)
    return rows


def attach_traces(rows: Sequence[dict[str, Any]], jobs_log: dict[str, Any]) -> None:
    """Add to each row's systems worker host 1's link shares over the timed windows (mean over rounds):
    sending, receiving, and busy both ways at once (more than half the rate each way)."""
    for row in rows:
        for who in ("pskv", "gloo"):
            traces = [j["host1_trace"] for name, j in jobs_log.items()
                      if name.endswith(f"-w{row['workers']}-{who}") and "both_busy" in j.get("host1_trace", {})]
            if who in row and traces:
                row[who]["host1_link"] = {k: statistics.mean(t[k] for t in traces)
                                          for k in ("tx_fraction", "rx_fraction", "both_busy", "one_way")}


def flatness(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each system's throughput at the largest W over that at the smallest, and the verdict for pskv's."""
    out: dict[str, Any] = {}
    for who in ("pskv", "gloo"):
        have = [r for r in rows if who in r]
        if len(have) >= 2:
            out[who] = have[-1][who]["bytes_per_s"] / have[0][who]["bytes_per_s"]
    out["pskv_flat_within_10pct"] = None if "pskv" not in out else abs(out["pskv"] - 1) <= FLAT_WITHIN
    return out


def table_c(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of benchmark (c)."""
    def cell(d: dict[str, Any] | None) -> str:
        if not d:
            return "— | —"
        share = f"{100 * d['bound_fraction']:.0f} % of {d['bound_bytes_per_s'] / 1e6:.2f}" if d["bound_fraction"] else "—"
        return f"{d['bytes_per_s'] / 1e6:.2f} | {share}"

    lines = ["| W | pskv MB/s per worker | pskv: % of its bound (MB/s) | Gloo MB/s per worker | Gloo: % of its bound "
             "(MB/s) | pskv / Gloo | by round |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio_vs_gloo']:.2f}x" if r["ratio_vs_gloo"] else "—"
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_by_round"]) or "—"
        lines.append(f"| {r['workers']} | {cell(r.get('pskv'))} | {cell(r.get('gloo'))} | {ratio} | {rounds} |")
    return "\n".join(lines)


def run_rounds(args: argparse.Namespace, hosts: SimulatedHosts, work: DistWorkload, tmp: Path,
               jobs: dict[str, Callable[..., list[dict[str, Any]]]], counters: Callable[[SimulatedHosts], Any],
               ) -> tuple[dict[int, dict[str, list[list[dict[str, Any]]]]], dict[str, Any]]:
    """Every round: per W (alternating order) pskv dedicated and Gloo (alternating order). Returns the
    workers' JSON per W and system, and per job its wall time, link bytes per host and worker host 1's
    link trace over the timed window (:meth:`bench_hosts.LinkTrace.summary`: how often both ways were busy)."""
    from bench_hosts import LinkTrace, rate_bits, spec_file

    bits = rate_bits(args.rate)

    top = max(args.workers)
    runs: dict[int, dict[str, list[list[dict[str, Any]]]]] = {w: {"pskv": [], "gloo": []} for w in args.workers}
    jobs_log: dict[str, Any] = {}
    for rnd in range(args.rounds):
        for workers in args.workers if rnd % 2 == 0 else reversed(args.workers):
            on, servers = hosts.hosts[:workers], hosts.hosts[top:top + workers]
            for system in ("pskv", "gloo") if (rnd + workers) % 2 == 0 else ("gloo", "pskv"):
                rdir = tmp / f"r{rnd}-w{workers}-{system}"
                rdir.mkdir()
                spec = spec_file(rdir / "spec.json", [work], args.repeats, system == "pskv", workers)
                before = counters(hosts)
                lost_before = [hosts.tcp_losses(h.index) for h in (*on, *servers)]
                t0 = time.perf_counter()
                with LinkTrace(hosts) as trace:
                    runs[workers][system].append(jobs[system](spec, rdir, workers, on, servers))
                wall = time.perf_counter() - t0
                moved = [{k: a[k] - b[k] for k in ("tx", "rx")} for a, b in zip(counters(hosts), before)]
                # TCP retransmissions and packets the links' queues dropped, worker hosts then server hosts
                lost = [{k: hosts.tcp_losses(h.index)[k] - was[k] for k in ("retrans", "dropped")}
                        for h, was in zip((*on, *servers), lost_before)]
                window = runs[workers][system][-1][1]["results"][work.id].get("window_monotonic_s") or []
                jobs_log[f"r{rnd}-w{workers}-{system}"] = {
                    "wall_s": wall, "link_bytes": moved, "tcp_losses": lost,
                    "host1_trace": trace.summary(1, window, bits / 8 if bits else None)}
                median = statistics.median(runs[workers][system][-1][0]["results"][work.id]["samples_s"]
                                           ["push_pull" if system == "gloo" else C_MODE])
                print(f"round {rnd} W={workers} {system}: {wall:.1f} s, rank 0 median {median:.3g} s/iteration, "
                      f"{work.value_bytes / median / 1e6:.2f} MB/s per worker, TCP segments retransmitted "
                      f"{sum(x['retrans'] for x in lost)}, packets dropped by the links' queues "
                      f"{sum(x['dropped'] for x in lost)}", flush=True)
    return runs, jobs_log


def main_c(args: argparse.Namespace, argv: list[str]) -> int:
    """Benchmark (c): make the hosts, run the rounds, print the table, write the JSON."""
    import bench_hosts as bh

    wanted = args.only.split(",")[0].strip()
    work = next((w for w in scaling_workloads(args.quick) if w.id == wanted), None)
    if work is None:
        print(f"--setup c runs one workload of 16mb, resnet50, 64mb; got {args.only!r}", file=sys.stderr)
        return 2
    stamp = datetime.now(timezone.utc)
    json_path = args.json or bh.BENCH_DIR / "results" / (f"hosts_scaling_{stamp:%Y%m%d}_{args.rate}"
                                                         f"{'_quick' if args.quick else ''}.json")
    bits = bh.rate_bits(args.rate)
    started = time.perf_counter()
    try:
        hosts = SimulatedHosts(2 * max(args.workers), rate=args.rate, delay=args.delay)
    except Unavailable as exc:
        print(f"simulated hosts unavailable: {exc}", file=sys.stderr)
        return 2
    jobs = {"pskv": lambda spec, d, w, on, servers: bh.run_pskv(hosts, spec, d, args.timeout, w, on, servers,
                                                                 args.env),
            "gloo": lambda spec, d, w, on, servers: bh.run_gloo(hosts, spec, d, args.timeout, w, on)}
    with hosts, tempfile.TemporaryDirectory(prefix="pskv-bench-hosts-c-") as tmp_name:
        runs, jobs_log = run_rounds(args, hosts, work, Path(tmp_name), jobs, bh.link_counters)
    rows = throughput_rows(runs, work, bits, bh.summarize)
    attach_traces(rows, jobs_log)
    flat = flatness(rows)
    print(f"\nScaling: W worker hosts + W dedicated server hosts, links {args.rate} both ways, {work.name}, "
          f"{args.rounds} round(s) x {args.repeats} samples; throughput = bytes of one value / median time per "
          f"iteration (slower worker); bounds: pskv the link rate, the ring rate x n/(2(n-1))\n")
    print(table_c(rows))
    for row in rows:
        for who in (x for x in ("pskv", "gloo") if "host1_link" in row.get(x, {})):
            t = row[who]["host1_link"]
            print(f"W={row['workers']} {who}: worker host 1 sends at {100 * t['tx_fraction']:.0f} %, receives at "
                  f"{100 * t['rx_fraction']:.0f} % of the rate; both ways > half the rate {100 * t['both_busy']:.0f} % "
                  f"of the time, one way only {100 * t['one_way']:.0f} %")
    print("\nlargest W over smallest: " + ", ".join(f"{k} {v:.2f}" for k, v in flat.items() if isinstance(v, float))
          + f"; pskv flat within 10 %: {flat['pskv_flat_within_10pct']}")
    payload = {"benchmark": "bench_hosts", "setup": "c", "date_utc": stamp.isoformat(timespec="seconds"),
               "commit": bh.git_commit(), "argv": argv, "quick": args.quick, "rate": args.rate,
               "rate_bits_per_s": bits, "delay": args.delay, "rounds": args.rounds, "repeats": args.repeats,
               "workers": args.workers, "workload": {"id": work.id, "name": work.name, "bytes": work.value_bytes,
                                                     "pskv_call": C_MODE, "iters_per_sample": work.iters},
               "pskv_env": args.env,
               "uncommitted_in_pskv": subprocess.run(["git", "status", "--porcelain", "pskv"], cwd=bh.REPO_DIR,
                                                     capture_output=True, text=True).stdout.splitlines(),
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "loadavg_1_5_15_at_end": os.getloadavg()},
               "wall_s": time.perf_counter() - started, "rows": rows, "flatness": flat, "jobs": jobs_log,
               "runs": {str(w): r for w, r in runs.items()}}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path}")
    return 0
