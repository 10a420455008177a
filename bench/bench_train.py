"""End-to-end data-parallel training: pskv ``dist_sync`` (S = 1, 2 servers) vs PyTorch DDP on Gloo, W=2 workers.

Usage::

    python bench/bench_train.py [--quick] [--json PATH] [--models mlp,cnn,mlp_large] [--servers 1,2]
                                [--rounds R] [--repeats N] [--pskv-commit REV] [--profile DIR] [--keep-logs]

Every cluster is a set of real processes on 127.0.0.1, started by this program:

* **pskv S=1 / S=2**: ``python -m pskv scheduler --port-file F`` (a free port,
  published through F), ``S`` x ``python -m pskv server`` and 2 x
  ``_train_worker_pskv.py`` (``DataParallelExecutorGroup`` + ``Trainer``: gradients
  pushed in buckets during backward, SGD on the servers, default settings);
* **DDP**: 2 x ``_train_worker_ddp.py`` (``DistributedDataParallel`` over Gloo, local
  ``torch.optim.SGD``).

Both sides train the same models from the same initial parameters on the same data with
the same optimizer (see ``_train_common.py``): the MLP and the CNN of
``examples/train_digits.py`` on scikit-learn's digits, a 784-1024-1024-10 MLP (1.86 M
parameters) on synthetic data, 32 samples per worker per step, and a ResNet-18 for 32x32
inputs (11.2 M parameters, batch norm) on synthetic 3x32x32 images, 8 samples per worker
per step; ``torch.set_num_threads(1)`` in every worker. A **step** is forward, backward, gradient exchange and the parameter
update, complete on both workers; the result is in **steps/s** (x 2 x batch = samples/s).

**Lockstep protocol.** All clusters are started at once and stay up for the whole run,
but a cluster works only while it holds the driver's run token (a line protocol over a
loopback socket, ``_train_common.Gate``), so no two clusters ever compute at the same
time. Per model the driver hands the token out phase by phase: ``prep`` (build, 10
recorded probe steps, warm-up) to each cluster, then ``rounds x repeats`` timed samples
per cluster — sample ``k`` goes to the clusters in an order rotated by ``k`` — then
``final`` (10 more probe steps, parameter digest). A sample is a barrier across the
cluster's workers, then ``iters`` steps; its time / ``iters`` is the time per step. The
systems' samples thus alternate about a second apart, and a load change on a shared
machine hits all of them. Per worker the median over all its samples is taken and the
slower worker's median reported; the per-round medians (``repeats`` consecutive samples)
give the range.

Every run is checked, so that a broken system cannot be timed: both workers must end with
bit-identical parameters, the loss must fall (mean of the last probe steps < 0.75 x the
first ones), and pskv's first losses must agree with DDP's (same model, data and update).
Prints a table (steps/s, per-round range, pskv/DDP ratio) and PASS/MISS per model and
server count for the target pskv >= 1.2x DDP steps/s (issue 11) — a miss never fails the run; a
failed check or cluster gives exit status 1 — and writes raw samples, losses, checks and
the environment to ``--json`` (default ``bench/results/train.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _procs import install_sigterm_handler  # noqa: E402
from _train_common import MODELS, ModelSpec, loss_trajectory  # noqa: E402
from bench_dist import export_pskv  # noqa: E402
from bench_local import _fmt, _load_average, _spread, _version, _x, environment, stats, stderr_logger, write_json  # noqa: E402

from pskv.testing.jobs import JobError, Process, ProcessGroup, free_port, start_nodes  # noqa: E402

DEFAULT_JSON = BENCH_DIR / "results" / "train.json"
WORKERS = 2
DDP = "DDP (Gloo)"
LOSS_DROP = 0.75          # the last probe steps' mean loss must be below this fraction of the first ones'
FIRST_LOSS_TOL = 1e-4     # step 1: same parameters, same batch -> the same loss (float32 rounding only)
TARGET_FACTOR = 1.2       # issue 11: every model's pskv steps/s >= 1.2x DDP's
TORCH_TARGET_FACTOR = 1.0  # issue 22: pskv.torch's DistributedOptimizer and DistributedDataParallel >= 1.0x DDP
CROSS_BARRIER_TARGET_FACTOR = 1.1  # issue 22: pskv.torch's cross-barrier >= 1.1x DDP (ResNet-18's row)
TRAJECTORY_TOL = 0.05     # probe steps 1-10: same updates up to summation order
STARTUP_TIMEOUT = 180.0   # every cluster's workers must have joined within this
STEP_DEFINITION = ("one step = forward + backward + gradient exchange + parameter update of a "
                   f"{WORKERS}-worker job, complete on both workers; a sample's time per step is the slower worker's; "
                   "steps/s = 1 / median over samples")


class ClusterFailed(RuntimeError):
    """A cluster's process died, broke the token protocol, or ran past a deadline."""


# -- clusters and run tokens ------------------------------------------------------------------
# pskv.torch's APIs (``--torch-apis``): the system name of its clusters and their column's name
TORCH_APIS = {"optimizer": "pskv.torch DistributedOptimizer", "ddp": "pskv.torch DistributedDataParallel",
              "cross_barrier": "pskv.torch cross-barrier"}


def column(system: str, servers: int) -> str:
    """The results key of a cluster: ``pskv S=1``, ``pskv S=2``, ``pskv.torch DistributedOptimizer S=1``, ``DDP (Gloo)``."""
    if system == "ddp":
        return DDP
    api = system.removeprefix("torch-")
    return f"{TORCH_APIS[api]} S={servers}" if api in TORCH_APIS else f"pskv S={servers}"


@dataclass
class Cluster:
    """One running cluster: its processes, its workers' JSON lines (at the end), or its error."""

    system: str          # "pskv", "torch-optimizer", "torch-ddp" or "ddp"
    servers: int
    label: str
    group: ProcessGroup
    workers: list[Process] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def column(self) -> str:
        return column(self.system, self.servers)

    @property
    def alive(self) -> bool:
        return self.error is None

    def check(self) -> None:
        """Raise JobError if one of its processes exited with an error (or a worker exited early)."""
        self.group.check()

    def fail(self, what: str) -> None:
        """Record the error with every process's stderr tail, and stop the cluster."""
        self.error = str(self.group.failure(what))
        self.group.close()


def _process_tree_cpu(roots: Sequence[int]) -> float:
    """CPU seconds (user + system, all threads) used so far by the processes ``roots`` and all their
    descendants that are alive (Linux ``/proc``; 0.0 elsewhere)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # fields[1]: ppid
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def cluster_cpu_seconds(cluster: Cluster) -> float:
    """CPU seconds used so far by every process of the cluster (scheduler, servers, workers; py-spy too
    with ``--profile``)."""
    return _process_tree_cpu([p.popen.pid for p in cluster.group.procs])


class TokenServer:
    """The driver's side of the run tokens: a loopback listening socket, one connection per worker.

    Workers say ``hello LABEL RANK`` and then send ``ready PHASE`` / ``done PHASE [VALUE]``
    lines; the driver answers ``go``. Lines are collected per ``(label, rank)``.
    """

    def __init__(self) -> None:
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind(("127.0.0.1", 0))
        self._listen.listen(64)
        self.address = f"127.0.0.1:{self._listen.getsockname()[1]}"
        self._conns: dict[socket.socket, tuple[str, int] | None] = {}
        self._buffers: dict[socket.socket, bytes] = {}
        self._by_key: dict[tuple[str, int], socket.socket] = {}
        self.inbox: dict[tuple[str, int], deque[str]] = {}

    def pump(self, timeout: float) -> None:
        """Accept connections and read whatever lines arrive within ``timeout`` seconds."""
        readable, _, _ = select.select([self._listen, *self._conns], [], [], timeout)
        for sock in readable:
            if sock is self._listen:
                conn, _ = self._listen.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._conns[conn] = None
                self._buffers[conn] = b""
                continue
            data = sock.recv(65536)
            if not data:  # the worker closed its end
                key = self._conns.pop(sock)
                self._buffers.pop(sock, None)
                sock.close()
                if key is not None:
                    self.inbox.setdefault(key, deque()).append("<closed>")
                continue
            buf = self._buffers[sock] + data
            *lines, self._buffers[sock] = buf.split(b"\n")
            for raw in lines:
                line = raw.decode("ascii", "replace").strip()
                key = self._conns[sock]
                if key is None and line.startswith("hello "):
                    _, label, rank = line.split()
                    key = (label, int(rank))
                    self._conns[sock] = key
                    self._by_key[key] = sock
                    self.inbox.setdefault(key, deque())
                elif key is not None:
                    self.inbox[key].append(line)

    def send(self, key: tuple[str, int], line: str) -> None:
        """Send one line to a worker."""
        self._by_key[key].sendall((line + "\n").encode("ascii"))

    def close(self) -> None:
        """Close every socket."""
        for sock in list(self._conns):
            sock.close()
        self._listen.close()


class Runner:
    """Starts every cluster, hands out the run tokens phase by phase, collects the workers' JSON lines."""

    def __init__(self, args: argparse.Namespace, models: list[dict[str, Any]], tmp: Path, pskv_src: Path,
                 log: Any) -> None:
        self.args = args
        self.models = models
        self.tmp = tmp
        self.pskv_src = pskv_src
        self.log = log
        self.tokens = TokenServer()
        self.samples = args.rounds * args.repeats
        self.py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        self.clusters: list[Cluster] = []
        self.progress: dict[str, dict[str, list[float]]] = {}  # column -> model -> slower rank's sample times
        self.cpu: dict[str, dict[str, list[float]]] = {}  # column -> model -> per sample: the cluster's CPU s / step

    # -- starting ---------------------------------------------------------------------------
    def _spec_file(self) -> Path:
        path = self.tmp / "spec.json"
        path.write_text(json.dumps({"samples": self.samples, "models": self.models}), encoding="utf-8")
        return path

    def _base_env(self, label: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PSKV_BENCH_LINGER_S"):
            env.pop(k, None)
        env.update({"PSKV_BENCH_GATE": self.tokens.address, "PSKV_BENCH_LABEL": label})
        return env

    @staticmethod
    def job_id(label: str) -> str:
        """pskv's job id of a cluster: names its servers' shared-memory directories."""
        return f"bench-train-{os.getpid()}-{label}"

    def _profiled(self, argv: list[str], label: str, name: str) -> list[str]:
        if self.args.profile is None or self.py_spy is None:
            return argv
        out = self.args.profile / f"{label}-{name.replace(' ', '')}.txt"
        idle = ["--idle"] if self.args.profile_idle else []
        return [self.py_spy, "record", "--format", "raw", "--rate", "250", "--threads", "--nonblocking", *idle,
                "--output", str(out), "--", *argv]

    def start(self, system: str, servers: int, spec: Path) -> Cluster:
        """Start one cluster's processes (its workers then connect to the token server)."""
        label = f"{system}-s{servers}" if system != "ddp" else "ddp"
        cluster = Cluster(system, servers, label, ProcessGroup(label, self.tmp / label))
        self.clusters.append(cluster)
        try:
            cluster.workers = (self._start_ddp if system == "ddp" else self._start_pskv)(cluster, spec)
        except (JobError, OSError) as exc:
            cluster.fail(f"start failed: {exc}")
        return cluster

    def _start_pskv(self, cluster: Cluster, spec: Path) -> list[Process]:
        py, src, group, label = sys.executable, self.pskv_src, cluster.group, cluster.label
        env = self._base_env(label)
        # ``python -m pskv`` finds the measured pskv first: it is the working directory and first on PYTHONPATH
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["PSKV_BENCH_SRC"] = str(src)
        # a job id of our own names the servers' shared-memory directories (/dev/shm/pskv-<job id>-server-*),
        # so that what a killed server leaves can be removed, and nothing else touches them
        env["PSKV_JOB_ID"] = self.job_id(label)
        assert group.logdir is not None
        script = [py, str(BENCH_DIR / "_train_worker_pskv.py"), str(spec)]
        if cluster.system.startswith("torch-"):  # pskv.torch on the same servers: a PyTorch user's own loop
            env["PSKV_BENCH_API"] = cluster.system.removeprefix("torch-")
            script = [py, str(BENCH_DIR / "_train_worker_pskv_torch.py"), str(spec)]
        start_nodes(group, group.logdir, cluster.servers, WORKERS, script, env, cwd=src,
                    enter=lambda name, argv: argv if name == "scheduler" else self._profiled(argv, label, name))
        return [p for p in group.procs if p.name.startswith("worker")]

    def _start_ddp(self, cluster: Cluster, spec: Path) -> list[Process]:
        env = {**self._base_env(cluster.label), "GLOO_INIT": f"tcp://127.0.0.1:{free_port()}",
               "WORLD_SIZE": str(WORKERS)}
        script = str(BENCH_DIR / "_train_worker_ddp.py")
        return [cluster.group.start(f"worker {r}", self._profiled([sys.executable, script, str(spec)], cluster.label,
                                                                 f"worker{r}"), {**env, "RANK": str(r)}, cwd=REPO_DIR)
                for r in range(WORKERS)]

    # -- tokens -----------------------------------------------------------------------------
    def _expect(self, cluster: Cluster, timeout: float) -> list[str]:
        """The next line of each of the cluster's workers (waits, watching its processes)."""
        deadline = time.monotonic() + timeout
        keys = [(cluster.label, r) for r in range(WORKERS)]
        while True:
            if all(self.tokens.inbox.get(k) for k in keys):
                return [self.tokens.inbox[k].popleft() for k in keys]
            cluster.check()
            if time.monotonic() > deadline:
                raise ClusterFailed(f"no answer from its workers within {timeout:.0f} s")
            self.tokens.pump(0.02)

    def grant(self, cluster: Cluster, phase: str) -> list[float]:
        """Let the cluster run ``phase`` alone; returns the values its workers reported (sample times)."""
        if not cluster.alive:
            return []
        try:
            ready = self._expect(cluster, self.args.cluster_timeout)
            if any(r != f"ready {phase}" for r in ready):
                raise ClusterFailed(f"expected 'ready {phase}', got {ready}")
            cpu_before = cluster_cpu_seconds(cluster)
            for r in range(WORKERS):
                self.tokens.send((cluster.label, r), "go")
            done = self._expect(cluster, self.args.cluster_timeout)
            if any(d.split()[:2] != ["done", phase] for d in done):
                raise ClusterFailed(f"expected 'done {phase}', got {done}")
            if phase.startswith("sample:"):
                mid = phase.split(":")[1]
                steps = next(int(w["iters"]) for w in self.models if w["id"] == mid)
                self.cpu.setdefault(cluster.column, {}).setdefault(mid, []).append(
                    (cluster_cpu_seconds(cluster) - cpu_before) / steps)
        except (ClusterFailed, OSError) as exc:
            cluster.fail(f"phase {phase}: {exc}")
            self.log(f"  {cluster.column} FAILED in phase {phase}; it is left out from here on")
            return []
        return [float(d.split()[2]) for d in done if len(d.split()) > 2]

    def run(self) -> float:
        """The whole run; returns its wall time in seconds."""
        started = time.perf_counter()
        spec = self._spec_file()
        for s in self.args.server_counts:
            self.start("pskv", s, spec)
        for api in self.args.torch_apis:
            self.start(f"torch-{api}", 1, spec)
        self.start("ddp", 0, spec)
        self.log(f"started {', '.join(c.column for c in self.clusters)}; waiting for their workers")
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for c in self.clusters:
            try:
                while c.alive and not all((c.label, r) in self.tokens.inbox for r in range(WORKERS)):
                    c.check()
                    if time.monotonic() > deadline:
                        raise ClusterFailed(f"workers did not connect within {STARTUP_TIMEOUT:.0f} s")
                    self.tokens.pump(0.05)
            except ClusterFailed as exc:
                c.fail(str(exc))
                self.log(f"  {c.column} FAILED at start-up")
        self.log(f"all joined after {time.perf_counter() - started:.1f} s")
        for work in self.models:
            mid = work["id"]
            for c in self.clusters:
                self.grant(c, f"prep:{mid}")
            for k in range(self.samples):
                shift = k % len(self.clusters)
                for c in self.clusters[shift:] + self.clusters[:shift]:
                    values = self.grant(c, f"sample:{mid}:{k}")
                    if values:
                        self.progress.setdefault(c.column, {}).setdefault(mid, []).append(max(values))
            for c in self.clusters:
                self.grant(c, f"final:{mid}")
            rates = [f"{c.column} {1 / statistics.median(self.progress[c.column][mid]):.1f} "
                     f"({1e3 * statistics.median(self.cpu[c.column][mid]):.1f} CPU ms/step)"
                     for c in self.clusters if mid in self.progress.get(c.column, {}) and self.cpu.get(c.column, {}).get(mid)]
            self.log(f"{mid}: steps/s (median of {self.samples} samples) {', '.join(rates)}")
        for c in self.clusters:
            self._finish(c)
        return time.perf_counter() - started

    def _finish(self, cluster: Cluster) -> None:
        """Wait for the cluster to end, read its workers' JSON lines, reap it."""
        try:
            if cluster.alive:
                bye = self._expect(cluster, 120)
                if any(b != "bye" for b in bye):
                    raise ClusterFailed(f"expected 'bye', got {bye}")
                cluster.group.wait(cluster.workers, 120)
                cluster.group.wait(cluster.group.procs, 60)  # servers and scheduler end when every worker has left
                cluster.results = sorted((p.json_line() for p in cluster.workers), key=lambda j: int(j["rank"]))
        except (ClusterFailed, JobError, OSError, ValueError, KeyError) as exc:
            cluster.fail(f"at the end: {exc}")
        finally:
            cluster.group.close()
            if cluster.system != "ddp":
                from pskv.transport.shm import remove_job_files

                remove_job_files(self.job_id(cluster.label))

    def close(self) -> None:
        """Reap every cluster and close the token server."""
        for c in self.clusters:
            c.group.close()
        self.tokens.close()


# -- results --------------------------------------------------------------------------------
class Results:
    """Samples per column, model and worker rank, round by round; losses and parameter digests per cluster run."""

    def __init__(self) -> None:
        # column -> model -> rank -> [samples of round 1, samples of round 2, ...]
        self.samples: dict[str, dict[str, dict[int, list[list[float]]]]] = {}
        # column -> model -> one entry per cluster run: {"run", "ranks": {rank: {first_losses, last_losses, ...}}}
        self.runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.environments: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}

    def add(self, cluster: Cluster, repeats: int) -> None:
        """Record one cluster's outcome; its samples are split into rounds of ``repeats``."""
        col = cluster.column
        if cluster.error is not None:
            self.errors[col] = cluster.error
        per_model: dict[str, dict[int, dict[str, Any]]] = {}
        for worker in cluster.results:
            rank = int(worker["rank"])
            self.environments.setdefault(cluster.system, worker["environment"])
            for mid, res in worker["results"].items():
                values = [float(v) for v in res["samples_s"]]
                per_rank = self.samples.setdefault(col, {}).setdefault(mid, {})
                per_rank[rank] = [values[i:i + repeats] for i in range(0, len(values), repeats)]
                per_model.setdefault(mid, {})[rank] = {k: v for k, v in res.items() if k != "samples_s"}
        for mid, ranks in per_model.items():
            self.runs.setdefault(col, {}).setdefault(mid, []).append({"run": len(self.runs.get(col, {}).get(mid, [])) + 1,
                                                                       "ranks": ranks})

    def job_samples(self, col: str, mid: str) -> list[float]:
        """Per sample, in order, the slower worker's time per step (the job's: its workers start each
        sample together at a barrier)."""
        per_rank = self.samples.get(col, {}).get(mid)
        if not per_rank:
            return []
        flat = [[v for rnd in rounds for v in rnd] for rounds in per_rank.values()]
        return [max(vs) for vs in zip(*flat)]

    def median(self, col: str, mid: str) -> float | None:
        """The median over samples of the job's time per step."""
        values = self.job_samples(col, mid)
        return statistics.median(values) if values else None

    def round_medians(self, col: str, mid: str, repeats: int) -> list[float]:
        """Per round (``repeats`` consecutive samples), the median of the job's time per step."""
        values = self.job_samples(col, mid)
        return [statistics.median(values[i:i + repeats]) for i in range(0, len(values), repeats)]

    def paired_ratios(self, col: str, mid: str) -> list[float]:
        """Per sample slot ``k``: DDP's time / this column's (the two samples ran back to back)."""
        return [d / p for p, d in zip(self.job_samples(col, mid), self.job_samples(DDP, mid)) if p > 0]

    def json(self, repeats: int) -> dict[str, Any]:
        """Raw samples with per-worker statistics, the job's samples, median and per-round medians."""
        out: dict[str, Any] = {}
        for col, models in self.samples.items():
            for mid, per_rank in models.items():
                job = self.job_samples(col, mid)
                out.setdefault(col, {})[mid] = {
                    "per_worker": {str(rank): {"samples_s_by_round": rounds, **stats([v for rnd in rounds for v in rnd])}
                                   for rank, rounds in sorted(per_rank.items())},
                    "job_samples_s": job,
                    **({f"job_{k}": v for k, v in stats(job).items()} if job else {}),
                    "round_medians_s": self.round_medians(col, mid, repeats),
                }
        return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def run_checks(results: Results, columns: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per column and model: did training happen, identically on both workers, and like DDP's?

    * ``in_sync``: both workers' final parameters have the same SHA-256;
    * ``loss_falls``: for every worker, mean of the last probe losses < ``LOSS_DROP`` x the first's, and
      every recorded loss is finite;
    * ``matches_ddp`` (pskv only): rank 0's first probe losses against DDP's: step 1 within
      ``FIRST_LOSS_TOL``, all probe steps within ``TRAJECTORY_TOL``.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    ddp_runs = results.runs.get(DDP, {})
    for col in columns:
        for mid, rounds in results.runs.get(col, {}).items():
            in_sync, loss_falls, notes = True, True, []
            first_means, last_means = [], []
            for entry in rounds:
                ranks = entry["ranks"]
                digests = {r: v["final_params"]["sha256"] for r, v in ranks.items()}
                if len(set(digests.values())) != 1 or len(ranks) != WORKERS:
                    in_sync = False
                    notes.append(f"run {entry['run']}: final parameters differ between workers "
                                 f"(sums {[ranks[r]['final_params']['sum'] for r in sorted(ranks)]})")
                for r, v in sorted(ranks.items()):
                    first, last = _mean(v["first_losses"]), _mean(v["last_losses"])
                    first_means.append(first)
                    last_means.append(last)
                    if not all(math.isfinite(x) for x in v["first_losses"] + v["last_losses"]) or not last < LOSS_DROP * first:
                        loss_falls = False
                        notes.append(f"run {entry['run']} rank {r}: loss {first:.4g} -> {last:.4g}")
            check: dict[str, Any] = {
                "in_sync": in_sync, "loss_falls": loss_falls,
                "first_probe_mean_loss": _mean(first_means), "last_probe_mean_loss": _mean(last_means),
                "steps_per_run": rounds[0]["ranks"][min(rounds[0]["ranks"])]["steps_taken"] if rounds else None,
            }
            if col != DDP:
                diffs, first_step = [], []
                for entry, ref in zip(rounds, ddp_runs.get(mid, [])):
                    a, b = entry["ranks"][min(entry["ranks"])]["first_losses"], ref["ranks"][min(ref["ranks"])]["first_losses"]
                    diffs.append(loss_trajectory(a, b))
                    first_step.append(abs(a[0] - b[0]) if a and b else float("inf"))
                if diffs:
                    check["first_loss_abs_diff_vs_ddp"] = max(first_step)
                    check["probe_loss_max_abs_diff_vs_ddp"] = max(diffs)
                    check["matches_ddp"] = max(first_step) <= FIRST_LOSS_TOL and max(diffs) <= TRAJECTORY_TOL
                    if not check["matches_ddp"]:
                        notes.append(f"losses differ from DDP's: step 1 by {max(first_step):.3g}, "
                                     f"probe steps by up to {max(diffs):.3g}")
                else:
                    check["matches_ddp"] = None  # DDP did not run
            check["ok"] = in_sync and loss_falls and check.get("matches_ddp") is not False
            check["notes"] = notes
            out.setdefault(col, {})[mid] = check
    return out


def _quartiles(values: Sequence[float]) -> list[float]:
    if len(values) < 2:
        return list(values) * 2
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def summary_rows(results: Results, models: Sequence[ModelSpec], columns: Sequence[str],
                 checks: dict[str, dict[str, dict[str, Any]]], repeats: int,
                 cpu: dict[str, dict[str, list[float]]] | None = None) -> list[dict[str, Any]]:
    """One row per model and column (``cpu``: per column and model, the cluster's CPU seconds per step
    of each sample)."""
    rows = []
    for spec in models:
        ddp_t = results.median(DDP, spec.id)
        for col in columns:
            t = results.median(col, spec.id)
            by_round = results.round_medians(col, spec.id, repeats)
            paired = results.paired_ratios(col, spec.id) if col != DDP else []
            check = checks.get(col, {}).get(spec.id)
            rows.append({
                "model": spec.id, "name": spec.name, "column": col, "median_s": t,
                "steps_per_s": 1.0 / t if t else None,
                "samples_per_s": WORKERS * spec.batch / t if t else None,
                "steps_per_s_by_round": [1.0 / x for x in by_round],
                "pskv_over_ddp": statistics.median(paired) if paired else None,
                "pskv_over_ddp_iqr": _quartiles(paired) if paired else [],
                "pskv_over_ddp_by_round": [statistics.median(paired[i:i + repeats])
                                           for i in range(0, len(paired), repeats)],
                "pskv_over_ddp_paired": paired,
                "ratio_of_medians": (ddp_t / t if ddp_t and t else None) if col != DDP else None,
                "checks_ok": None if check is None else check["ok"],
                "cluster_cpu_ms_per_step": (1e3 * statistics.median(cpu[col][spec.id])
                                            if cpu and cpu.get(col, {}).get(spec.id) else None),
            })
    return rows


def evaluate_targets(rows: Sequence[dict[str, Any]], servers: Sequence[int]) -> list[dict[str, Any]]:
    """PASS / MISS per model and server count (pskv steps/s >= TARGET_FACTOR x DDP's); INVALID when a check failed."""
    index = {(r["model"], r["column"]): r for r in rows}
    verdicts = []
    for (mid, col), row in index.items():
        if col == DDP:
            continue
        ddp_ok = index.get((mid, DDP), {}).get("checks_ok")
        ratio = row["pskv_over_ddp"]
        factor = TORCH_TARGET_FACTOR if col.startswith("pskv.torch") else TARGET_FACTOR
        if col.startswith(TORCH_APIS["cross_barrier"]):
            factor = CROSS_BARRIER_TARGET_FACTOR
        if row["checks_ok"] is False or ddp_ok is False:
            status = "INVALID"
        elif ratio is None:
            status = "n/a"
        else:
            status = "PASS" if ratio >= factor else "MISS"
        verdicts.append({"model": mid, "column": col, "servers": int(col.split("=")[1]), "factor": factor,
                         "text": f"{row['name']}, {col}: steps/s >= {factor}x DDP", "ratio": ratio,
                         "ratio_iqr": row["pskv_over_ddp_iqr"], "ratio_by_round": row["pskv_over_ddp_by_round"],
                         "ratio_of_medians": row["ratio_of_medians"], "status": status})
    order = {s: i for i, s in enumerate(servers)}
    return sorted(verdicts, key=lambda v: (list(MODELS).index(v["model"]), order.get(v["servers"], 99)))


# -- reporting ------------------------------------------------------------------------------
def _steps_range(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    if max(values) < 10:  # ResNet-18's ~1 step/s: whole numbers would say nothing
        return f"{_fmt(min(values))}-{_fmt(max(values))}" if len(values) > 1 else _fmt(values[0])
    return f"{min(values):.0f}-{max(values):.0f}" if len(values) > 1 else f"{values[0]:.0f}"


def markdown_table(rows: Sequence[dict[str, Any]], params: dict[str, int]) -> str:
    """The result table as markdown."""
    lines = ["| model | params | system | steps/s | per round | samples/s | ms/step | CPU ms/step | pskv/DDP | IQR | "
             "by round | checks |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    last = None
    for r in rows:
        head = f"| {r['name']} | {params.get(r['model'], 0):,} |" if r["model"] != last else "| | |"
        last = r["model"]
        checks = {None: "n/a", True: "ok", False: "FAILED"}[r["checks_ok"]]
        ms = _fmt(r["median_s"], 1e3) if r["median_s"] else "n/a"
        pskv = r["column"] != DDP
        ratio = _x(r["pskv_over_ddp"]) if pskv else "-"
        iqr = (f"{r['pskv_over_ddp_iqr'][0]:.2f}-{r['pskv_over_ddp_iqr'][1]:.2f}x"
               if pskv and r["pskv_over_ddp_iqr"] else ("n/a" if pskv else "-"))
        spread = _spread(r["pskv_over_ddp_by_round"]) if pskv else "-"
        cpu = _fmt(r.get("cluster_cpu_ms_per_step"))
        lines.append(f"{head} {r['column']} | {_fmt(r['steps_per_s'])} | {_steps_range(r['steps_per_s_by_round'])} | "
                     f"{_fmt(r['samples_per_s'])} | {ms} | {cpu} | {ratio} | {iqr} | {spread} | {checks} |")
    return "\n".join(lines)


def check_lines(checks: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One line per column and model."""
    out = []
    for col, models in checks.items():
        for mid, c in models.items():
            vs = ""
            if "probe_loss_max_abs_diff_vs_ddp" in c:
                vs = (f"; vs DDP: step-1 loss diff {c['first_loss_abs_diff_vs_ddp']:.1e}, "
                      f"probe steps max diff {c['probe_loss_max_abs_diff_vs_ddp']:.1e}")
            status = "ok" if c["ok"] else "FAILED"
            out.append(f"  [{status:>6}] {col:10} {mid:9}: params identical on both workers: {c['in_sync']}; "
                       f"loss {c['first_probe_mean_loss']:.3f} -> {c['last_probe_mean_loss']:.3f} "
                       f"over {c['steps_per_run']} steps{vs}")
            out.extend(f"           {n}" for n in c["notes"])
    return "\n".join(out)


def print_report(payload: dict[str, Any], json_path: Path) -> None:
    """Header, table, checks and targets on stdout."""
    env, settings = payload["environment"], payload["settings"]
    print(f"\npskv {env['pskv']} dist_sync vs PyTorch {env['torch']} DDP (Gloo); W={WORKERS} workers on 127.0.0.1, "
          f"1 intra-op thread each; {env['cpu_count']} CPUs, {env['cpu_model']}; {env['date_utc']}")
    print(f"measured: {env['pskv_measured']} (commit {env['git_commit']})")
    print(f"{STEP_DEFINITION}. samples per worker per step {settings['batch_per_worker']}; SGD momentum 0.9. "
          f"Lockstep: one cluster at a time, samples alternating; median of {settings['rounds']} rounds x "
          f"{settings['repeats_per_round']} samples per cluster, 'per round' = range of the round medians; "
          f"pskv/DDP = median over sample slots of DDP's time / pskv's (paired: the two samples ran back to back; "
          f"> 1: pskv faster), with its IQR and per-round medians.\n")
    print(markdown_table(payload["summary"], {m["id"]: m["params"] for m in payload["models"] if m.get("params")}))
    print("\nChecks (training happens, identically on both workers and as in DDP):\n" + check_lines(payload["checks"]))
    print("\nTargets:")
    for v in payload["targets"]:
        iqr = f"IQR {v['ratio_iqr'][0]:.2f}-{v['ratio_iqr'][1]:.2f}x, " if v["ratio_iqr"] else ""
        print(f"  [{v['status']:>7}] {v['text']}: {_x(v['ratio'])} ({iqr}by round {_spread(v['ratio_by_round'])}, "
              f"ratio of medians {_x(v['ratio_of_medians'])})")
    for col, err in payload["errors"].items():
        print(f"\n{col} FAILED: {err.splitlines()[0]} (details in the JSON)")
    print(f"\nraw samples and environment: {json_path} (whole run {settings['wall_s']:.0f} s)")


# -- driver ---------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="end-to-end training steps/s: pskv dist_sync (S=1, 2) vs PyTorch DDP (Gloo), "
                                            "W=2 workers on 127.0.0.1", epilog=STEP_DEFINITION + ".")
    p.add_argument("--quick", action="store_true", help="1 round of 2 samples of a few steps: a smoke run (~40 s)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"result file (default {DEFAULT_JSON.relative_to(REPO_DIR)})")
    p.add_argument("--models", default=",".join(MODELS), help=f"models to train, comma-separated (default {','.join(MODELS)})")
    p.add_argument("--servers", default="1,2", help="pskv server counts, comma-separated (default 1,2)")
    p.add_argument("--torch-apis", default=",".join(TORCH_APIS),
                   help="pskv.torch clusters to run too (1 server each), comma-separated from "
                        f"{', '.join(TORCH_APIS)}; '' for none (default all)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of samples (default 4, quick 1); the per-round medians give the reported ranges")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed samples per model and cluster per round (default 5, quick 2)")
    p.add_argument("--pskv-commit", default=None, metavar="REV",
                   help="measure pskv/ as committed in REV (git archive to a temporary directory) instead of the checkout")
    p.add_argument("--cluster-timeout", type=float, default=120.0,
                   help="seconds one phase (prep, one sample, final) of a cluster may take (default 120)")
    p.add_argument("--profile", type=Path, default=None,
                   help="record every server and worker with py-spy (raw collapsed stacks, all threads) into this directory")
    p.add_argument("--profile-idle", action="store_true",
                   help="with --profile: record waiting threads too (py-spy --idle), to see where wall time goes")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' log directory (path printed)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 4)
    args.repeats = args.repeats or (2 if args.quick else 5)
    try:
        args.server_counts = sorted({int(s) for s in args.servers.split(",") if s.strip()})
    except ValueError:
        p.error("--servers takes comma-separated integers")
    if not args.server_counts or min(args.server_counts) < 1:
        p.error("--servers needs counts >= 1")
    args.torch_apis = [a.strip() for a in args.torch_apis.split(",") if a.strip()]
    if set(args.torch_apis) - set(TORCH_APIS):
        p.error(f"--torch-apis: unknown {sorted(set(args.torch_apis) - set(TORCH_APIS))}; known: {', '.join(TORCH_APIS)}")
    args.model_ids = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(args.model_ids) - set(MODELS)
    if unknown or not args.model_ids:
        p.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    return args


def model_specs(args: argparse.Namespace) -> tuple[list[ModelSpec], list[dict[str, Any]]]:
    """The models to run and the per-model part of the workers' spec (steps per sample, warm-up)."""
    specs = [MODELS[m] for m in MODELS if m in args.model_ids]
    work = []
    for s in specs:
        iters, warmup = (max(2, s.iters // 10), max(1, s.warmup // 5)) if args.quick else (s.iters, s.warmup)
        work.append({"id": s.id, "iters": iters, "warmup": warmup, "probe": s.probe})
    return specs, work


def main(argv: Sequence[str] | None = None) -> int:
    """Start the clusters, run every phase, check, print the report, write the JSON."""
    args = parse_args(argv)
    install_sigterm_handler()
    log = stderr_logger()
    specs, work = model_specs(args)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    env = environment({})  # before measuring: the commit and code that are measured
    tmp = Path(tempfile.mkdtemp(prefix="pskv-bench-train-"))
    pskv_src = REPO_DIR
    if args.pskv_commit is not None:
        try:
            pskv_src, commit = export_pskv(args.pskv_commit, tmp / "pskv-src")
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"--pskv-commit {args.pskv_commit}: {exc}")
            shutil.rmtree(tmp, ignore_errors=True)
            return 2
        log(f"measuring pskv/ as committed in {commit[:12]} (exported to {pskv_src})")
        env.update({"git_commit": commit[:7], "git_commit_full": commit, "pskv_sources_modified": False,
                    "pskv_measured": f"pskv/ of commit {commit} (--pskv-commit {args.pskv_commit})"})
    else:
        env["pskv_measured"] = "pskv/ of this checkout" + (" with uncommitted changes" if env["pskv_sources_modified"] else "")
    runner = Runner(args, work, tmp, pskv_src, log)
    if args.profile is not None and runner.py_spy is None:
        log("--profile: py-spy not found (pip install py-spy); running without it")
    columns = ([column("pskv", s) for s in args.server_counts] + [column(f"torch-{a}", 1) for a in args.torch_apis]
               + [DDP])
    results = Results()
    try:
        wall = runner.run()
    finally:
        runner.close()
        if args.keep_logs:
            log(f"process logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for cluster in runner.clusters:
        results.add(cluster, args.repeats)
    checks = run_checks(results, columns)
    rows = summary_rows(results, specs, columns, checks, args.repeats, runner.cpu)
    params: dict[str, int] = {}
    for per_model in results.runs.values():
        for mid, rounds in per_model.items():
            params.setdefault(mid, int(next(iter(rounds[0]["ranks"].values()))["params"]))
    payload: dict[str, Any] = {
        "schema": "pskv-bench-train/1",
        "definitions": {
            "step": STEP_DEFINITION,
            "sample": "a barrier across the cluster's workers, then iters steps; per worker (time / iters); the job's "
                      "sample time is the slower worker's",
            "reported_time": "median over all samples of the job's time per step; per round: median of the round's "
                             "repeats samples",
            "cluster_cpu": "per sample, CPU seconds (user + system) used by all the cluster's processes (scheduler, "
                           "servers, workers, from /proc) from 'go' to the last 'done', / iters; reported: the median; "
                           "on a shared machine a much less load-dependent measure of the work a step costs than wall time",
            "split": "per worker (runs.*.ranks.*.split): mean ms per timed step of forward, backward and the rest "
                     "(pskv: trainer.step(); DDP: opt.step()), wall and the main thread's CPU time, and the "
                     "process's CPU time",
            "pskv_over_ddp": "median over sample slots k of DDP's sample k time / pskv's sample k time (the two ran "
                             "back to back: a paired throughput ratio; > 1: pskv faster); IQR and per-round medians "
                             "of the same paired ratios; ratio_of_medians = DDP's median / pskv's median",
            "pskv": "DataParallelExecutorGroup(model, ['cpu'], loss=CrossEntropyLoss()) + Trainer(group, 'sgd', "
                    "{learning_rate, momentum}, kvstore=dist_sync store): gradients pushed in buckets during backward "
                    "(non-blocking pushpull), SGD on the servers, new weights pulled back before step() returns",
            "torch-optimizer": "pskv.torch.broadcast_parameters + DistributedOptimizer(torch.optim.SGD(lr, momentum), "
                               "named_parameters) on the dist_sync store (1 server): gradients to the servers during "
                               "backward, averaged; step() waits and applies locally",
            "torch-ddp": "pskv.torch.DistributedDataParallel(model) on the dist_sync store (1 server), "
                         "torch.optim.SGD(lr, momentum): gradients averaged during backward, a local step",
            "ddp": "DistributedDataParallel(model) on Gloo (default buckets), torch.optim.SGD(lr, momentum), "
                   "CrossEntropyLoss(); zero_grad, forward, loss, backward, step",
            "checks": f"in_sync: both workers' final parameters bit-identical; loss_falls: last probe (the model's "
                      f"probe_steps) steps' mean loss < {LOSS_DROP} x the first ones'; matches_ddp: rank 0's first probe "
                      f"losses vs DDP's: step 1 within {FIRST_LOSS_TOL}, all within {TRAJECTORY_TOL}",
        },
        "settings": {"quick": args.quick, "rounds": args.rounds, "repeats_per_round": args.repeats,
                     "samples_per_model_and_cluster": args.rounds * args.repeats,
                     "workers": WORKERS, "servers": args.server_counts, "batch_per_worker": {s.id: s.batch for s in specs},
                     "probe_steps": {s.id: s.probe for s in specs}, "torch_threads_per_worker": 1, "columns": columns,
                     "protocol": "lockstep: all clusters up at once, one run token; sample k of a model goes to the "
                                 "clusters in the column order rotated by k; a round = repeats consecutive samples",
                     "profile": str(args.profile) if args.profile else None, "wall_s": round(wall, 1)},
        "environment": {**env, "load_average_at_end": _load_average(), "torch": _version("torch"),
                        "scikit_learn": _version("scikit-learn"),
                        "pskv_worker": results.environments.get("pskv"), "ddp_worker": results.environments.get("ddp")},
        "models": [{**asdict(s), **w, "params": params.get(s.id)} for s, w in zip(specs, work)],
        "clusters": [{"column": c.column, "label": c.label, "ok": c.error is None} for c in runner.clusters],
        "errors": results.errors,
        "checks": checks,
        "runs": results.runs,
        "results": results.json(args.repeats),
        "cluster_cpu_s_per_step": runner.cpu,
        "summary": rows,
        "targets": evaluate_targets(rows, args.server_counts),
    }
    write_json(args.json, payload)
    print_report(payload, args.json)
    broken = bool(results.errors) or any(not c["ok"] for m in checks.values() for c in m.values())
    return 1 if broken else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every child has been reaped on the way out
        print("\nbench_train: interrupted; all cluster processes stopped", file=sys.stderr)
        sys.exit(130)
