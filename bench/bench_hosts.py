"""Benchmark (a) of issue 11: pskv against Gloo all-reduce on two simulated hosts, over the same links.

Usage (needs root: network namespaces, see :mod:`pskv.testing.hosts`)::

    python bench/bench_hosts.py [--quick] [--rate RATE] [--delay DELAY] [--rounds R] [--repeats N]
                                [--only resnet50,64mb] [--json PATH]

Two hosts are made with :class:`~pskv.testing.hosts.SimulatedHosts` (a network namespace
each, with its own host name, joined by veth links to a bridge; ``--rate`` shapes every
link both ways with ``tc tbf``, ``--delay`` adds ``netem`` delay). On them, per round:

* **pskv**: ``pskv launch -n 2 -s 2 --launcher ssh -H HOSTFILE --ssh-command ENTER --
  python bench/_dist_worker_pskv.py SPEC`` — the real ssh launcher path; the scheduler
  on host 0, one server and one worker per host (the launcher's default placement), so
  a worker reaches its own host's server through shared memory and the other host's
  through sockets across the link;
* **Gloo**: ``bench/_dist_worker_gloo.py`` on each host, started through the same remote
  shell (``ENTER HOST 'env GLOO_INIT=tcp://<host 0>:PORT GLOO_SOCKET_IFNAME=eth0 RANK=r ...'``;
  the interface is named because a simulated host's name does not resolve to its address).

The worker programs and the workloads are those of ``bench/bench_dist.py`` (W = 2; the
ResNet-50 list of 161 arrays and one 64 MB key, push + pull and pushpull for pskv, a
DDP-style bucketed all-reduce for Gloo; every result checked once). Per workload and
mode the reported time is the slower worker's median over all its samples; the range is
the lowest and highest sample of either worker. Ratios are Gloo's time / pskv's (> 1:
pskv faster), over all rounds and per round (the rounds run pskv then Gloo, so a drift
of a shared machine shows as ratios that differ between rounds). The bytes each host sent over its link during each job are recorded. The
JSON (default ``bench/results/hosts2_<UTC date>[_RATE][_quick].json``) holds the raw samples.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _procs import ProcError, ProcGroup, install_sigterm_handler  # noqa: E402
from bench_dist import WORKERS, DistWorkload, display, make_workloads  # noqa: E402

from pskv.testing.hosts import HOST_DEV, SimulatedHosts, Unavailable  # noqa: E402

GLOO_PORT = 29500  # a fresh namespace: nothing else listens there
SCHEDULER_PORT = 9091
_JSON_LINE = re.compile(r"^\[worker (\d+)\] (\{.*\})\s*$", re.M)


def spec_file(path: Path, workloads: Sequence[DistWorkload], repeats: int, pskv: bool) -> Path:
    """The workers' JSON spec (pskv runs every pskv mode of the workload, Gloo push_pull)."""
    spec = {"repeats": repeats,
            "workloads": [w.spec(i, w.pskv_modes if pskv else ("push_pull",)) for i, w in enumerate(workloads)]}
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def run_pskv(hosts: SimulatedHosts, spec: Path, tmp: Path, timeout: float) -> list[dict[str, Any]]:
    """One pskv job through ``pskv launch --launcher ssh``; the workers' JSON, by rank."""
    hostfile = hosts.hostfile(tmp / "hostfile", [1] * len(hosts))
    argv = [sys.executable, "-m", "pskv", "launch", "-n", str(WORKERS), "-s", str(len(hosts)), "--launcher", "ssh",
            "-H", str(hostfile), "--ssh-command", hosts.ssh_command(), "--port", str(SCHEDULER_PORT),
            "--timeout", str(timeout), "--exit-grace", "10", "--stop-grace", "2",
            "--env", "PSKV_STARTUP_TIMEOUT=60", "--",
            sys.executable, str(BENCH_DIR / "_dist_worker_pskv.py"), str(spec)]
    res = subprocess.run(argv, cwd=REPO_DIR, capture_output=True, text=True, timeout=timeout + 30)
    out = res.stdout + res.stderr
    (tmp / "pskv.log").write_text(out, encoding="utf-8")
    found = {int(m[1]): json.loads(m[2]) for m in _JSON_LINE.finditer(res.stdout)}
    if res.returncode != 0 or sorted(found) != list(range(WORKERS)):
        raise ProcError(f"pskv launch exited {res.returncode} with results of ranks {sorted(found)}:\n{out[-3000:]}")
    return [found[r] for r in range(WORKERS)]


def run_gloo(hosts: SimulatedHosts, spec: Path, tmp: Path, timeout: float) -> list[dict[str, Any]]:
    """Gloo's two ranks, one per host, started through the hosts' remote shell; their JSON, by rank."""
    enter = shlex.split(hosts.ssh_command())
    init = f"tcp://{hosts[0].address}:{GLOO_PORT}"
    script = str(BENCH_DIR / "_dist_worker_gloo.py")
    with ProcGroup("gloo", tmp / "gloo") as group:
        procs = []
        for r in range(WORKERS):
            remote = shlex.join(["env", f"GLOO_INIT={init}", f"GLOO_SOCKET_IFNAME={HOST_DEV}", f"RANK={r}", f"WORLD_SIZE={WORKERS}",
                                 sys.executable, script, str(spec)])
            procs.append(group.start(f"worker{r}", [*enter, "-o", "BatchMode=yes", hosts[r % len(hosts)].address,
                                                    f"cd {shlex.quote(str(REPO_DIR))} && {remote}"],
                                     {k: v for k, v in os.environ.items()
                                      if k not in ("RANK", "WORLD_SIZE", "GLOO_INIT")}))
        group.wait(procs, timeout)
        return [p.json_line() for p in procs]


def link_sent(hosts: SimulatedHosts) -> list[int]:
    """Bytes each host has sent on its link so far."""
    return [hosts.link_bytes(i)["tx"] for i in range(len(hosts))]


def summarize(runs: dict[str, list[list[dict[str, Any]]]], workloads: Sequence[DistWorkload]) -> list[dict[str, Any]]:
    """One row per workload and pskv mode: medians (slower worker), sample ranges, ratio to Gloo."""
    def stats(system: str, wid: str, mode: str, rnd: int | None = None) -> tuple[float, float, float] | None:
        per_rank: dict[int, list[float]] = {}
        chosen = runs.get(system, [])
        for workers in chosen if rnd is None else chosen[rnd:rnd + 1]:
            for w in workers:
                per_rank.setdefault(int(w["rank"]), []).extend(w["results"][wid]["samples_s"][mode])
        if not per_rank:
            return None
        every = [s for samples in per_rank.values() for s in samples]
        return max(statistics.median(s) for s in per_rank.values()), min(every), max(every)

    rows = []
    for work in workloads:
        gloo = stats("gloo", work.id, "push_pull")
        for mode in work.pskv_modes:
            mine = stats("pskv", work.id, mode)
            row: dict[str, Any] = {"workload": work.id, "name": work.name, "mode": mode, "unit": work.unit}
            for system, st in (("pskv", mine), ("gloo", gloo)):
                if st is not None:
                    row[system] = {"median_s": st[0], "min_s": st[1], "max_s": st[2],
                                   "median": display(st[0], work),
                                   "range": sorted([display(st[1], work), display(st[2], work)])}
            row["ratio_vs_gloo"] = gloo[0] / mine[0] if gloo and mine else None
            by_round = [(stats("gloo", work.id, "push_pull", i), stats("pskv", work.id, mode, i))
                        for i in range(min(len(runs.get("pskv", [])), len(runs.get("gloo", []))))]
            row["ratio_by_round"] = [g[0] / m[0] for g, m in by_round if g and m]
            rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the rows."""
    def cell(d: dict[str, Any] | None) -> str:
        if not d:
            return "—"
        lo, hi = d["range"]
        return f"{d['median']:.3g} ({lo:.3g}–{hi:.3g})"

    lines = ["| workload | pskv call | pskv median (range) | Gloo median (range) | pskv / Gloo | by round |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio_vs_gloo']:.2f}x" if r["ratio_vs_gloo"] else "—"
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_by_round"]) or "—"
        lines.append(f"| {r['name']}, {r['unit']} | {r['mode']} | {cell(r.get('pskv'))} | {cell(r.get('gloo'))} "
                     f"| {ratio} | {rounds} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="pskv vs Gloo all-reduce on two simulated hosts (issue 11, benchmark a)")
    p.add_argument("--quick", action="store_true", help="1 round, 3 samples, short loops (about a minute)")
    p.add_argument("--rate", default=None, help="tc tbf rate of every host's link, both ways (e.g. 10gbit); default none")
    p.add_argument("--delay", default=None, help="tc netem delay on every host's outgoing traffic (e.g. 0.1ms)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, each runs pskv then Gloo (default 3, quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per workload and mode per round "
                                                             "(default 5, quick 3)")
    p.add_argument("--only", default="resnet50,64mb", help="workload ids, comma-separated (default resnet50,64mb)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take (default 300)")
    p.add_argument("--json", type=Path, default=None,
                   help="result file (default bench/results/hosts2_<UTC date>[_RATE][_quick].json)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.repeats = args.repeats or (3 if args.quick else 5)
    return args


def git_commit() -> str:
    """The checkout's commit, with ``+dirty`` if pskv/ or bench/ has uncommitted edits."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "pskv", "bench"], cwd=REPO_DIR, capture_output=True,
                           text=True).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Make the hosts, run the rounds, print the table, write the JSON."""
    args = parse_args(argv)
    install_sigterm_handler()
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    workloads = [w for w in make_workloads(args.quick) if w.id in wanted and not w.optimizer]
    if not workloads:
        print(f"no workload among {sorted(wanted)} (known: resnet50, 64mb, 4kb)", file=sys.stderr)
        return 2
    stamp = datetime.now(timezone.utc)
    suffix = (f"_{args.rate}" if args.rate else "") + ("_quick" if args.quick else "")
    json_path = args.json or BENCH_DIR / "results" / f"hosts2_{stamp:%Y%m%d}{suffix}.json"
    runs: dict[str, list[list[dict[str, Any]]]] = {"pskv": [], "gloo": []}
    sent: dict[str, list[list[int]]] = {"pskv": [], "gloo": []}
    started = time.perf_counter()
    try:
        hosts = SimulatedHosts(2, rate=args.rate, delay=args.delay)
    except Unavailable as exc:
        print(f"simulated hosts unavailable: {exc}", file=sys.stderr)
        return 2
    with hosts, tempfile.TemporaryDirectory(prefix="pskv-bench-hosts-") as tmp_name:
        tmp = Path(tmp_name)
        specs = {"pskv": spec_file(tmp / "pskv.json", workloads, args.repeats, True),
                 "gloo": spec_file(tmp / "gloo.json", workloads, args.repeats, False)}
        for rnd in range(args.rounds):
            for system, run in (("pskv", run_pskv), ("gloo", run_gloo)):
                rdir = tmp / f"r{rnd}-{system}"
                rdir.mkdir()
                before = link_sent(hosts)
                t0 = time.perf_counter()
                runs[system].append(run(hosts, specs[system], rdir, args.timeout))
                sent[system].append([a - b for a, b in zip(link_sent(hosts), before)])
                print(f"round {rnd} {system}: {time.perf_counter() - t0:.1f} s, link bytes sent per host "
                      f"{[f'{b / 1e6:.0f} MB' for b in sent[system][-1]]}", flush=True)
    rows = summarize(runs, workloads)
    print(f"\nTwo simulated hosts (rate {args.rate or 'unshaped'}, delay {args.delay or 'none'}), "
          f"{args.rounds} round(s) x {args.repeats} samples; ratio = Gloo time / pskv time (> 1: pskv faster)\n")
    print(table(rows))
    payload = {"benchmark": "bench_hosts", "date_utc": stamp.isoformat(timespec="seconds"), "commit": git_commit(),
               "argv": sys.argv[1:] if argv is None else list(argv), "quick": args.quick, "rate": args.rate,
               "delay": args.delay, "rounds": args.rounds, "repeats": args.repeats,
               "hosts": [{"address": h.address, "hostname": h.hostname} for h in hosts.hosts],
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "wall_s": time.perf_counter() - started, "rows": rows, "link_bytes_sent": sent, "runs": runs}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
