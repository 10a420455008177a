"""Training between simulated hosts (issue 23): pskv's Trainer and pskv.torch against PyTorch DDP on Gloo.

Usage (needs root: network namespaces, see :mod:`pskv.testing.hosts`)::

    python bench/bench_train_hosts.py [--quick] [--rate 100mbit] [--models mlp_large]
                                      [--systems trainer,optimizer,ddp] [--rounds R] [--repeats N] [--json PATH]

Eight hosts made by ``bench_hosts.py``'s means (:class:`~pskv.testing.hosts.SimulatedHosts`,
every link shaped with ``tc tbf`` both ways): four worker hosts (0-3) and four server
hosts (4-7). The models, data, optimizer, phases and worker programs are those of
``bench/bench_train.py`` (``_train_common.py``); here each job runs alone, through the real
launchers, one after the other:

* **trainer** — pskv's ``Trainer``: ``pskv launch -n 4 -s 4 --launcher ssh -H <hosts 0-3>
  --server-hostfile <hosts 4-7> -- python bench/_train_worker_pskv.py SPEC`` (gradients
  pushed in buckets during backward, SGD on the servers; each bucket as chunk keys of one
  piece per server, so each chunk's new weights come back while the next are pushed:
  :mod:`pskv.parallel.chunks`);
* **optimizer** — ``pskv.torch.DistributedOptimizer`` (Horovod's loop, SGD on the workers),
  the same launch with ``bench/_train_worker_pskv_torch.py`` and ``PSKV_BENCH_API=optimizer``;
  ``cross_barrier`` (BytePS's, SGD on the servers) can be added with ``--systems``;
* **ddp** — ``DistributedDataParallel`` over Gloo: ``bench/_train_worker_ddp.py`` on hosts
  0-3 through the same remote shell (``GLOO_SOCKET_IFNAME=eth0``), as ``bench_hosts.py``
  starts its Gloo ranks.

**Model and link rate.** ``mlp_large`` (784-1024-1024-10, 1.86 M parameters, 7.45 MB of
float32 gradients per step, 32 samples per worker) on 100 Mbit/s links (12.5 MB/s): the
links alone need 0.60 s per step for a parameter server on dedicated hosts (each worker
link carries the gradients out and the weights back, M each way) and 0.89 s for the ring
(1.5 M each way at n = 4), while forward and backward take ~60 ms per worker (measured
with four workers on two cores): the exchange is ~90 % of a DDP step, so the bound on
pskv / DDP is ~1.45x ((0.89 + 0.06) / (0.60 + 0.06)). The same rate as ``bench_hosts.py --setup c``, for the same
reason: two cores drive the eight namespaces' processes and the training at once.

A **step** is forward, backward, exchange and update on all four workers; a sample is
``iters`` steps after a barrier, its time per step the slower worker's; the result is
steps/s = 1 / the median over every sample of every round. Rounds run the systems in
alternating order (forward, then backward). Every job is **checked once**, as
``bench_train.py`` checks: the four workers' final parameters bit-identical, the loss
falling (last probe steps < 0.75 x the first), and pskv's first probe losses equal to
DDP's (same model, data and update). Prints a table with ratios to DDP and the issue's
bar (>= 1.3x DDP with dedicated servers, each pskv API); writes ``--json`` (default
``bench/results/train_hosts_<UTC date>_<RATE>[_quick].json``). A failed check or job gives exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _procs import install_sigterm_handler  # noqa: E402
from _train_common import MODELS, loss_trajectory  # noqa: E402
from bench_hosts import git_commit, link_counters, rate_bits, run_gloo, run_pskv  # noqa: E402
from bench_train import FIRST_LOSS_TOL, LOSS_DROP, TRAJECTORY_TOL  # noqa: E402

from pskv.testing.hosts import SimulatedHosts, Unavailable  # noqa: E402
from pskv.testing.jobs import JobError  # noqa: E402

WORKERS = 4
RATE = "100mbit"
TARGET = 1.3  # issue 23: pskv steps/s >= 1.3x DDP's, dedicated servers, 4 worker hosts
SYSTEMS = {"trainer": "pskv Trainer", "optimizer": "pskv.torch DistributedOptimizer",
           "cross_barrier": "pskv.torch CrossBarrier", "ddp": "DDP (Gloo)"}
DEFAULT_SYSTEMS = ("trainer", "optimizer", "ddp")
STEPS = {"full": (10, 3, 3), "quick": (4, 1, 2)}  # steps per sample, warm-up steps, samples per job


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="training steps/s between simulated hosts: pskv (4 dedicated server "
                                            "hosts) vs PyTorch DDP on Gloo, 4 worker hosts (issue 23)")
    p.add_argument("--quick", action="store_true", help="1 round, 2 samples of 4 steps per job: a smoke run")
    p.add_argument("--rate", default=RATE, help=f"tc tbf rate of every host's link, both ways (default {RATE})")
    p.add_argument("--models", default="mlp_large", help=f"models, comma-separated, of {', '.join(MODELS)} "
                                                         "(default mlp_large)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"systems, comma-separated, of {', '.join(SYSTEMS)} (default {','.join(DEFAULT_SYSTEMS)})")
    p.add_argument("--rounds", type=int, default=None, help="rounds, each runs every system once (default 2, quick 1)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed samples per model per job (default {STEPS['full'][2]}, quick {STEPS['quick'][2]})")
    p.add_argument("--iters", type=int, default=None,
                   help=f"steps per sample (default {STEPS['full'][0]}, quick {STEPS['quick'][0]})")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every pskv process (pskv launch --env; repeatable)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take (default 900)")
    p.add_argument("--json", type=Path, default=None,
                   help="result file (default bench/results/train_hosts_<UTC date>_<RATE>[_quick].json)")
    args = p.parse_args(argv)
    iters, warmup, samples = STEPS["quick" if args.quick else "full"]
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.repeats = args.repeats or samples
    args.iters = args.iters or iters
    args.warmup = warmup
    args.model_ids = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.model_ids or set(args.model_ids) - set(MODELS):
        p.error(f"--models: expected some of {', '.join(MODELS)}, got {args.models!r}")
    args.system_ids = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.system_ids or set(args.system_ids) - set(SYSTEMS):
        p.error(f"--systems: expected some of {', '.join(SYSTEMS)}, got {args.systems!r}")
    if rate_bits(args.rate) is None:
        p.error(f"--rate: not a tc rate: {args.rate!r}")
    return args


def spec_file(path: Path, args: argparse.Namespace) -> Path:
    """The workers' spec (``_train_common.run_models``): per model steps per sample, warm-up, probe steps."""
    models = [{"id": m, "iters": args.iters, "warmup": args.warmup, "probe": MODELS[m].probe} for m in args.model_ids]
    path.write_text(json.dumps({"samples": args.repeats, "models": models}), encoding="utf-8")
    return path


def make_jobs(args: argparse.Namespace, hosts: SimulatedHosts) -> dict[str, Callable[[Path, Path], list[dict[str, Any]]]]:
    """Per system: run one job on the hosts (spec, log directory) -> the workers' JSON by rank."""
    workers, servers = hosts.hosts[:WORKERS], hosts.hosts[WORKERS:]

    def pskv_job(script: str, env: Sequence[str]) -> Callable[[Path, Path], list[dict[str, Any]]]:
        return lambda spec, d: run_pskv(hosts, spec, d, args.timeout, WORKERS, workers, servers,
                                        [*env, *args.env], BENCH_DIR / script)

    return {"trainer": pskv_job("_train_worker_pskv.py", []),
            "optimizer": pskv_job("_train_worker_pskv_torch.py", ["PSKV_BENCH_API=optimizer"]),
            "cross_barrier": pskv_job("_train_worker_pskv_torch.py", ["PSKV_BENCH_API=cross_barrier"]),
            "ddp": lambda spec, d: run_gloo(hosts, spec, d, args.timeout, WORKERS, workers,
                                            BENCH_DIR / "_train_worker_ddp.py")}


def run_rounds(args: argparse.Namespace, hosts: SimulatedHosts, spec: Path, tmp: Path,
               ) -> tuple[dict[str, list[list[dict[str, Any]]]], dict[str, Any], dict[str, str]]:
    """Every round runs every system once (alternating order); per system the jobs' worker JSON, per job its
    wall time and link bytes, and per system the first error (its later jobs are skipped)."""
    jobs = make_jobs(args, hosts)
    runs: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in args.system_ids}
    log: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for rnd in range(args.rounds):
        for system in args.system_ids if rnd % 2 == 0 else reversed(args.system_ids):
            if system in errors:
                continue
            rdir = tmp / f"r{rnd}-{system}"
            rdir.mkdir()
            before, t0 = link_counters(hosts), time.perf_counter()
            try:
                runs[system].append(jobs[system](spec, rdir))
            except (JobError, OSError, ValueError) as exc:
                errors[system] = str(exc)[-3000:]
                print(f"round {rnd} {system}: FAILED: {str(exc)[-600:]}", flush=True)
                continue
            wall = time.perf_counter() - t0
            log[f"r{rnd}-{system}"] = {"wall_s": wall, "link_bytes": [{k: a[k] - b[k] for k in ("tx", "rx")} for a, b
                                                                      in zip(link_counters(hosts), before)]}
            rates = {m: 1 / statistics.median(job_samples(runs[system][-1:], m)) for m in args.model_ids}
            print(f"round {rnd} {system}: {wall:.1f} s, steps/s " + ", ".join(f"{m} {r:.2f}" for m, r in rates.items()),
                  flush=True)
    return runs, log, errors


def job_samples(jobs: Sequence[list[dict[str, Any]]], model: str) -> list[float]:
    """Per sample of every job, the slower worker's seconds per step."""
    return [max(s) for workers in jobs for s in zip(*(w["results"][model]["samples_s"] for w in workers))]


def check_job(workers: Sequence[dict[str, Any]], model: str, ddp: Sequence[dict[str, Any]] | None) -> list[str]:
    """What is wrong with one job's training of ``model`` (empty: nothing): as ``bench_train.run_checks``."""
    res = [w["results"][model] for w in sorted(workers, key=lambda w: int(w["rank"]))]
    problems = []
    if len(res) != WORKERS or len({r["final_params"]["sha256"] for r in res}) != 1:
        problems.append(f"final parameters differ between workers (sums {[r['final_params']['sum'] for r in res]})")
    for rank, r in enumerate(res):
        first, last = statistics.mean(r["first_losses"]), statistics.mean(r["last_losses"])
        if not all(math.isfinite(x) for x in r["first_losses"] + r["last_losses"]) or not last < LOSS_DROP * first:
            problems.append(f"rank {rank}: loss {first:.4g} -> {last:.4g}")
    if ddp:
        theirs = next(w for w in ddp if int(w["rank"]) == 0)["results"][model]["first_losses"]
        first_step = abs(res[0]["first_losses"][0] - theirs[0])
        if first_step > FIRST_LOSS_TOL or loss_trajectory(res[0]["first_losses"], theirs) > TRAJECTORY_TOL:
            problems.append(f"first probe losses differ from DDP's (step 1 by {first_step:.3g}, "
                            f"probe by {loss_trajectory(res[0]['first_losses'], theirs):.3g})")
    return problems


def summarize(runs: dict[str, list[list[dict[str, Any]]]], args: argparse.Namespace, bits: float) -> list[dict[str, Any]]:
    """Per model and system: steps/s (median), per-round steps/s, ratio to DDP, checks, the links' bounds."""
    rows = []
    for model in args.model_ids:
        grad_bytes = 4 * next(w for jobs in runs.values() for job in jobs for w in job)["results"][model]["params"]
        ddp = runs.get("ddp", [])
        ddp_median = statistics.median(job_samples(ddp, model)) if ddp else None
        for system, jobs in runs.items():
            if not jobs:
                continue
            median = statistics.median(job_samples(jobs, model))
            per_round = [1 / statistics.median(job_samples([job], model)) for job in jobs]
            factor = 2 * (WORKERS - 1) / WORKERS if system == "ddp" else 1.0
            problems = [f"round {i}: {p}" for i, job in enumerate(jobs)
                        for p in check_job(job, model, None if system == "ddp" or not ddp else ddp[0])]
            split = next(w for w in jobs[-1] if int(w["rank"]) == 0)["results"][model].get("split", {})
            rows.append({"model": model, "system": system, "label": SYSTEMS[system], "steps_per_s": 1 / median,
                         "median_step_s": median, "steps_per_s_by_round": per_round,
                         "ratio_vs_ddp": ddp_median / median if ddp_median else None,
                         "gradient_bytes": grad_bytes, "link_bound_step_s": factor * grad_bytes * 8 / bits,
                         "exchange_share_bound": factor * grad_bytes * 8 / bits / median,
                         "split_rank0_ms": {k: v for k, v in split.items() if k.endswith("_ms")},
                         "checks_ok": not problems, "check_problems": problems})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: steps/s, per round, ratio to DDP, link bound, checks."""
    lines = ["| model | system | steps/s | by round | / DDP | link-bound step (s) | link bound / step | checks |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio_vs_ddp']:.2f}x" if r["ratio_vs_ddp"] else "—"
        lines.append(f"| {r['model']} | {r['label']} | {r['steps_per_s']:.3g} | "
                     f"{', '.join(f'{x:.3g}' for x in r['steps_per_s_by_round'])} | {ratio} | "
                     f"{r['link_bound_step_s']:.3g} | {100 * r['exchange_share_bound']:.0f} % | "
                     f"{'ok' if r['checks_ok'] else 'FAILED'} |")
    return "\n".join(lines)


def verdicts(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """PASS / MISS per model and pskv system against the bar (>= 1.3x DDP); INVALID if a check failed."""
    out = {}
    for r in rows:
        if r["system"] != "ddp":
            ddp_ok = all(x["checks_ok"] for x in rows if x["system"] == "ddp" and x["model"] == r["model"])
            out[f"{r['model']} {r['label']}"] = ("INVALID" if not (r["checks_ok"] and ddp_ok) else "not measured"
                                                 if r["ratio_vs_ddp"] is None else
                                                 "PASS" if r["ratio_vs_ddp"] >= TARGET else "MISS")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Make the hosts, run the rounds, check, print the table, write the JSON."""
    args = parse_args(argv)
    install_sigterm_handler()
    stamp = datetime.now(timezone.utc)
    json_path = args.json or BENCH_DIR / "results" / (f"train_hosts_{stamp:%Y%m%d}_{args.rate}"
                                                      f"{'_quick' if args.quick else ''}.json")
    bits = rate_bits(args.rate) or 0.0
    started = time.perf_counter()
    try:
        hosts = SimulatedHosts(2 * WORKERS, rate=args.rate)
    except Unavailable as exc:
        print(f"simulated hosts unavailable: {exc}", file=sys.stderr)
        return 2
    with hosts, tempfile.TemporaryDirectory(prefix="pskv-bench-train-hosts-") as tmp_name:
        tmp = Path(tmp_name)
        runs, jobs_log, errors = run_rounds(args, hosts, spec_file(tmp / "spec.json", args), tmp)
    rows = summarize(runs, args, bits) if any(runs.values()) else []
    verdict = verdicts(rows)
    print(f"\n{WORKERS} worker hosts + {WORKERS} dedicated server hosts (pskv), links {args.rate} both ways, "
          f"{args.rounds} round(s) x {args.repeats} samples of {args.iters} steps; steps/s = 1 / median time per step "
          f"(slower worker); link-bound step = gradient bytes x (1 pskv, 1.5 ring) / link rate\n")
    print(table(rows))
    for r in rows:
        for problem in r["check_problems"]:
            print(f"CHECK FAILED {r['model']} {r['label']}: {problem}")
    for system, error in errors.items():
        print(f"JOB FAILED {SYSTEMS[system]}: {error[-1500:]}")
    print("\ntarget (issue 23): pskv >= 1.3x DDP steps/s: " + ", ".join(f"{k} {v}" for k, v in verdict.items()))
    payload = {"benchmark": "bench_train_hosts", "date_utc": stamp.isoformat(timespec="seconds"),
               "commit": git_commit(), "argv": sys.argv[1:] if argv is None else list(argv), "quick": args.quick,
               "rate": args.rate, "rate_bits_per_s": bits, "workers": WORKERS, "servers": WORKERS,
               "rounds": args.rounds, "samples_per_job": args.repeats, "steps_per_sample": args.iters,
               "warmup_steps": args.warmup, "pskv_env": args.env,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "loadavg_1_5_15_at_end": os.getloadavg()},
               "wall_s": time.perf_counter() - started, "target": {"factor": TARGET, "verdicts": verdict},
               "rows": rows, "errors": errors, "jobs": jobs_log, "runs": runs}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path}")
    return 1 if errors or any(not r["checks_ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
