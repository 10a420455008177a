"""Benchmarks (a) and (b) of issue 11 and (c) of issue 23: pskv against Gloo all-reduce on simulated hosts.

Usage (needs root: network namespaces, see :mod:`pskv.testing.hosts`)::

    python bench/bench_hosts.py [--setup a|b|c] [--quick] [--rate RATE] [--delay DELAY] [--rounds R]
                                [--repeats N] [--only resnet50,64mb] [--workers 2,4,8] [--json PATH]

``--setup a`` (the default) is benchmark (a), below. ``--setup b`` is benchmark (b): see
:func:`main_b` — four worker hosts on rate-limited links, pskv with servers co-located
and with four dedicated server hosts, and Gloo's ring. ``--setup c`` is the scaling
curve (issue 23, ``bench/_hosts_scaling.py``): W = 2, 4, 8 worker hosts and as many
dedicated server hosts on 100 Mbit/s links, per-worker throughput of pskv and Gloo's
ring against W, with each one's bound.

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
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _hosts_scaling import C_QUICK_WORKERS, C_RATE, C_REPEATS, C_ROUNDS, C_WORKERS, main_c, parse_workers  # noqa: E402
from _procs import install_sigterm_handler  # noqa: E402
from bench_dist import CALL_LABEL, WORKERS, DistWorkload, display, make_workloads  # noqa: E402

from pskv.config import ClusterConfig  # noqa: E402
from pskv.partition import bytes_per_server  # noqa: E402
from pskv.testing.hosts import HOST_DEV, SimHost, SimulatedHosts, Unavailable  # noqa: E402
from pskv.testing.jobs import JobError as ProcError  # noqa: E402
from pskv.testing.jobs import ProcessGroup as ProcGroup  # noqa: E402
from pskv.transport.security import generate_keys, write_key_file  # noqa: E402

GLOO_PORT = 29500  # a fresh namespace: nothing else listens there
SCHEDULER_PORT = 9091
_JSON_LINE = re.compile(r"^\[worker (\d+)\] (\{.*\})\s*$", re.M)


def spec_file(path: Path, workloads: Sequence[DistWorkload], repeats: int, pskv: bool,
              workers: int = WORKERS, compression: dict[str, Any] | None = None) -> Path:
    """The workers' JSON spec (pskv runs every pskv mode of the workload, Gloo push_pull) for ``workers`` workers;
    ``compression``: pskv's workers compress their pushes (``set_gradient_compression``)."""
    works = [w.spec(i, w.pskv_modes if pskv else ("push_pull",)) for i, w in enumerate(workloads)]
    for work in works:
        work["expect"] = workers * (workers + 1) / 2  # the sum of the ranks' values 1..W (no optimizer here)
    spec: dict[str, Any] = {"repeats": repeats, "workloads": works}
    if compression and pskv:
        spec["compression"] = compression
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def write_hostfile(path: Path, hosts: Sequence[SimHost]) -> Path:
    """A hostfile of ``hosts``, one worker slot each."""
    path.write_text("".join(f"{h.address} 1  # {h.hostname}\n" for h in hosts), encoding="utf-8")
    return path


def run_pskv(hosts: SimulatedHosts, spec: Path, tmp: Path, timeout: float, workers: int = WORKERS,
             worker_hosts: Sequence[SimHost] | None = None, server_hosts: Sequence[SimHost] = (),
             env: Sequence[str] = (), script: Path = BENCH_DIR / "_dist_worker_pskv.py",
             launch_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One pskv job through ``pskv launch --launcher ssh``; the workers' JSON, by rank.

    ``worker_hosts`` (default: all) form the hostfile, one worker slot each, and run one
    server each unless ``server_hosts`` are given (``--server-hostfile``, one server each).
    ``script``: the worker program (default the distributed benchmark's; its only argument is ``spec``);
    ``launch_args``: more options of ``pskv launch`` (e.g. ``--curve-key FILE``).
    """
    on = list(worker_hosts or hosts.hosts)
    servers = len(server_hosts) if server_hosts else len(on)
    argv = [sys.executable, "-m", "pskv", "launch", "-n", str(workers), "-s", str(servers), "--launcher", "ssh",
            "-H", str(write_hostfile(tmp / "hostfile", on)), "--ssh-command", hosts.ssh_command(),
            "--port", str(SCHEDULER_PORT), "--timeout", str(timeout), "--exit-grace", "10", "--stop-grace", "2",
            "--env", "PSKV_STARTUP_TIMEOUT=60", *(f"--env={pair}" for pair in env), *launch_args]
    if server_hosts:
        argv += ["--server-hostfile", str(write_hostfile(tmp / "server-hostfile", server_hosts))]
    argv += ["--", sys.executable, str(script), str(spec)]
    res = subprocess.run(argv, cwd=REPO_DIR, capture_output=True, text=True, timeout=timeout + 30)
    out = res.stdout + res.stderr
    (tmp / "pskv.log").write_text(out, encoding="utf-8")
    found = {int(m[1]): json.loads(m[2]) for m in _JSON_LINE.finditer(res.stdout)}
    if res.returncode != 0 or sorted(found) != list(range(workers)):
        raise ProcError(f"pskv launch exited {res.returncode} with results of ranks {sorted(found)}:\n{out[-3000:]}")
    return [found[r] for r in range(workers)]


def run_gloo(hosts: SimulatedHosts, spec: Path, tmp: Path, timeout: float, workers: int = WORKERS,
             worker_hosts: Sequence[SimHost] | None = None,
             script: Path = BENCH_DIR / "_dist_worker_gloo.py") -> list[dict[str, Any]]:
    """Gloo's ranks, rank r on worker host r mod H, started through the hosts' remote shell; their JSON, by rank.

    ``script``: the rank's program (default the distributed benchmark's; its only argument is ``spec``)."""
    on = list(worker_hosts or hosts.hosts)
    enter = shlex.split(hosts.ssh_command())
    init = f"tcp://{on[0].address}:{GLOO_PORT}"
    with ProcGroup("gloo", tmp / "gloo") as group:
        procs = []
        for r in range(workers):
            remote = shlex.join(["env", f"GLOO_INIT={init}", f"GLOO_SOCKET_IFNAME={HOST_DEV}", f"RANK={r}",
                                 f"WORLD_SIZE={workers}", sys.executable, str(script), str(spec)])
            procs.append(group.start(f"worker{r}", [*enter, "-o", "BatchMode=yes", on[r % len(on)].address,
                                                    f"cd {shlex.quote(str(REPO_DIR))} && {remote}"],
                                     {k: v for k, v in os.environ.items()
                                      if k not in ("RANK", "WORLD_SIZE", "GLOO_INIT")}))
        group.wait(procs, timeout)
        return [p.json_line() for p in procs]


def link_sent(hosts: SimulatedHosts) -> list[int]:
    """Bytes each host has sent on its link so far."""
    return [hosts.link_bytes(i)["tx"] for i in range(len(hosts))]


def summarize(runs: dict[str, list[list[dict[str, Any]]]], workloads: Sequence[DistWorkload],
              system: str = "pskv") -> list[dict[str, Any]]:
    """One row per workload and pskv mode of ``runs[system]``: medians (slower worker), sample ranges, ratio to Gloo."""
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
            mine = stats(system, work.id, mode)
            row: dict[str, Any] = {"workload": work.id, "name": work.name, "mode": mode, "unit": work.unit}
            for who, st in (("pskv", mine), ("gloo", gloo)):
                if st is not None:
                    row[who] = {"median_s": st[0], "min_s": st[1], "max_s": st[2],
                                   "median": display(st[0], work),
                                   "range": sorted([display(st[1], work), display(st[2], work)])}
            row["ratio_vs_gloo"] = gloo[0] / mine[0] if gloo and mine else None
            by_round = [(stats("gloo", work.id, "push_pull", i), stats(system, work.id, mode, i))
                        for i in range(min(len(runs.get(system, [])), len(runs.get("gloo", []))))]
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
    p = argparse.ArgumentParser(description="pskv vs Gloo all-reduce on simulated hosts (issue 11, benchmarks a, b; "
                                            "issue 23, c)")
    p.add_argument("--setup", choices=("a", "b", "c"), default="a",
                   help="a: two hosts, one worker and one server each (default); b: four worker hosts on "
                        f"rate-limited links (default {B_RATE}), servers co-located vs four dedicated server hosts; "
                        f"c: the scaling curve, W worker hosts + W dedicated server hosts (default {C_RATE})")
    p.add_argument("--quick", action="store_true", help="1 round, fewer samples, short loops")
    p.add_argument("--rate", default=None, help="tc tbf rate of every host's link, both ways (e.g. 10gbit); "
                                                f"default none (a), {B_RATE} (b), {C_RATE} (c)")
    p.add_argument("--delay", default=None, help="tc netem delay on every host's outgoing traffic (e.g. 0.1ms)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, each runs every system once "
                                                            f"(default 3 (a), {B_ROUNDS} (b), {C_ROUNDS} (c); quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per workload and mode per round "
                                                             f"(default 5 (a), {B_REPEATS} (b), {C_REPEATS} (c); "
                                                             "quick 3 (a), 2 (b, c))")
    p.add_argument("--only", default=None, help="workload ids, comma-separated (default resnet50,64mb (a), "
                                                "resnet50 (b); c: one of 16mb (default), "
                                                "resnet50, 64mb)")
    p.add_argument("--workers", default=None,
                   help=f"c only: worker host counts, comma-separated (default {','.join(map(str, C_WORKERS))}; "
                        f"quick {','.join(map(str, C_QUICK_WORKERS))})")
    p.add_argument("--systems", default=",".join(B_DEFAULT_SYSTEMS),
                   help=f"b only: which systems to run, comma-separated, of {','.join(B_SYSTEMS)} (default "
                        f"{','.join(B_DEFAULT_SYSTEMS)}; secure: the dedicated placement with a cluster key, "
                        "pskv launch --curve-key: CURVE and sealed data connections)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every pskv process (pskv launch --env; repeatable), "
                        "e.g. PSKV_PART_BYTES=262144")
    p.add_argument("--timeout", type=float, default=None, help="seconds one job may take (default 300 (a), 600 (b))")
    p.add_argument("--compression", default=None, metavar="TYPE[:THRESHOLD][:both]",
                   help="a only: pskv's workers compress their pushes (set_gradient_compression), e.g. 2bit:0.5; "
                        ":both also the servers' answers (both_ways)")
    p.add_argument("--json", type=Path, default=None,
                   help="result file (default bench/results/hosts2_<UTC date>[_RATE][_quick].json (a), "
                        "hosts8b_<UTC date>_<RATE>[_quick].json (b), hosts_scaling_<UTC date>_<RATE>[_quick].json (c))")
    args = p.parse_args(argv)
    b, c = args.setup == "b", args.setup == "c"
    args.rounds = args.rounds or (1 if args.quick else B_ROUNDS if b else C_ROUNDS if c else 3)
    args.repeats = args.repeats or ((2 if b or c else 3) if args.quick else B_REPEATS if b else C_REPEATS if c else 5)
    args.only = args.only or ("resnet50" if b else "16mb" if c else "resnet50,64mb")
    args.timeout = args.timeout or (600.0 if b or c else 300.0)
    if args.workers is not None and not c:
        p.error("--workers applies to --setup c")
    try:
        args.workers = parse_workers(args.workers or ",".join(map(str, C_QUICK_WORKERS if args.quick else C_WORKERS)))
    except ValueError as exc:
        p.error(f"--workers: {exc}")
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    if args.compression:
        kind, *rest = args.compression.split(":")
        args.compression = {"type": kind}
        for item in rest:
            if item == "both":
                args.compression["both_ways"] = True
            elif item:
                args.compression["threshold"] = float(item)
        if b or c:
            p.error("--compression applies to --setup a")
    if not args.systems or not set(args.systems) <= set(B_SYSTEMS):
        p.error(f"--systems: expected some of {', '.join(B_SYSTEMS)}, got {args.systems}")
    if b or c:
        args.rate = args.rate or (B_RATE if b else C_RATE)
    return args


def congestion_control() -> str:
    """The kernel's default TCP congestion control, which the simulated hosts and Gloo use (pskv's data
    connections leave BBR for a loss-based one: :mod:`pskv.transport.stream`)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text(encoding="utf-8").strip()
    except OSError:
        return "unknown"


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
    if args.setup == "c":
        return main_c(args, sys.argv[1:] if argv is None else list(argv))
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    workloads = [w for w in make_workloads(args.quick) if w.id in wanted and not w.optimizer]
    if not workloads:
        print(f"no workload among {sorted(wanted)} (known: resnet50, 64mb, 4kb)", file=sys.stderr)
        return 2
    if args.setup == "b":
        return main_b(args, workloads, sys.argv[1:] if argv is None else list(argv))
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
        specs = {"pskv": spec_file(tmp / "pskv.json", workloads, args.repeats, True, compression=args.compression),
                 "gloo": spec_file(tmp / "gloo.json", workloads, args.repeats, False)}
        for rnd in range(args.rounds):
            for system, run in (("pskv", run_pskv), ("gloo", run_gloo)):
                rdir = tmp / f"r{rnd}-{system}"
                rdir.mkdir()
                before = link_sent(hosts)
                t0 = time.perf_counter()
                runs[system].append(run_pskv(hosts, specs[system], rdir, args.timeout, env=args.env)
                                    if system == "pskv" else run(hosts, specs[system], rdir, args.timeout))
                sent[system].append([a - b for a, b in zip(link_sent(hosts), before)])
                print(f"round {rnd} {system}: {time.perf_counter() - t0:.1f} s, link bytes sent per host "
                      f"{[f'{b / 1e6:.0f} MB' for b in sent[system][-1]]}", flush=True)
    rows = summarize(runs, workloads)
    print(f"\nTwo simulated hosts (rate {args.rate or 'unshaped'}, delay {args.delay or 'none'}), "
          f"{args.rounds} round(s) x {args.repeats} samples; ratio = Gloo time / pskv time (> 1: pskv faster)\n")
    print(table(rows))
    payload = {"benchmark": "bench_hosts", "date_utc": stamp.isoformat(timespec="seconds"), "commit": git_commit(),
               "argv": sys.argv[1:] if argv is None else list(argv), "quick": args.quick, "rate": args.rate,
               "pskv_env": args.env, "compression": args.compression, "delay": args.delay, "rounds": args.rounds, "repeats": args.repeats,
               "hosts": [{"address": h.address, "hostname": h.hostname} for h in hosts.hosts],
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "tcp_congestion_control": congestion_control()},
               "wall_s": time.perf_counter() - started, "rows": rows, "link_bytes_sent": sent, "runs": runs}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path}")
    return 0


# -- benchmark (b): four worker hosts, servers co-located vs dedicated, vs Gloo's ring --------------------------
B_WORKERS = 4
B_RATE = "300mbit"
B_ROUNDS = 2
B_REPEATS = 3
B_SYSTEMS = ("dedicated", "colocated", "gloo", "secure")  # secure: dedicated, with --curve-key (sealed data)
B_DEFAULT_SYSTEMS = ("dedicated", "colocated", "gloo")
B_TARGET = 1.35  # issue 23's bar: dedicated servers, each pskv call, against Gloo's ring
B_LABEL = {"dedicated": "pskv, 4 dedicated server hosts", "colocated": "pskv, servers co-located (1 per worker host)",
           "gloo": "Gloo all-reduce (ring)"}
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


def rate_bits(rate: str) -> float | None:
    """A tc rate (``300mbit``, ``1gbit``, ``50mbps``; SI multiples as tc takes them) in bits per second, or None."""
    m = re.fullmatch(r"([0-9.]+)([a-z]*)", rate.strip().lower())
    if not m or m[2] not in _RATE_UNITS:
        return None
    return float(m[1]) * _RATE_UNITS[m[2]]


def model_traffic(system: str, workers: int) -> float:
    """Bytes each worker host's link carries each way per iteration, in units of one model value.

    A parameter server on dedicated hosts: the worker's push out, the pull back in (1x).
    Ring all-reduce: reduce-scatter and all-gather, (n-1)/n each (2(n-1)/n). Servers
    co-located one per worker host: (n-1)/n of a push out plus (n-1)/n of the local
    server's replies to the others, the same 2(n-1)/n.
    """
    return 1.0 if system in ("dedicated", "secure") else 2 * (workers - 1) / workers


def link_counters(hosts: SimulatedHosts) -> list[dict[str, int]]:
    """Bytes each host has sent and received on its link so far."""
    return [hosts.link_bytes(i) for i in range(len(hosts))]


class LinkTrace:
    """Every host link's byte counters, sampled at the bridge every ``interval`` s by a thread, during a job.

    A bridge port's received bytes are its host's sent bytes and the other way round; one
    ``ip -s -j link show`` in the bridge's namespace reads all of them at once.
    """

    def __init__(self, hosts: SimulatedHosts, interval: float = 0.2) -> None:
        self.hosts, self.interval = hosts, interval
        self.samples: list[tuple[float, list[tuple[int, int]]]] = []  # (perf_counter, [(host tx, host rx)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-trace", daemon=True)

    def _read(self) -> list[tuple[int, int]]:
        out = subprocess.run(["ip", "-n", self.hosts.bridge_ns, "-s", "-j", "link", "show"], capture_output=True,
                             text=True, timeout=5, check=True).stdout
        ports = {d["ifname"]: d["stats64"] for d in json.loads(out)}
        return [(int(ports[h.link]["rx"]["bytes"]), int(ports[h.link]["tx"]["bytes"])) for h in self.hosts.hosts]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.samples.append((time.perf_counter(), self._read()))
            except (OSError, subprocess.SubprocessError, KeyError, ValueError):
                pass  # a missed sample only widens one interval

    def __enter__(self) -> LinkTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self, host: int, window: Sequence[float], bytes_per_s: float | None) -> dict[str, Any]:
        """Host ``host``'s send / receive rates over ``window`` (perf_counter seconds) as fractions of the rate.

        ``both_busy``: the share of the window's time in which the link carried more than
        half the rate in both directions at once; ``one_way``: in exactly one direction.
        """
        inside = [(t, c[host]) for t, c in self.samples if window and window[0] <= t <= window[1]]
        if len(inside) < 3 or not bytes_per_s:
            return {"intervals": max(0, len(inside) - 1)}
        both = one = 0.0
        for (t0, (tx0, rx0)), (t1, (tx1, rx1)) in zip(inside, inside[1:]):
            busy = [(tx1 - tx0) / (t1 - t0) > bytes_per_s / 2, (rx1 - rx0) / (t1 - t0) > bytes_per_s / 2]
            both += (t1 - t0) * all(busy)
            one += (t1 - t0) * (sum(busy) == 1)
        span = inside[-1][0] - inside[0][0]
        return {"intervals": len(inside) - 1, "span_s": span,
                "tx_fraction": (inside[-1][1][0] - inside[0][1][0]) / span / bytes_per_s,
                "rx_fraction": (inside[-1][1][1] - inside[0][1][1]) / span / bytes_per_s,
                "both_busy": both / span, "one_way": one / span}


def iterations_per_job(workloads: Sequence[DistWorkload], repeats: int, pskv: bool) -> int:
    """Iterations one worker runs in a job: per workload and mode, the checked one, the warm-up and the samples."""
    return sum(len(w.pskv_modes if pskv else ("push_pull",)) * (1 + max(1, w.warmup) + repeats * w.iters)
               for w in workloads)


def summarize_b(runs: dict[str, list[list[dict[str, Any]]]], workloads: Sequence[DistWorkload],
                moved: dict[str, list[list[dict[str, int]]]], bits: float | None,
                repeats: int) -> list[dict[str, Any]]:
    """Rows per pskv placement and mode (as :func:`summarize`), with the fraction of the link rate and link bytes."""
    rows = []
    for system in (x for x in ("dedicated", "colocated", "secure") if runs.get(x)):
        for row in summarize(runs, workloads, system):
            work = next(w for w in workloads if w.id == row["workload"])
            row["placement"] = system
            for who in (system, "gloo"):
                key = "pskv" if who == system else "gloo"
                factor = model_traffic(who, B_WORKERS)
                ideal = factor * work.value_bytes * 8 / bits if bits else None
                if key in row and ideal is not None:
                    row[key]["model_traffic_each_way"] = factor
                    row[key]["link_bound_s"] = ideal
                    row[key]["link_fraction"] = ideal / row[key]["median_s"]
            rows.append(row)
    plain = {(r["workload"], r["mode"]): r["pskv"]["median_s"] for r in rows if r["placement"] == "dedicated" and "pskv" in r}
    for row in rows:  # issue 23's --secure bar: the keyed job's time over the plain one's (<= 1.3x)
        if row["placement"] == "secure" and "pskv" in row and (row["workload"], row["mode"]) in plain:
            row["time_vs_plain"] = row["pskv"]["median_s"] / plain[(row["workload"], row["mode"])]
    for row in rows:  # measured link bytes per worker host and iteration, each way (whole jobs: incl. init, checks)
        for who, key in ((row["placement"], "pskv"), ("gloo", "gloo")):
            iters = iterations_per_job(workloads, repeats, who != "gloo")
            per_job = moved.get(who, [])
            if key in row and per_job:
                tx = [h["tx"] for job in per_job for h in job[:B_WORKERS]]
                rx = [h["rx"] for job in per_job for h in job[:B_WORKERS]]
                row[key]["worker_link_bytes_per_iter"] = {"tx": statistics.mean(tx) / iters,
                                                          "rx": statistics.mean(rx) / iters}
    return rows


def server_evenness(workloads: Sequence[DistWorkload], env: Sequence[str], servers: int,
                    dedicated: Sequence[Sequence[dict[str, int]]], iters: int) -> dict[str, Any]:
    """How evenly the servers carry a step (issue 23: each within 5 % of the mean).

    ``bytes_held``: per workload, the bytes each server holds (and sends each worker per
    step) by pskv's placement with the job's settings (``--env`` over the defaults), keys
    numbered as the benchmark's workers number them; ``sent_per_iter``: the bytes each
    dedicated server host sent over its link per iteration (whole jobs: init and checks
    included), in host order; ``*_spread``: the largest distance from the mean, as a fraction.
    """
    settings = ClusterConfig.from_env(dict(pair.split("=", 1) for pair in env if "=" in pair))

    def spread(xs: Sequence[float]) -> float:
        return max(abs(x - statistics.mean(xs)) for x in xs) / statistics.mean(xs) if xs and sum(xs) else 0.0

    held = {w.id: bytes_per_server(((1000 * i + k, math.prod(shape), 4) for k, shape in enumerate(w.shapes)),
                                   servers, settings.bigarray_bound, settings.part_size)
            for i, w in enumerate(workloads)}
    sent = [statistics.mean(job[B_WORKERS + s]["tx"] for job in dedicated) / iters
            for s in range(servers)] if dedicated else []
    return {"servers": servers, "bigarray_bound": settings.bigarray_bound, "part_bytes": settings.part_size,
            "bytes_held": held, "held_spread": {k: spread(v) for k, v in held.items()},
            "sent_per_iter": sent, "sent_spread": spread(sent)}


def table_b(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of benchmark (b)."""
    def cell(d: dict[str, Any] | None) -> str:
        if not d:
            return "—"
        lo, hi = d["range"]
        return f"{d['median']:.3g} ({lo:.3g}–{hi:.3g})"

    def pct(d: dict[str, Any] | None) -> str:
        return f"{100 * d['link_fraction']:.0f} %" if d and "link_fraction" in d else "—"

    lines = ["| placement | pskv call | pskv it/s median (range) | Gloo it/s median (range) | pskv / Gloo | by round "
             "| pskv: % of link rate | Gloo: % of link rate |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio_vs_gloo']:.2f}x" if r["ratio_vs_gloo"] else "—"
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_by_round"]) or "—"
        lines.append(f"| {r['placement']} | {CALL_LABEL.get(('pskv', r['mode']), r['mode'])} | {cell(r.get('pskv'))} "
                     f"| {cell(r.get('gloo'))} | {ratio} | {rounds} | {pct(r.get('pskv'))} | {pct(r.get('gloo'))} |")
    return "\n".join(lines)


def main_b(args: argparse.Namespace, workloads: Sequence[DistWorkload], argv: list[str]) -> int:
    """Benchmark (b): 8 hosts (0-3 workers, 4-7 servers); per round pskv dedicated, pskv co-located, Gloo.

    The order of the three systems alternates between rounds (forward, then backward), so
    a drift of the shared machine does not favour one of them.
    """
    stamp = datetime.now(timezone.utc)
    json_path = args.json or BENCH_DIR / "results" / f"hosts8b_{stamp:%Y%m%d}_{args.rate}" \
                                                     f"{'_quick' if args.quick else ''}.json"
    bits = rate_bits(args.rate)
    runs: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in B_SYSTEMS}
    moved: dict[str, list[list[dict[str, int]]]] = {s: [] for s in B_SYSTEMS}
    walls: dict[str, list[float]] = {s: [] for s in B_SYSTEMS}
    traces: dict[str, list[dict[str, Any]]] = {s: [] for s in B_SYSTEMS}
    load = [os.getloadavg()]
    started = time.perf_counter()
    try:
        hosts = SimulatedHosts(2 * B_WORKERS, rate=args.rate, delay=args.delay)
    except Unavailable as exc:
        print(f"simulated hosts unavailable: {exc}", file=sys.stderr)
        return 2
    worker_hosts, server_hosts = hosts.hosts[:B_WORKERS], hosts.hosts[B_WORKERS:]
    with hosts, tempfile.TemporaryDirectory(prefix="pskv-bench-hosts-b-") as tmp_name:
        tmp = Path(tmp_name)
        pskv_spec = spec_file(tmp / "pskv.json", workloads, args.repeats, True, B_WORKERS)
        gloo_spec = spec_file(tmp / "gloo.json", workloads, args.repeats, False, B_WORKERS)
        key_file = write_key_file(tmp / "cluster.key", generate_keys())  # mode 600; one key for the secure runs
        jobs = {"dedicated": lambda d: run_pskv(hosts, pskv_spec, d, args.timeout, B_WORKERS, worker_hosts,
                                                server_hosts, args.env),
                "colocated": lambda d: run_pskv(hosts, pskv_spec, d, args.timeout, B_WORKERS, worker_hosts,
                                                env=args.env),
                "gloo": lambda d: run_gloo(hosts, gloo_spec, d, args.timeout, B_WORKERS, worker_hosts),
                "secure": lambda d: run_pskv(hosts, pskv_spec, d, args.timeout, B_WORKERS, worker_hosts,
                                             server_hosts, args.env, launch_args=["--curve-key", str(key_file)])}
        for rnd in range(args.rounds):
            chosen = [x for x in B_SYSTEMS if x in args.systems]
            for system in chosen if rnd % 2 == 0 else reversed(chosen):
                rdir = tmp / f"r{rnd}-{system}"
                rdir.mkdir()
                before = link_counters(hosts)
                t0 = time.perf_counter()
                with LinkTrace(hosts) as trace:
                    runs[system].append(jobs[system](rdir))
                walls[system].append(time.perf_counter() - t0)
                # worker host 1 (rank 0 on host 0 also sends the init values) and, dedicated, server host 5
                window = runs[system][-1][1]["results"][workloads[0].id].get("window_monotonic_s") or []
                traces[system].append({f"host{i}": trace.summary(i, window, bits / 8 if bits else None)
                                       for i in (1, B_WORKERS + 1)})
                moved[system].append([{k: a[k] - b[k] for k in ("tx", "rx")}
                                      for a, b in zip(link_counters(hosts), before)])
                print(f"round {rnd} {system}: {walls[system][-1]:.1f} s, link MB sent per host "
                      f"{[round(h['tx'] / 1e6) for h in moved[system][-1]]}", flush=True)
                load.append(os.getloadavg())
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"setup": "b", "partial": True, "argv": argv, "link_bytes": moved, "runs": runs}),
                         encoding="utf-8")  # the raw samples are kept even if the summary fails
    rows = summarize_b(runs, workloads, moved, bits, args.repeats)
    target = {r["mode"]: r["ratio_vs_gloo"] for r in rows if r["placement"] == "dedicated" and r["workload"] == "resnet50"}
    verdict = ("not measured" if not target or None in target.values()
               else "PASS" if all(x >= B_TARGET for x in target.values()) else "MISS")
    print(f"\nFour worker hosts, links {args.rate} both ways (delay {args.delay or 'none'}, TCP congestion control "
          f"{congestion_control()}), {args.rounds} round(s) x "
          f"{args.repeats} samples; ratio = Gloo time / pskv time (> 1: pskv faster); % of link rate = the time the "
          f"link rate alone allows (dedicated {model_traffic('dedicated', B_WORKERS):g}x the model each way per "
          f"worker link, ring and co-located {model_traffic('gloo', B_WORKERS):g}x) / the median\n")
    print(table_b(rows))
    secure = [r for r in rows if "time_vs_plain" in r]
    if secure:
        print("\nsecure (--curve-key) time / plain (dedicated) time, bar <= 1.3x: " + ", ".join(
            f"{r['workload']} {r['mode']} {r['time_vs_plain']:.2f}x" for r in secure))
    for system in (x for x in B_SYSTEMS if moved[x]):
        iters = iterations_per_job(workloads, args.repeats, system != "gloo")
        per_host = [statistics.mean(job[i]["tx"] for job in moved[system]) / iters / 1e6 for i in range(len(hosts))]
        print(f"{system}: MB sent per iteration by host (jobs' totals / {iters} iterations): "
              f"{[round(x) for x in per_host]}")
    evenness = server_evenness(workloads, args.env, B_WORKERS, moved["dedicated"],
                               iterations_per_job(workloads, args.repeats, True))
    for wid, held in evenness["bytes_held"].items():
        print(f"{wid}: MB each of {B_WORKERS} servers holds (pskv's placement): {[round(h / 1e6, 1) for h in held]}, "
              f"{100 * evenness['held_spread'][wid]:.1f} % from the mean at most")
    if evenness["sent_per_iter"]:
        print(f"dedicated: MB each server host sent per iteration: {[round(x / 1e6) for x in evenness['sent_per_iter']]}"
              f", {100 * evenness['sent_spread']:.1f} % from the mean at most")
    for system in (x for x in B_SYSTEMS if traces[x]):
        for t in traces[system]:
            h = t["host1"]
            if "both_busy" in h:
                print(f"{system}: worker host 1 in the timed window: sends at {100 * h['tx_fraction']:.0f} %, "
                      f"receives at {100 * h['rx_fraction']:.0f} % of the rate; both ways > half the rate "
                      f"{100 * h['both_busy']:.0f} % of the time, one way only {100 * h['one_way']:.0f} %")
    print(f"\ntarget: ResNet-50 list, dedicated servers >= {B_TARGET}x Gloo: {verdict} "
          f"({', '.join(f'{m} {x:.2f}x' for m, x in target.items() if x)})")
    payload = {"benchmark": "bench_hosts", "setup": "b", "date_utc": stamp.isoformat(timespec="seconds"),
               "commit": git_commit(), "argv": argv, "quick": args.quick, "rate": args.rate,
               "uncommitted_in_pskv": subprocess.run(["git", "status", "--porcelain", "pskv"], cwd=REPO_DIR,
                                                     capture_output=True, text=True).stdout.splitlines(),
               "pskv_env": args.env, "rate_bits_per_s": bits, "delay": args.delay, "rounds": args.rounds, "repeats": args.repeats,
               "workers": B_WORKERS,
               "hosts": [{"address": h.address, "hostname": h.hostname,
                          "role": "worker" if h.index < B_WORKERS else "server (dedicated runs)"} for h in hosts.hosts],
               "model_traffic_each_way_per_worker": {s: model_traffic(s, B_WORKERS) for s in B_SYSTEMS},
               "iterations_per_job": {s: iterations_per_job(workloads, args.repeats, s != "gloo") for s in B_SYSTEMS},
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "loadavg_1_5_15_per_job": load,
                           "tcp_congestion_control": congestion_control()},
               "wall_s": time.perf_counter() - started, "job_wall_s": walls,
               "target": {"what": f"ResNet-50 list, dedicated server hosts, >= {B_TARGET}x Gloo (each pskv call)",
                          "ratios": target, "verdict": verdict},
               "rows": rows, "link_bytes": moved, "link_trace": traces, "server_evenness": evenness, "runs": runs}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
