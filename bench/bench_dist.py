"""Benchmark pskv's ``dist_sync`` store against MXNet 1.9.1's and against Gloo all-reduce: W=2 workers, loopback.

Usage::

    python bench/bench_dist.py [--quick] [--json PATH] [--no-mxnet] [--no-gloo] [--no-sockets-variant]
                               [--rounds R] [--repeats N] [--servers 1,2] [--only IDS]
                               [--mxnet-venv PATH] [--pskv-commit REV] [--thread-cpu | --profile DIR]

Every cluster is a set of real processes on 127.0.0.1, started by this program:

* **pskv**: ``python -m pskv scheduler --port-file F`` (a free port, published through
  F), ``S`` x ``python -m pskv server``, and 2 x ``_dist_worker_pskv.py``. All on one
  host, so pskv's shared-memory data path is used (its default, ``PSKV_SHM=1``);
* **pskv, sockets only**: the same with ``PSKV_SHM=0`` — array data through ZeroMQ/TCP
  as between hosts, which is what MXNet and Gloo do here too (push+pull only; skip with
  ``--no-sockets-variant``);
* **pskv, sockets only, keyed** (``--secure``): the same with a CURVE cluster key
  (``PSKV_CURVE_KEY_FILE``, a fresh key per run): the data connections sealed
  (:mod:`pskv.transport.sealed`); the report gives its time over the plain sockets-only
  time per workload (the issue's bar: <= 1.3x);
* **MXNet 1.9.1** (its venv): scheduler, ``S`` servers and 2 workers, all
  ``_dist_worker_mxnet.py`` with ``DMLC_ROLE`` set (``import mxnet`` runs the
  scheduler / server role);
* **Gloo** (``torch.distributed``, no servers): 2 x ``_dist_worker_gloo.py``.

pskv and MXNet run with ``S = 1`` and ``S = 2`` servers, each a separate cluster; Gloo has
one column. Workloads (float32; worker rank ``r`` pushes arrays filled with ``r + 1``):

1. ResNet-50's 161 parameter arrays (25.5M elements) as one key list: push + pull, it/s
   (pskv also ``pushpull``; Gloo: DDP-style bucketed ``all_reduce``);
2. one 64 MB key: push + pull, GB/s (= bytes of ONE value / iteration time);
3. one 4 KB key: push + pull, ms per iteration (pskv also a blocking push + pull, and
   ``pushpull``);
4. the ResNet-50 list with SGD (momentum 0.9) run by the servers (``set_optimizer``):
   push + pull, it/s (Gloo: all_reduce + a local ``torch.optim.SGD`` step).

pskv's push + pull is ``push(block=False)`` then ``pull()``: MXNet's ``push`` is
asynchronous, so that is the same program (see ``_dist_worker_pskv.py``).

Workers meet at a barrier before every timed sample; per worker the median over all its
samples is taken and the slower worker's median is reported. Every result is checked
once per system (the pulled values equal the expected sum, or the expected weights after
one SGD step). The run is split into ``--rounds`` rounds, each of which starts every
cluster once (pskv, pskv sockets only, MXNet with S=1, Gloo, then the S=2 clusters), so
drifts of a shared machine hit all systems. ``--thread-cpu`` adds, per cluster and
workload, every process's CPU time per iteration by thread (main, ZeroMQ I/O, busiest
other thread, rest) from ``/proc``; ``--profile DIR`` records the pskv processes with
py-spy. Prints a table with medians, ratios (> 1: pskv faster) and
PASS/MISS per target — a miss never fails the run — and writes raw samples, environment
and git commit to ``--json`` (default ``bench/results/dist.json``).

By default the pskv of this checkout is measured, uncommitted edits included (the JSON
says whether ``pskv/`` had any). ``--pskv-commit REV`` measures ``pskv/`` exactly as
committed in ``REV`` instead (``git archive`` into a temporary directory; the checkout
is not touched).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _procs import ThreadCpuSampler, install_sigterm_handler  # noqa: E402
from bench_local import (  # noqa: E402
    GB,
    GBPS_DEFINITION,
    _fmt,
    _load_average,
    _size,
    _spread,
    _version,
    _x,
    check_resnet_shapes,
    environment,
    missing_venv_message,
    mxnet_python,
    resnet50_shapes,
    stats,
    stderr_logger,
    write_json,
)

from pskv.testing.jobs import JobError as ProcError  # noqa: E402
from pskv.testing.jobs import ProcessGroup as ProcGroup  # noqa: E402
from pskv.testing.jobs import free_port  # noqa: E402
from pskv.transport.security import generate_keys, write_key_file  # noqa: E402

DEFAULT_JSON = BENCH_DIR / "results" / "dist.json"
WORKERS = 2
DTYPE = np.float32
SGD = {"learning_rate": 0.1, "momentum": 0.9}
ITERATION_DEFINITION = ("one iteration = every worker pushes its value(s) and pulls the sum over workers into "
                        "out(s), complete (MXNet: after mx.nd.waitall())")
SYSTEMS = ("pskv", "pskv_tcp", "pskv_secure", "mxnet", "gloo")
SECURE_BAR = 1.3  # the keyed sockets-only time over the plain one, at most (issue 23)
CALL_LABEL = {("pskv", "push_pull"): "push(block=False)+pull", ("pskv", "push_pull_blocking"): "push+pull, blocking push",
              ("pskv", "pushpull"): "pushpull",
              ("pskv_tcp", "push_pull"): "push(block=False)+pull, sockets only (PSKV_SHM=0)",
              ("pskv_secure", "push_pull"): "push(block=False)+pull, sockets only, CURVE key (--secure)"}

Shape = tuple[int, ...]


# -- workloads ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistWorkload:
    """What one iteration moves, and how it is reported.

    Attributes:
        id: short name for ``--only`` and the JSON.
        name: label in the table.
        shapes: one shape per key.
        as_list: one key-list call (else one key, not in a list).
        unit: ``it/s``, ``GB/s`` or ``ms`` (what the table shows).
        iters: iterations per timed sample.
        warmup: iterations per mode before the first sample (after the checked one).
        pskv_modes: pskv's modes; MXNet and Gloo run ``push_pull`` only.
        optimizer: SGD hyperparameters run by the servers, or None.
    """

    id: str
    name: str
    shapes: tuple[Shape, ...]
    as_list: bool
    unit: str
    iters: int
    warmup: int
    pskv_modes: tuple[str, ...] = ("push_pull", "pushpull")
    optimizer: dict[str, float] | None = None

    @property
    def elements(self) -> int:
        """Elements of one value of all keys together."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def value_bytes(self) -> int:
        """Bytes of ONE value of the key(s)."""
        return self.elements * np.dtype(DTYPE).itemsize

    @property
    def init(self) -> float:
        """The initial value of every element (weights 1.0 for the optimizer, else 0)."""
        return 1.0 if self.optimizer else 0.0

    @property
    def expect(self) -> float:
        """The pulled value after ONE iteration: the sum ``1 + ... + W``, or the weights after one SGD step."""
        total = WORKERS * (WORKERS + 1) / 2
        if self.optimizer:
            return self.init - self.optimizer["learning_rate"] * total  # momentum buffer starts at 0
        return total

    def spec(self, index: int, modes: Sequence[str]) -> dict[str, Any]:
        """The JSON given to the worker scripts."""
        return {"name": self.id, "shapes": [list(s) for s in self.shapes], "as_list": self.as_list,
                "iters": self.iters, "warmup": self.warmup, "modes": list(modes), "init": self.init,
                "expect": self.expect, "key_base": 1000 * index, "optimizer": self.optimizer}


def make_workloads(quick: bool) -> list[DistWorkload]:
    """The four workloads (the optimizer one last: set_optimizer applies to every key after it)."""
    resnet = tuple(resnet50_shapes())
    if quick:
        big, latency = (1, 1), (50, 20)
    else:
        big, latency = (2, 1), (200, 100)
    return [
        DistWorkload("resnet50", "ResNet-50 (161 keys)", resnet, True, "it/s", *big),
        DistWorkload("64mb", "64 MB key", ((16 << 20,),), False, "GB/s", *big),
        DistWorkload("4kb", "4 KB key", ((1024,),), False, "ms", *latency,
                     pskv_modes=("push_pull", "push_pull_blocking", "pushpull")),
        DistWorkload("resnet50_sgd", "ResNet-50 + SGD(momentum) on servers", resnet, True, "it/s", *big,
                     pskv_modes=("push_pull",), optimizer=dict(SGD)),
    ]


# -- clusters -------------------------------------------------------------------------------
@dataclass
class ClusterRun:
    """The outcome of one cluster: per worker rank its JSON, or the error."""

    system: str
    servers: int
    round: int
    workers: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    thread_cpu: dict[str, Any] = field(default_factory=dict)  # workload id -> per process CPU per iteration


class Launcher:
    """Starts the clusters of each system and collects their workers' JSON lines."""

    def __init__(self, args: argparse.Namespace, workloads: list[DistWorkload], tmp: Path,
                 log: Callable[[str], None], pskv_src: Path) -> None:
        self.args = args
        self.pskv_src = pskv_src  # the directory holding the pskv package that is measured
        self.workloads = workloads
        self.tmp = tmp
        self.log = log
        self.mxnet_python = None if args.no_mxnet else mxnet_python(args.mxnet_venv)
        self.py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))

    def _spec_file(self, system: str, label: str) -> Path:
        per_system = None if system == "pskv" else ("push_pull",)
        spec = {"repeats": self.args.repeats,
                "workloads": [w.spec(i, w.pskv_modes if per_system is None else per_system)
                              for i, w in enumerate(self.workloads)]}
        path = self.tmp / label / "spec.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec), encoding="utf-8")
        return path

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        env.pop("PSKV_BENCH_LINGER_S", None)
        if self.args.thread_cpu:
            env["PSKV_BENCH_LINGER_S"] = "0.15"  # see ThreadCpuSampler
        return env

    def _cluster_env(self, servers: int, port: int) -> dict[str, str]:
        return {**self._base_env(), "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(WORKERS), "DMLC_NODE_HOST": "127.0.0.1"}

    def _profiled(self, argv: list[str], label: str, name: str) -> list[str]:
        if self.args.profile is None or self.py_spy is None:
            return argv
        out = self.args.profile / f"{label}-{name}.txt"
        return [self.py_spy, "record", "--format", "raw", "--rate", "200", "--threads", "--nonblocking",
                "--output", str(out), "--", *argv]

    def run(self, system: str, servers: int, rnd: int) -> ClusterRun:
        """Start one cluster, wait for its workers, reap everything; never raises for a failed cluster."""
        label = f"r{rnd}-{system}-s{servers}" if system != "gloo" else f"r{rnd}-gloo"
        result = ClusterRun(system, servers, rnd)
        spec = self._spec_file(system, label)
        start = time.perf_counter()
        try:
            with ProcGroup(label, self.tmp / label) as group:
                workers = getattr(self, f"_start_{system}")(group, servers, spec, label)
                sampler = None
                if self.args.thread_cpu:
                    sampler = ThreadCpuSampler({p.name: p.popen.pid for p in group.procs}).start()
                try:
                    group.wait(workers, self.args.cluster_timeout)
                finally:
                    if sampler is not None:
                        sampler.stop()
                group.wait(group.procs, 60)  # servers and scheduler end when every worker has left
                result.workers = sorted((p.json_line() for p in workers), key=lambda j: int(j["rank"]))
                if sampler is not None:
                    result.thread_cpu = thread_cpu_per_iteration(sampler, result.workers)
        except (ProcError, OSError, ValueError, KeyError) as exc:
            result.error = str(exc)
        result.wall_s = time.perf_counter() - start
        return result

    def _start_pskv_tcp(self, group: ProcGroup, servers: int, spec: Path, label: str) -> list[Any]:
        return self._start_pskv(group, servers, spec, label, {"PSKV_SHM": "0"})

    def _start_pskv_secure(self, group: ProcGroup, servers: int, spec: Path, label: str) -> list[Any]:
        key = self.tmp / "cluster.key"
        if not key.exists():
            write_key_file(key, generate_keys())
        return self._start_pskv(group, servers, spec, label, {"PSKV_SHM": "0", "PSKV_CURVE_KEY_FILE": str(key)})

    def _start_pskv(self, group: ProcGroup, servers: int, spec: Path, label: str,
                    extra_env: dict[str, str] | None = None) -> list[Any]:
        py, src = sys.executable, self.pskv_src
        env = {**self._cluster_env(servers, 0), **(extra_env or {})}
        # ``python -m pskv`` finds the measured pskv first: it is the working directory and first on PYTHONPATH
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["PSKV_BENCH_SRC"] = str(src)
        assert group.logdir is not None  # ProcessGroup(label, logdir) in run()
        port_file = group.logdir / "scheduler.port"
        group.start("scheduler", [py, "-m", "pskv", "scheduler", "--port-file", str(port_file)],
                    {**env, "DMLC_ROLE": "scheduler"}, cwd=src)
        port = group.wait_for_file(port_file, 60)
        env["DMLC_PS_ROOT_PORT"] = port
        for s in range(servers):
            group.start(f"server{s}", self._profiled([py, "-m", "pskv", "server"], label, f"server{s}"),
                        {**env, "DMLC_ROLE": "server"}, cwd=src)
        script = str(BENCH_DIR / "_dist_worker_pskv.py")
        return [group.start(f"worker{r}", self._profiled([py, script, str(spec)], label, f"worker{r}"),
                            {**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(r)}, cwd=src)
                for r in range(WORKERS)]

    def _start_mxnet(self, group: ProcGroup, servers: int, spec: Path, label: str) -> list[Any]:
        assert self.mxnet_python is not None
        py, script = str(self.mxnet_python), str(BENCH_DIR / "_dist_worker_mxnet.py")
        env = self._cluster_env(servers, free_port())
        group.start("scheduler", [py, script, str(spec)], {**env, "DMLC_ROLE": "scheduler"}, cwd=REPO_DIR)
        for s in range(servers):
            group.start(f"server{s}", [py, script, str(spec)], {**env, "DMLC_ROLE": "server"}, cwd=REPO_DIR)
        return [group.start(f"worker{r}", [py, script, str(spec)], {**env, "DMLC_ROLE": "worker"}, cwd=REPO_DIR)
                for r in range(WORKERS)]

    def _start_gloo(self, group: ProcGroup, servers: int, spec: Path, label: str) -> list[Any]:
        env = {**self._base_env(), "GLOO_INIT": f"tcp://127.0.0.1:{free_port()}", "WORLD_SIZE": str(WORKERS)}
        script = str(BENCH_DIR / "_dist_worker_gloo.py")
        return [group.start(f"worker{r}", [sys.executable, script, str(spec)], {**env, "RANK": str(r)}, cwd=REPO_DIR)
                for r in range(WORKERS)]


def thread_cpu_per_iteration(sampler: ThreadCpuSampler, workers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per workload: CPU ms per iteration of each process's threads over the workers' timed window.

    Threads are grouped per process: ``main`` (the main thread), ``zmq_io`` (ZeroMQ's
    ``ZMQbg/IO/*`` threads: socket I/O, mostly kernel copies), ``busiest_thread`` (the
    busiest other thread: the pskv reactor on a server) and ``other_threads`` (the rest:
    kernels, engine, MXNet/OpenMP/Gloo threads). Values are ``[user, system]`` ms per
    iteration; the window's CPU is scaled to its exact length (snapshots are 0.1 s apart).
    """
    out: dict[str, Any] = {}
    for wid in workers[0]["results"]:
        windows = [w["results"][wid].get("window_monotonic_s") or [] for w in workers]
        if not all(len(win) == 2 for win in windows):
            continue
        start, end = min(win[0] for win in windows), max(win[1] for win in windows)
        res = workers[0]["results"][wid]
        iterations = sum(len(v) for v in res["samples_s"].values()) * int(res["iters"])
        covered, used = sampler.usage(start, end)
        if covered <= 0 or iterations <= 0:
            continue
        scale = (end - start) / covered * 1e3 / iterations
        procs: dict[str, dict[str, list[float]]] = {}
        busiest: dict[str, tuple[float, list[float]]] = {}
        has_zmq: set[str] = set()
        for (proc, _tid), (label, user, sys_) in used.items():
            groups = procs.setdefault(proc, {g: [0.0, 0.0] for g in ("main", "zmq_io", "busiest_thread", "other_threads")})
            pair = [user * scale, sys_ * scale]
            if label == "main":
                group = "main"
            elif label.startswith("ZMQbg/IO"):
                group = "zmq_io"
                has_zmq.add(proc)
            else:
                group = "other_threads"
                if sum(pair) > busiest.get(proc, (-1.0, []))[0]:
                    busiest[proc] = (sum(pair), pair)
            groups[group][0] += pair[0]
            groups[group][1] += pair[1]
        for proc, (_total, pair) in busiest.items():
            procs[proc]["other_threads"] = [procs[proc]["other_threads"][i] - pair[i] for i in range(2)]
            procs[proc]["busiest_thread"] = pair
        out[wid] = {"iterations": iterations, "wall_ms_per_iteration": (end - start) * 1e3 / iterations,
                    "processes": procs, "named_zmq_threads": sorted(has_zmq)}
    return out


# -- results --------------------------------------------------------------------------------
def column(system: str, servers: int) -> str:
    """The results key of a system's cluster: ``pskv S=1``, ``pskv-tcp S=1``, ``mxnet S=1`` ..., ``gloo``."""
    return system if system == "gloo" else f"{system.replace('_', '-')} S={servers}"


class Results:
    """Samples per cluster column, workload, mode and worker rank, round by round."""

    def __init__(self) -> None:
        # column -> workload id -> mode -> rank -> [samples of round 1, samples of round 2, ...]
        self.samples: dict[str, dict[str, dict[str, dict[int, list[list[float]]]]]] = {}
        self.checks: dict[str, dict[str, list[str]]] = {}
        self.environments: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self.clusters: list[dict[str, Any]] = []
        self.thread_cpu: dict[str, dict[str, list[dict[str, Any]]]] = {}  # column -> workload -> one per round

    def add(self, run: ClusterRun) -> None:
        """Record one cluster's outcome."""
        col = column(run.system, run.servers)
        self.clusters.append({"column": col, "round": run.round, "wall_s": round(run.wall_s, 2),
                              "ok": run.error is None})
        if run.error is not None:
            self.errors[col] = run.error
            return
        for wid, usage in run.thread_cpu.items():
            self.thread_cpu.setdefault(col, {}).setdefault(wid, []).append(usage)
        for worker in run.workers:
            rank = int(worker["rank"])
            self.environments.setdefault(run.system, worker["environment"])
            for wid, res in worker["results"].items():
                for mode, values in res["samples_s"].items():
                    per_rank = self.samples.setdefault(col, {}).setdefault(wid, {}).setdefault(mode, {})
                    per_rank.setdefault(rank, []).append([float(v) for v in values])
                self.checks.setdefault(col, {})[wid] = res["check"]

    def rounds(self, col: str, wid: str, mode: str) -> dict[int, list[list[float]]] | None:
        """Per rank, the samples of each round."""
        return self.samples.get(col, {}).get(wid, {}).get(mode)

    def median(self, col: str, wid: str, mode: str) -> float | None:
        """The slower worker's median over all its samples (seconds per iteration)."""
        per_rank = self.rounds(col, wid, mode)
        if not per_rank:
            return None
        return max(statistics.median([v for rnd in rounds for v in rnd]) for rounds in per_rank.values())

    def round_medians(self, col: str, wid: str, mode: str) -> list[float]:
        """Per round, the slower worker's median of that round."""
        per_rank = self.rounds(col, wid, mode)
        if not per_rank:
            return []
        n = min(len(r) for r in per_rank.values())
        return [max(statistics.median(per_rank[rank][i]) for rank in per_rank) for i in range(n)]

    def json(self) -> dict[str, Any]:
        """Raw samples with per-worker statistics and the slower worker's median."""
        out: dict[str, Any] = {}
        for col, workloads in self.samples.items():
            for wid, modes in workloads.items():
                for mode, per_rank in modes.items():
                    out.setdefault(col, {}).setdefault(wid, {})[mode] = {
                        "per_worker": {str(rank): {"samples_s_by_round": rounds,
                                                   **stats([v for rnd in rounds for v in rnd])}
                                       for rank, rounds in sorted(per_rank.items())},
                        "median_s": self.median(col, wid, mode),
                        "round_medians_s": self.round_medians(col, wid, mode),
                    }
        return out


def thread_cpu_summary(results: Results) -> dict[str, Any]:
    """Per column and workload: the rounds' thread CPU (ms per iteration) averaged, per process and group."""
    out: dict[str, Any] = {}
    for col, workloads in results.thread_cpu.items():
        for wid, rounds in workloads.items():
            procs: dict[str, dict[str, list[float]]] = {}
            for usage in rounds:
                for proc, groups in usage["processes"].items():
                    for group, (user, sys_) in groups.items():
                        acc = procs.setdefault(proc, {}).setdefault(group, [0.0, 0.0])
                        acc[0] += user / len(rounds)
                        acc[1] += sys_ / len(rounds)
            wall = statistics.mean(u["wall_ms_per_iteration"] for u in rounds)
            total = sum(u + s for groups in procs.values() for u, s in groups.values())
            named = sorted({p for u in rounds for p in u.get("named_zmq_threads", [])})
            out.setdefault(col, {})[wid] = {"rounds": len(rounds), "wall_ms_per_iteration": wall,
                                            "cpu_ms_per_iteration": total, "processes": procs,
                                            "named_zmq_threads": named}
    return out


def thread_cpu_table(summary: dict[str, Any], workloads: Sequence[DistWorkload]) -> str:
    """The thread CPU summary as markdown: one row per cluster, workload and process."""
    names = {w.id: w.name for w in workloads}
    lines = ["| cluster | workload | wall ms/it | all CPU ms/it | process | main | ZMQ I/O (sys) | busiest other thread "
             "| other threads | process total (sys) |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]

    def ms(pair: list[float]) -> str:
        return f"{sum(pair):.0f}"
    for col, per_work in summary.items():
        for wid, item in per_work.items():
            first = True
            for proc in sorted(item["processes"], key=lambda p: (not p.startswith("server"), p)):
                g = item["processes"][proc]
                head = (f"| {col} | {names.get(wid, wid)} | {item['wall_ms_per_iteration']:.1f} | "
                        f"{item['cpu_ms_per_iteration']:.0f} |") if first else "| | | | |"
                first = False
                total = sum(sum(pair) for pair in g.values())
                sys_total = sum(pair[1] for pair in g.values())
                zmq = f"{ms(g['zmq_io'])} ({g['zmq_io'][1]:.0f})" if proc in item["named_zmq_threads"] else "-"
                lines.append(f"{head} {proc} | {ms(g['main'])} | {zmq} | "
                             f"{ms(g['busiest_thread'])} | {ms(g['other_threads'])} | {total:.0f} ({sys_total:.0f}) |")
    return "\n".join(lines)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _by_round(results: Results, other_col: str, col: str, wid: str, mode: str, other_mode: str) -> list[float]:
    """pskv/other throughput ratio of each round's medians (a noise gauge)."""
    mine = results.round_medians(col, wid, mode)
    theirs = results.round_medians(other_col, wid, other_mode)
    return [t / m for m, t in zip(mine, theirs)]


def display(seconds: float | None, work: DistWorkload) -> float | None:
    """A time per iteration in the workload's unit."""
    if seconds is None or seconds <= 0:
        return None
    if work.unit == "it/s":
        return 1.0 / seconds
    if work.unit == "GB/s":
        return work.value_bytes / GB / seconds
    return seconds * 1e3


def summary_rows(results: Results, workloads: Sequence[DistWorkload], servers: Sequence[int]) -> list[dict[str, Any]]:
    """One row per workload, server count and pskv mode."""
    rows = []
    for work in workloads:
        gloo_t = results.median("gloo", work.id, "push_pull")
        for s in servers:
            m_col = column("mxnet", s)
            mxnet_t = results.median(m_col, work.id, "push_pull")
            for system, mode in ([("pskv", m) for m in work.pskv_modes]
                                 + [("pskv_tcp", "push_pull"), ("pskv_secure", "push_pull")]):
                p_col = column(system, s)
                pskv_t = results.median(p_col, work.id, mode)
                if system != "pskv" and pskv_t is None:
                    continue  # not run
                rows.append({
                    "workload": work.id, "name": work.name, "unit": work.unit, "servers": s,
                    "pskv_system": system, "pskv_mode": mode, "pskv_call": CALL_LABEL[(system, mode)],
                    "value_bytes": work.value_bytes,
                    "pskv_s": pskv_t, "mxnet_s": mxnet_t, "gloo_s": gloo_t,
                    "pskv": display(pskv_t, work), "mxnet": display(mxnet_t, work), "gloo": display(gloo_t, work),
                    "pskv_over_mxnet": _ratio(mxnet_t, pskv_t), "pskv_over_gloo": _ratio(gloo_t, pskv_t),
                    "pskv_over_mxnet_by_round": _by_round(results, m_col, p_col, work.id, mode, "push_pull"),
                    "pskv_over_gloo_by_round": _by_round(results, "gloo", p_col, work.id, mode, "push_pull"),
                })
    return rows


@dataclass(frozen=True)
class Target:
    """A target from the issue, on the push+pull rows: pskv/``against`` throughput >= ``factor``."""

    name: str
    workload: str
    against: str
    factor: float
    text: str


TARGETS = (
    Target("resnet50_vs_mxnet", "resnet50", "mxnet", 2.0, "ResNet-50 list push+pull: pskv it/s >= 2x MXNet"),
    Target("resnet50_vs_gloo", "resnet50", "gloo", 1.0, "ResNet-50 list push+pull: pskv it/s >= 1.0x Gloo (bucketed all_reduce)"),
    Target("64mb_vs_mxnet", "64mb", "mxnet", 3.0, "64 MB key push+pull: pskv GB/s >= 3x MXNet"),
    Target("4kb_latency", "4kb", "mxnet", 1.0, "4 KB key push+pull: pskv latency <= MXNet's"),
    Target("4kb_half", "4kb", "mxnet", 2.0, "4 KB key push+pull: pskv latency <= 0.5x MXNet's (issue 23)"),
    Target("resnet50_sgd_vs_mxnet", "resnet50_sgd", "mxnet", 2.0, "ResNet-50 + SGD on servers: pskv it/s >= 2x MXNet"),
)


def evaluate_targets(rows: Sequence[dict[str, Any]], servers: Sequence[int]) -> list[dict[str, Any]]:
    """PASS / MISS (n/a when a side is missing) per target and server count, plus the pushpull ratio as information."""
    index = {(r["workload"], r["servers"], r["pskv_system"], r["pskv_mode"]): r for r in rows}
    verdicts = []
    present = {r["workload"] for r in rows}
    for t in TARGETS:
        if t.workload not in present:  # left out with --only
            continue
        for s in servers:
            row = index.get((t.workload, s, "pskv", "push_pull"))
            ratio = row[f"pskv_over_{t.against}"] if row else None
            by_round = row[f"pskv_over_{t.against}_by_round"] if row else []
            alt = index.get((t.workload, s, "pskv", "pushpull"))
            tcp = index.get((t.workload, s, "pskv_tcp", "push_pull"))
            status = "n/a" if ratio is None else ("PASS" if ratio >= t.factor else "MISS")
            verdicts.append({**asdict(t), "servers": s, "ratio": ratio, "ratio_by_round": by_round,
                             "status": status, "pushpull_ratio": alt[f"pskv_over_{t.against}"] if alt else None,
                             "sockets_only_ratio": tcp[f"pskv_over_{t.against}"] if tcp else None})
    return verdicts


def secure_costs(results: Results, workloads: Sequence[DistWorkload], servers: Sequence[int]) -> list[dict[str, Any]]:
    """Per workload and server count: the keyed sockets-only time over the plain one (``--secure``), and by round."""
    out = []
    for work in workloads:
        for s in servers:
            plain, keyed = column("pskv_tcp", s), column("pskv_secure", s)
            ratio = _ratio(results.median(keyed, work.id, "push_pull"), results.median(plain, work.id, "push_pull"))
            if ratio is None:
                continue
            out.append({"workload": work.id, "name": work.name, "servers": s, "secure_over_plain": ratio,
                        "by_round": _by_round(results, keyed, plain, work.id, "push_pull", "push_pull"),
                        "status": "PASS" if ratio <= SECURE_BAR else "MISS"})
    return out


# -- reporting ------------------------------------------------------------------------------
def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The result table as markdown."""
    lines = ["| workload | unit | S | pskv call | pskv | MXNet | Gloo | pskv/MXNet | by round | pskv/Gloo | by round |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['unit']} | {r['servers']} | {r['pskv_call']} | "
                     f"{_fmt(r['pskv'])} | {_fmt(r['mxnet'])} | {_fmt(r['gloo'])} | {_x(r['pskv_over_mxnet'])} | "
                     f"{_spread(r['pskv_over_mxnet_by_round'])} | {_x(r['pskv_over_gloo'])} | "
                     f"{_spread(r['pskv_over_gloo_by_round'])} |")
    return "\n".join(lines)


def target_lines(verdicts: Sequence[dict[str, Any]]) -> str:
    """One PASS/MISS line per target and server count."""
    out = []
    for v in verdicts:
        extra = f"; pushpull {_x(v['pushpull_ratio'])}" if v["pushpull_ratio"] is not None else ""
        if v["sockets_only_ratio"] is not None:
            extra += f"; sockets only {_x(v['sockets_only_ratio'])}"
        out.append(f"  [{v['status']:>4}] S={v['servers']} {v['text']}: {_x(v['ratio'])} "
                   f"(by round {_spread(v['ratio_by_round'])}{extra})")
    return "\n".join(out)


def print_report(payload: dict[str, Any], json_path: Path) -> None:
    """Header, table and targets on stdout."""
    env, settings = payload["environment"], payload["settings"]
    mx = (env.get("mxnet") or {}).get("mxnet", "-")
    torch_v = (env.get("gloo") or {}).get("torch", env.get("torch"))
    print(f"\npskv {env['pskv']} vs MXNet {mx} ({env['status']['mxnet']}) vs Gloo (torch {torch_v}, "
          f"{env['status']['gloo']}); W={WORKERS} workers on 127.0.0.1; {env['cpu_count']} CPUs, {env['cpu_model']}; "
          f"{env['date_utc']}")
    print(f"measured: {env['pskv_measured']} (commit {env['git_commit']})")
    print(f"{ITERATION_DEFINITION}.\n{GBPS_DEFINITION}. Slower worker's median of {settings['rounds']} rounds x "
          f"{settings['repeats_per_round']} samples; ratios = other's time / pskv's time (> 1: pskv faster).\n")
    print(markdown_table(payload["summary"]))
    print("\nTargets (push+pull rows):\n" + target_lines(payload["targets"]))
    for c in payload.get("secure", []):
        print(f"  [{c['status']:>4}] S={c['servers']} {c['name']}, sockets only: time with a CURVE key / without "
              f"<= {SECURE_BAR}x: {c['secure_over_plain']:.2f}x (by round {_spread(c['by_round'])})")
    if payload.get("thread_cpu_table"):
        print("\nCPU per iteration by thread (ms; timed windows only; 2 cores give 2 x wall of capacity):\n")
        print(payload["thread_cpu_table"])
    for col, err in payload["errors"].items():
        print(f"\n{col} FAILED: {err.splitlines()[0]} (details in the JSON)")
    print(f"\nraw samples and environment: {json_path} (whole run {settings['wall_s']:.0f} s)")


# -- driver ---------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="pskv dist_sync vs MXNet 1.9.1 dist_sync vs Gloo all-reduce, W=2, loopback",
                                epilog=f"{ITERATION_DEFINITION}. {GBPS_DEFINITION}.")
    p.add_argument("--quick", action="store_true", help="1 round, 2 samples, short loops: a smoke run (~1 min)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"result file (default {DEFAULT_JSON.relative_to(REPO_DIR)})")
    p.add_argument("--no-mxnet", action="store_true", help="skip MXNet")
    p.add_argument("--no-gloo", action="store_true", help="skip the Gloo reference")
    p.add_argument("--no-sockets-variant", action="store_true",
                   help="skip the extra pskv clusters with PSKV_SHM=0 (array data through sockets, as between hosts)")
    p.add_argument("--secure", action="store_true",
                   help="also run the sockets-only clusters with a CURVE cluster key (sealed data connections) and "
                        "report their time over the plain ones'")
    p.add_argument("--rounds", type=int, default=None, help="rounds; each starts every cluster once (default 2, quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per workload and mode per round (default 3, quick 2)")
    p.add_argument("--servers", default="1,2", help="server counts to run, comma-separated (default 1,2)")
    p.add_argument("--only", default=None, help="workload ids to run, comma-separated: resnet50,64mb,4kb,resnet50_sgd")
    p.add_argument("--mxnet-venv", type=Path, default=Path(os.environ.get("MXNET_VENV", BENCH_DIR / ".venv-mxnet")),
                   help="MXNet venv (default $MXNET_VENV or bench/.venv-mxnet)")
    p.add_argument("--pskv-commit", default=None, metavar="REV",
                   help="measure pskv/ as committed in REV (git archive to a temporary directory) instead of the checkout")
    p.add_argument("--cluster-timeout", type=float, default=300.0, help="seconds one cluster's workers may take (default 300)")
    p.add_argument("--profile", type=Path, default=None,
                   help="record every pskv server and worker with py-spy (raw stacks, all threads) into this directory")
    p.add_argument("--thread-cpu", action="store_true",
                   help="sample every process's per-thread CPU time from /proc during the timed windows (a diagnosis; "
                        "the sampler itself costs a little CPU)")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' log directory (path printed)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.repeats = args.repeats or (2 if args.quick else 3)
    try:
        args.server_counts = sorted({int(s) for s in args.servers.split(",") if s.strip()})
    except ValueError:
        p.error("--servers takes comma-separated integers")
    if not args.server_counts or min(args.server_counts) < 1:
        p.error("--servers needs counts >= 1")
    if args.thread_cpu and args.profile is not None:
        p.error("--thread-cpu and --profile do not mix (py-spy would be the process sampled)")
    if args.thread_cpu and not ThreadCpuSampler.available():
        p.error("--thread-cpu needs Linux /proc")
    return args


def export_pskv(rev: str, dest: Path) -> tuple[Path, str]:
    """``git archive`` the ``pskv/`` directory of ``rev`` into ``dest``; returns ``(dest, full commit hash)``.

    Raises:
        subprocess.CalledProcessError: ``rev`` is not a commit of this repository.
    """
    commit = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_DIR), "archive", "--format=tar", commit, "pskv"],
                             capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    return dest, commit


def select_workloads(workloads: list[DistWorkload], only: str | None,
                     log: Callable[[str], None]) -> list[DistWorkload] | None:
    """The workloads ``--only`` names (all without it); None (after saying why) for an unknown id."""
    if not only:
        return workloads
    wanted = {w.strip() for w in only.split(",")}
    unknown = wanted - {w.id for w in workloads}
    if unknown:
        log(f"unknown workload ids {sorted(unknown)}; known: {[w.id for w in workloads]}")
        return None
    return [w for w in workloads if w.id in wanted]


def measured_source(args: argparse.Namespace, env: dict[str, Any], tmp: Path,
                    log: Callable[[str], None]) -> Path | None:
    """The directory holding the ``pskv/`` that is measured (``--pskv-commit``'s export, or this checkout),
    noted in ``env``; None (after saying why) when the commit cannot be exported."""
    if args.pskv_commit is None:
        env["pskv_measured"] = "pskv/ of this checkout" + (" with uncommitted changes" if env["pskv_sources_modified"] else "")
        return REPO_DIR
    try:
        pskv_src, commit = export_pskv(args.pskv_commit, tmp / "pskv-src")
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"--pskv-commit {args.pskv_commit}: {exc}")
        return None
    log(f"measuring pskv/ as committed in {commit[:12]} (exported to {pskv_src})")
    env.update({"git_commit": commit[:7], "git_commit_full": commit, "pskv_sources_modified": False,
                "pskv_measured": f"pskv/ of commit {commit} (--pskv-commit {args.pskv_commit})"})
    return pskv_src


def systems_to_run(args: argparse.Namespace, launcher: Launcher,
                   log: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
    """The systems measured, and every system's status for the report ("run" or why not)."""
    status = {"pskv": "run", "pskv_tcp": "run", "pskv_secure": "run", "mxnet": "run", "gloo": "run"}
    systems = ["pskv"]
    if args.no_sockets_variant:
        status["pskv_tcp"] = "not run: --no-sockets-variant"
    else:
        systems.append("pskv_tcp")
    if not args.secure or args.no_sockets_variant:
        status["pskv_secure"] = "not run: without --secure (or with --no-sockets-variant)"
    else:
        systems.append("pskv_secure")
    if args.no_mxnet:
        status["mxnet"] = "not run: --no-mxnet"
    elif launcher.mxnet_python is None:
        log(missing_venv_message(args.mxnet_venv) + "\n  MXNet is marked 'not run'")
        status["mxnet"] = f"not run: no venv at {args.mxnet_venv}"
    else:
        systems.append("mxnet")
    if args.no_gloo:
        status["gloo"] = "not run: --no-gloo"
    else:
        systems.append("gloo")
    return systems, status


def main(argv: Sequence[str] | None = None) -> int:
    """Run every round, print the report, write the JSON."""
    args = parse_args(argv)
    install_sigterm_handler()
    log = stderr_logger()
    check_resnet_shapes(log)
    workloads = select_workloads(make_workloads(args.quick), args.only, log)
    if workloads is None:
        return 2
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    env = environment({})  # before measuring: the commit and code that are measured
    tmp = Path(tempfile.mkdtemp(prefix="pskv-bench-dist-"))
    pskv_src = measured_source(args, env, tmp, log)
    if pskv_src is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return 2
    launcher = Launcher(args, workloads, tmp, log, pskv_src)
    if args.profile is not None and launcher.py_spy is None:
        log("--profile: py-spy not found (pip install py-spy); running without it")
    systems, status = systems_to_run(args, launcher, log)
    order = [(system, s) for s in args.server_counts for system in SYSTEMS
             if system in systems and (system != "gloo" or s == args.server_counts[0])]
    results = Results()
    failed: set[str] = set()
    start = time.perf_counter()
    try:
        for rnd in range(1, args.rounds + 1):
            log(f"round {rnd}/{args.rounds}")
            for system, s in order:
                col = column(system, s)
                if col in failed:
                    continue
                run = launcher.run(system, s, rnd)
                results.add(run)
                if run.error is not None:
                    failed.add(col)
                    log(f"  {col:11} FAILED after {run.wall_s:.1f} s; no further rounds of it:\n{run.error}")
                else:
                    log(f"  {col:11} {run.wall_s:5.1f} s")
    finally:
        if args.keep_logs:
            log(f"process logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - start
    for col in failed:
        status[col.split()[0].replace("-", "_")] = f"failed ({col}; error in the JSON)"
    rows = summary_rows(results, workloads, args.server_counts)
    payload: dict[str, Any] = {
        "schema": "pskv-bench-dist/1",
        "definitions": {
            "iteration": ITERATION_DEFINITION, "gbps": GBPS_DEFINITION,
            "reported_time": "per worker the median over all its samples; the slower worker's median is reported",
            "pskv_over_other": "other system's median time / pskv's median time (throughput ratio; > 1: pskv faster)",
            "gloo": "push+pull = all_reduce of the same data: one key: out.copy_(val) + all_reduce(out); key list: "
                    "DDP-style 25 MiB buckets (reverse order, async all_reduce per bucket, copy in/out); "
                    "with SGD: plus a local torch.optim.SGD(foreach) step on every worker",
            "mxnet_pushpull": "not measured: MXNet 1.9.1 dist_sync pushpull(key, value, out) left out unchanged",
            "pskv_push_pull": "push(key, value, block=False) then pull(key, out=out), the equivalent of MXNet's "
                              "asynchronous push + pull (push_pull_blocking: a blocking push, returning once the "
                              "servers hold the data, then the pull)",
        },
        "settings": {"quick": args.quick, "rounds": args.rounds, "repeats_per_round": args.repeats,
                     "workers": WORKERS, "servers": args.server_counts, "dtype": np.dtype(DTYPE).name,
                     "optimizer": SGD, "cluster_order": [column(sy, s) for sy, s in order],
                     "profile": str(args.profile) if args.profile else None, "thread_cpu": args.thread_cpu,
                     "wall_s": round(wall, 1)},
        "environment": {**env, "load_average_at_end": _load_average(), "torch_installed": _version("torch"),
                        "mxnet": results.environments.get("mxnet"), "gloo": results.environments.get("gloo"),
                        "pskv_worker": results.environments.get("pskv"), "status": status},
        "workloads": [{"id": w.id, "name": w.name, "arrays": len(w.shapes), "elements": w.elements,
                       "value_bytes": w.value_bytes, "value_size": _size(w.value_bytes), "as_list": w.as_list,
                       "unit": w.unit, "iters_per_sample": w.iters, "warmup_iters": w.warmup,
                       "pskv_modes": list(w.pskv_modes), "optimizer": w.optimizer, "expected_after_one_iteration": w.expect}
                      for w in workloads],
        "clusters": results.clusters,
        "checks": results.checks,
        "errors": results.errors,
        "results": results.json(),
        "summary": rows,
        "targets": evaluate_targets(rows, args.server_counts),
        "secure": secure_costs(results, workloads, args.server_counts),
    }
    if args.thread_cpu:
        cpu = thread_cpu_summary(results)
        payload["definitions"]["thread_cpu"] = (
            "CPU ms per iteration of each process's threads during the workers' timed windows, from /proc "
            "(user, system); groups: main thread, ZeroMQ I/O threads, the busiest other thread (pskv: the reactor), "
            "the other threads; averaged over rounds and over the workload's modes")
        payload["thread_cpu"] = cpu
        payload["thread_cpu_table"] = thread_cpu_table(cpu, workloads)
    write_json(args.json, payload)
    print_report(payload, args.json)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every child has been reaped on the way out
        print("\nbench_dist: interrupted; all cluster processes stopped", file=sys.stderr)
        sys.exit(130)
