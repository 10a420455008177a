"""Issue 13: a DLRM-style model with a large embedding table on 2 workers, pskv vs torch DDP.

The model: a bottom MLP (13 dense features -> 64 -> D), one ``EmbeddingBag`` (sum of 8
Zipf-distributed ids per sample) of R x D float32, the two concatenated into a top MLP
(2D -> 64 -> 1), ``BCEWithLogitsLoss``; 256 samples per worker per step, SGD (lr 0.05).

* **pskv**: ``pskv launch -n 2 -s 2``, ``dist_sync``; the table is a
  ``pskv.parallel.EmbeddingBag`` drawn on the two servers (``TableInit``, uniform); the
  worker's forward ``row_sparse_pull``\\ s the batch's unique rows, its backward pushes
  their gradient; a ``pskv.parallel.Trainer`` (update_on_kvstore) pushes the MLP's dense
  gradients; the servers run SGD (lazy on the table's rows).
* **DDP**: ``torch.nn.parallel.DistributedDataParallel`` on Gloo, 2 processes, a dense
  ``torch.nn.EmbeddingBag`` of the same size with ``sparse=False`` (and ``sparse=True``:
  sparse gradients, all-gathered by Gloo), ``torch.optim.SGD`` in each process.

Every worker runs ``torch.set_num_threads(1)``. The systems run one after the other (never
at the same time), pskv then DDP, size by size. A sample: a barrier, then ``iters``
steps; a job's sample is the slower worker's. Reported per size and system: steps/s (1 /
median step time over the samples; range: slowest and fastest sample), the bytes a worker
sends + receives per step (pskv: counted from the table's row counters and the dense
parameter bytes; DDP: Gloo's all-reduce volume of the gradient buffer, 2 x its bytes for 2
workers — the store has no byte counters, see below), each worker's peak RSS (VmHWM)
and the servers' summed RSS (polled). Targets (issue 13): pskv's step time within 10 %
from 1M to the largest table; pskv >= 5x DDP's steps/s at the largest table DDP ran.

Run ``python bench/bench_sparse.py`` (full, ~5 min on 2 cores; 100M rows x 16 needs ``--memory-limit-gib 12.5``,
see docs/benchmarks.md) or ``--quick`` (~1 min).
The worker halves are this file run as ``bench_sparse.py _pskv ARGS`` / ``_ddp ARGS``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DENSE_IN, HIDDEN, IDS_PER_SAMPLE, LR, ZIPF_A = 13, 64, 8, 0.05, 1.1
MIX = 2654435761  # odd and not a multiple of 5: i -> i * MIX mod R permutes 10^k rows (hot rows spread over servers)
MEMORY_LIMIT = 12 << 30  # all processes of a job together; a job above it is stopped (--memory-limit-gib)
TABLE_INIT = {"type": "uniform", "low": -0.05, "high": 0.05, "seed": 1}  # both systems start from this table


# -- the worker side (both systems) ---------------------------------------------------------
def _data(rank: int, rows: int, batch: int, count: int, seed: int = 0) -> list[tuple[Any, Any, Any]]:
    import numpy as np
    import torch
    rng = np.random.default_rng([seed, rank])
    out = []
    for _ in range(count):
        z = rng.zipf(ZIPF_A, size=(batch, IDS_PER_SAMPLE)).astype(np.uint64) - np.uint64(1)
        ids = ((z % np.uint64(rows)) * np.uint64(MIX) % np.uint64(rows)).astype(np.int64)
        x = rng.standard_normal((batch, DENSE_IN)).astype(np.float32)
        y = ((x[:, 0] + (ids[:, 0] % 3 == 0)) > 0.5).astype(np.float32)
        out.append((torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(y)))
    return out


def _model(emb: Any, dim: int) -> Any:
    import torch

    class DLRM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE_IN, HIDDEN), torch.nn.ReLU(),
                                              torch.nn.Linear(HIDDEN, dim), torch.nn.ReLU())
            self.emb = emb
            self.top = torch.nn.Sequential(torch.nn.Linear(2 * dim, HIDDEN), torch.nn.ReLU(),
                                           torch.nn.Linear(HIDDEN, 1))

        def forward(self, x: Any, ids: Any) -> Any:
            return self.top(torch.cat([self.bottom(x), self.emb(ids)], dim=1)).squeeze(1)

    return DLRM()


def _hwm_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def _timed(step: Any, barrier: Any, warmup: int, samples: int, iters: int) -> tuple[list[float], list[float]]:
    losses = [step() for _ in range(warmup)]
    times = []
    for _ in range(samples):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            losses.append(step())
        times.append((time.perf_counter() - t0) / iters)
    return times, losses


def pskv_worker(args: argparse.Namespace) -> None:
    import torch
    sys.path.insert(0, str(REPO))
    import pskv
    from pskv.parallel import EmbeddingBag, Trainer
    torch.set_num_threads(1)
    kv = pskv.create("dist_sync")
    t0 = time.perf_counter()
    emb = EmbeddingBag(args.rows, args.dim, kv, "table", mode="sum", init=TABLE_INIT)
    init_s = time.perf_counter() - t0
    model = _model(emb, args.dim)
    trainer = Trainer(model, "sgd", {"learning_rate": LR}, kvstore=kv)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")  # the trainer divides by batch x workers
    data = _data(kv.rank, args.rows, args.batch, 32)
    dense = sum(p.numel() for p in model.parameters())
    state = {"i": 0}

    def step() -> float:
        x, ids, y = data[state["i"] % len(data)]
        state["i"] += 1
        model.zero_grad(set_to_none=False)  # the Trainer does not zero the dense gradients
        loss = loss_fn(model(x, ids), y)
        loss.backward()
        trainer.step(args.batch)
        return float(loss) / args.batch

    before = dict(emb.table.stats)
    steps_before = state["i"]
    times, losses = _timed(step, kv.barrier, args.warmup, args.samples, args.iters)
    stats = {k: v - before[k] for k, v in emb.table.stats.items()}
    n = state["i"] - steps_before
    row = 8 + 4 * args.dim  # an id and a row
    rows_pulled, rows_pushed = stats["rows_pulled"] / n, stats["rows_pushed"] / n
    table_bytes = rows_pulled * (8 + row) + rows_pushed * row  # pull: ids out, ids + rows back; push: ids + rows out
    print(json.dumps({"rank": kv.rank, "times": times, "losses": losses, "init_s": init_s,
                      "rows_pulled": rows_pulled, "rows_pushed": rows_pushed, "dense_params": dense,
                      "bytes_table": table_bytes, "bytes_dense": 2 * 4 * dense, "hwm_kib": _hwm_kib()}), flush=True)
    trainer.close()
    kv.close()


def ddp_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    sys.path.insert(0, str(REPO))
    import pskv
    t0 = time.perf_counter()
    emb = torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=args.sparse, _weight=torch.from_numpy(
        pskv.TableInit((args.rows, args.dim), "float32", TABLE_INIT).todense()))  # pskv's servers' table
    init_s = time.perf_counter() - t0
    model = torch.nn.parallel.DistributedDataParallel(_model(emb, args.dim))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()  # mean; DDP averages over the 2 workers
    data = _data(rank, args.rows, args.batch, 32)
    state = {"i": 0, "nnz": 0}

    def step() -> float:
        x, ids, y = data[state["i"] % len(data)]
        state["i"] += 1
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x, ids), y)
        loss.backward()
        if args.sparse:
            state["nnz"] += emb.weight.grad.coalesce()._nnz()
        opt.step()
        return float(loss)

    times, losses = _timed(step, dist.barrier, args.warmup, args.samples, args.iters)
    dense = sum(p.numel() for p in model.parameters()) - args.rows * args.dim
    if args.sparse:  # Gloo all-gathers each rank's coalesced (ids, rows): a worker sends its own, receives the other's
        table_bytes = 2 * state["nnz"] / state["i"] * (8 + 4 * args.dim)
    else:  # ring all-reduce of W=2: each worker sends and receives the buffer's bytes once
        table_bytes = 2 * 4 * args.rows * args.dim
    print(json.dumps({"rank": rank, "times": times, "losses": losses, "init_s": init_s, "dense_params": dense,
                      "bytes_table": table_bytes, "bytes_dense": 2 * 4 * dense, "hwm_kib": _hwm_kib()}), flush=True)
    dist.destroy_process_group()


# -- the driver side -------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class _Job:
    """Run one job (a process tree) with a deadline, polling its memory (stopped above MEMORY_LIMIT)."""

    def __init__(self, argvs: list[list[str]], envs: list[dict[str, str]], timeout: float) -> None:
        self.procs = [subprocess.Popen(a, env=e, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True) for a, e in zip(argvs, envs)]
        self.peak_total, self.peak_servers, self.over = 0, 0, False
        self.limit = MEMORY_LIMIT
        self._stop = threading.Event()
        self._timeout = timeout
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            pids = [p.pid for p in self.procs]
            pids += [d for p in list(pids) for d in _descendants(p)]
            total = sum(_rss(p) for p in pids)
            servers = sum(_rss(p) for p in pids if " server" in _cmdline(p))
            self.peak_total, self.peak_servers = max(self.peak_total, total), max(self.peak_servers, servers)
            if total > self.limit:
                self.over = True
                self.kill()
            self._stop.wait(0.5)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass

    def wait(self) -> list[tuple[int, str, str]]:
        deadline = time.monotonic() + self._timeout
        out = []
        try:
            for p in self.procs:
                try:
                    o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.kill()
                    o, e = p.communicate()
                    e += f"\n[bench_sparse: killed after {self._timeout:.0f} s]"
                out.append((p.returncode, o, e))
        finally:
            self._stop.set()
            self.kill()
        return out


def _json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        body = line.split("] ", 1)[1] if line.startswith("[worker") else line
        if body.startswith("{"):
            found.append(json.loads(body))
    return found


def _worker_args(rows: int, args: argparse.Namespace) -> list[str]:
    return ["--rows", str(rows), "--dim", str(args.dim), "--batch", str(args.batch), "--warmup", str(args.warmup),
            "--samples", str(args.samples), "--iters", str(args.iters)]


def run_pskv(rows: int, args: argparse.Namespace) -> dict[str, Any]:
    # a server drawing a 50M-row range misses heartbeats for > 10 s (the default timeout): 120 s here
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PS_HEARTBEAT_TIMEOUT": "120",
           "PSKV_MAX_TABLE_BYTES": str(max(1 << 34, rows * args.dim * 4))}
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "3",
            "--timeout", str(int(args.job_timeout)), "--", sys.executable, str(Path(__file__).resolve()), "_pskv",
            *_worker_args(rows, args)]
    job = _Job([argv], [env], args.job_timeout + 20)
    job.limit = int(args.memory_limit_gib * 2**30)
    [(rc, out, err)] = job.wait()
    return _result("pskv", rows, rc, _json_lines(out + err), out + err, job)


def run_ddp(rows: int, sparse: bool, args: argparse.Namespace) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, str(Path(__file__).resolve()), "_ddp", *_worker_args(rows, args)] + (
        ["--sparse"] if sparse else [])
    envs = [{**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": "2",
             "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"} for r in range(2)]
    job = _Job([argv, argv], envs, args.job_timeout)
    job.limit = int(args.memory_limit_gib * 2**30)
    results = job.wait()
    text = "".join(o + e for _, o, e in results)
    rc = max(abs(r) for r, _, _ in results)
    return _result("ddp_sparse" if sparse else "ddp_dense", rows, rc, _json_lines(text), text, job)


def _result(system: str, rows: int, rc: int, ranks: list[dict[str, Any]], text: str, job: _Job) -> dict[str, Any]:
    res: dict[str, Any] = {"system": system, "rows": rows, "rc": rc, "peak_rss_job": job.peak_total,
                           "peak_rss_servers": job.peak_servers, "over_memory_limit": job.over}
    if rc != 0 or len(ranks) != 2:
        res["error"] = text[-2500:]
        return res
    ranks.sort(key=lambda r: r["rank"])
    job_times = [max(a, b) for a, b in zip(ranks[0]["times"], ranks[1]["times"])]
    med = statistics.median(job_times)
    res.update({"ranks": ranks, "job_times": job_times, "median_s": med, "steps_per_s": 1 / med,
                "range_steps_per_s": [1 / max(job_times), 1 / min(job_times)],
                "bytes_per_step": statistics.mean(r["bytes_table"] + r["bytes_dense"] for r in ranks),
                "bytes_table": statistics.mean(r["bytes_table"] for r in ranks),
                "worker_hwm_mib": max(r["hwm_kib"] for r in ranks) / 1024, "init_s": max(r["init_s"] for r in ranks),
                "loss_first": statistics.mean(statistics.mean(r["losses"][:10]) for r in ranks),
                "loss_last": statistics.mean(statistics.mean(r["losses"][-10:]) for r in ranks)})
    if system == "pskv":
        res["rows_pulled"] = statistics.mean(r["rows_pulled"] for r in ranks)
    return res


def pooled(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, rows): the samples of all its runs (passes) pooled, each pass's median kept."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["system"], r["rows"]), []).append(r)
    out = []
    for (system, rows), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append({**rs[0], "passes": len(rs)})
            continue
        times = [t for r in ok for t in r["job_times"]]
        med = statistics.median(times)
        out.append({"system": system, "rows": rows, "passes": len(rs), "failed_passes": len(rs) - len(ok),
                     "median_s": med, "steps_per_s": 1 / med, "pass_steps_per_s": [r["steps_per_s"] for r in ok],
                     "range_steps_per_s": [1 / max(times), 1 / min(times)],
                     "bytes_per_step": statistics.mean(r["bytes_per_step"] for r in ok),
                     "worker_hwm_mib": max(r["worker_hwm_mib"] for r in ok),
                     "peak_rss_servers": max(r["peak_rss_servers"] for r in ok),
                     "peak_rss_job": max(r["peak_rss_job"] for r in ok), "init_s": max(r["init_s"] for r in ok),
                     "over_memory_limit": any(r["over_memory_limit"] for r in rs)})
    return out


def _fmt_bytes(b: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def _rows_name(rows: int) -> str:
    return f"{rows // 1_000_000}M" if rows >= 1_000_000 and rows % 1_000_000 == 0 else f"{rows // 1000}k"


def table(results: list[dict[str, Any]], dim: int) -> list[str]:
    lines = [f"| rows x {dim} | system | steps/s (range) | per pass | step ms | bytes/step/worker | "
             "worker peak RSS | servers' RSS | vs DDP dense |", "|---|---|---|---|---|---|---|---|---|"]
    dense = {r["rows"]: r for r in results if r["system"] == "ddp_dense" and "error" not in r}
    for r in results:
        name = f"{_rows_name(r['rows'])} ({_fmt_bytes(4 * r['rows'] * dim)})"
        if "error" in r:
            why = "over the memory limit" if r["over_memory_limit"] else f"failed (rc {r['rc']})"
            lines.append(f"| {name} | {r['system']} | {why} | | | | | | |")
            continue
        lo, hi = r["range_steps_per_s"]
        vs = f"{r['steps_per_s'] / dense[r['rows']]['steps_per_s']:.1f}x" if r["rows"] in dense else ""
        servers = _fmt_bytes(r["peak_rss_servers"]) if r["system"] == "pskv" else ""
        passes = ", ".join(f"{v:.1f}" for v in r["pass_steps_per_s"])
        lines.append(f"| {name} | {r['system']} | {r['steps_per_s']:.1f} ({lo:.1f}-{hi:.1f}) | {passes} | "
                     f"{1000 * r['median_s']:.1f} | {_fmt_bytes(r['bytes_per_step'])} | "
                     f"{r['worker_hwm_mib']:.0f} MiB | {servers} | {vs} |")
    return lines


def same_training(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size: the largest difference between pskv's and DDP's (dense) losses of the first 10 steps (rank 0):
    the same model, table, data and SGD, so they compute the same training up to float rounding."""
    out: dict[str, Any] = {}
    ddp = {r["rows"]: r for r in runs if r["system"] == "ddp_dense" and "error" not in r}
    for r in runs:
        if r["system"] == "pskv" and "error" not in r and r["rows"] in ddp and str(r["rows"]) not in out:
            diff = max(abs(a - b) for a, b in zip(r["ranks"][0]["losses"][:10], ddp[r["rows"]]["ranks"][0]["losses"][:10]))
            out[str(r["rows"])] = {"max_abs_loss_diff_first_10": diff, "pass": diff < 1e-3}
    return out


def targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if "error" not in r]
    pskv = {r["rows"]: r for r in ok if r["system"] == "pskv"}
    dense = {r["rows"]: r for r in ok if r["system"] == "ddp_dense"}
    out: dict[str, Any] = {}
    big = [n for n in pskv if n >= 1_000_000]
    if 1_000_000 in pskv and len(big) > 1:
        top = max(big)
        growth = pskv[top]["median_s"] / pskv[1_000_000]["median_s"] - 1
        out["flat"] = {"from_rows": 1_000_000, "to_rows": top, "growth": growth, "pass": growth <= 0.10}
    common = sorted(set(pskv) & set(dense))
    if common:
        top = common[-1]
        ratio = pskv[top]["steps_per_s"] / dense[top]["steps_per_s"]
        out["vs_ddp"] = {"rows": top, "ratio": ratio, "pass": ratio >= 5.0}
    return out


def _commit() -> tuple[str, bool]:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "pskv"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip())
    return rev or "unknown", dirty


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("_pskv", "_ddp"):
        p = argparse.ArgumentParser()
        for name in ("rows", "dim", "batch", "warmup", "samples", "iters"):
            p.add_argument(f"--{name}", type=int, required=True)
        p.add_argument("--sparse", action="store_true")
        wargs = p.parse_args(argv[1:])
        (pskv_worker if argv[0] == "_pskv" else ddp_worker)(wargs)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few steps (~1 min): checks that everything runs")
    p.add_argument("--ddp-rows", default=None, help="table rows for pskv and DDP (default 100000,1000000,4000000,10000000)")
    p.add_argument("--pskv-rows", default=None,
                   help="further rows for pskv alone (default 30000000,100000000)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--no-ddp-sparse", action="store_true", help="leave out DDP with sparse=True")
    p.add_argument("--passes", type=int, default=None,
                   help="passes over the pskv sizes, the later ones in reverse order (default 2; quick 1)")
    p.add_argument("--job-timeout", type=float, default=300.0)
    p.add_argument("--memory-limit-gib", type=float, default=MEMORY_LIMIT / 2**30,
                   help="a job whose processes' RSS sum passes it is stopped (default 12)")
    p.add_argument("--json", default=None, help="result file (default bench/results/sparse_<commit>[_quick].json)")
    args = p.parse_args(argv)
    ddp_rows = [int(x) for x in (args.ddp_rows or ("100000,1000000" if args.quick else "100000,1000000,4000000,10000000")).split(",") if x]
    pskv_rows = [int(x) for x in (args.pskv_rows or ("" if args.quick else "30000000,100000000")).split(",") if x]
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.samples = args.samples if args.samples is not None else (3 if args.quick else 5)
    args.iters = args.iters if args.iters is not None else (3 if args.quick else 10)
    args.passes = args.passes if args.passes is not None else (1 if args.quick else 2)
    for rows in pskv_rows:  # the servers' memory: the table, its present-row ids (int64), the drawing's slack
        need = rows * (4 * args.dim + 8)
        if need > args.memory_limit_gib * 2**30 - (2 << 30):
            print(f"skipping {rows} rows: the servers would need ~{need / 2**30:.1f} GiB", file=sys.stderr)
    pskv_rows = [r for r in pskv_rows if r * (4 * args.dim + 8) <= args.memory_limit_gib * 2**30 - (2 << 30)]
    commit, dirty = _commit()
    load = [os.getloadavg()]
    started = time.perf_counter()
    results = []
    plan = [(r, s) for r in ddp_rows for s in ("pskv", "ddp_dense", "ddp_sparse")] + [(r, "pskv") for r in pskv_rows]
    every = sorted(set(ddp_rows) | set(pskv_rows))
    for k in range(1, args.passes):  # pskv again, sizes in the other order: a load drift does not favour one end
        plan += [(r, "pskv") for r in (every[::-1] if k % 2 else every)]
    for rows, system in plan:
        if system == "ddp_sparse" and args.no_ddp_sparse:
            continue
        print(f"{_rows_name(rows)} x {args.dim}: {system} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        res = run_pskv(rows, args) if system == "pskv" else run_ddp(rows, system == "ddp_sparse", args)
        res["wall_s"] = time.perf_counter() - t0
        res["load_average"] = os.getloadavg()
        results.append(res)
        note = res.get("error", "").strip().splitlines()[-1:] if "error" in res else f"{res['steps_per_s']:.1f} steps/s"
        print(f"  -> {note} ({res['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    load.append(os.getloadavg())
    rows_out = pooled(results)
    lines = table(rows_out, args.dim)
    verdicts = targets(rows_out)
    print("\n".join(lines))
    if "flat" in verdicts:
        v = verdicts["flat"]
        print(f"target step time flat 1M -> {_rows_name(v['to_rows'])}: {100 * v['growth']:+.1f} % "
              f"({'PASS' if v['pass'] else 'MISS'}, <= +10 %)")
    if "vs_ddp" in verdicts:
        v = verdicts["vs_ddp"]
        print(f"target >= 5x DDP at {_rows_name(v['rows'])}: {v['ratio']:.1f}x ({'PASS' if v['pass'] else 'MISS'})")
    checks = same_training(results)
    if checks:
        worst = max(v["max_abs_loss_diff_first_10"] for v in checks.values())
        print(f"check: pskv's first 10 losses equal DDP's within {worst:.1e} at every size "
              f"({'PASS' if all(v['pass'] for v in checks.values()) else 'FAIL'}, < 1e-3)")
    print(f"load average before {load[0]}, after {load[1]}; commit {commit}{' (pskv modified)' if dirty else ''}")
    import numpy
    import torch
    payload = {"benchmark": "bench_sparse", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "commit": commit, "pskv_modified": dirty, "argv": argv, "quick": args.quick,
               "settings": {"dim": args.dim, "batch": args.batch, "ids_per_sample": IDS_PER_SAMPLE, "zipf_a": ZIPF_A,
                            "lr": LR, "warmup": args.warmup, "samples": args.samples, "iters": args.iters},
               "runs": results, "results": rows_out, "table": lines, "targets": verdicts, "checks": checks, "load_average": load,
               "wall_s": time.perf_counter() - started,
               "env": {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
                       "cpus": os.cpu_count(), "platform": platform.platform()}}
    path = Path(args.json) if args.json else REPO / "bench" / "results" / f"sparse_{commit}{'_quick' if args.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(payload, f, indent=1)
    os.replace(f.name, path)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
