"""Gradient compression (issue 12): what each compressor costs and what it saves.

In one invocation:

1. **CPU cost.** For every compressor in ``pskv.compression.COMPRESSORS``: compress (with
   a residual) and decompress the ResNet-50 gradient list (161 arrays, 25.6M float32,
   97.5 MiB) in this process, medians of ``--repeats``; the payload bytes and the
   ratio to float32.
2. **The uncompressed exchange it must stay under.** The same list pushed and pulled
   through loopback sockets (``PSKV_SHM=0``, the path between hosts) by a real
   ``pskv launch`` job (2 workers, 1 server; ``bench/_dist_worker_pskv.py``), medians of
   its samples. The ratio compress+decompress / exchange is the issue's target
   (< 20 %): a worker compresses once and a server decompresses once per worker and
   push, so one compress plus one decompress per worker is what an iteration adds.
3. **Accuracy.** ``examples/train_digits.py`` in one process (``local`` store, 2 CPU
   replicas, so every gradient is compressed) with each compressor and, as the baseline,
   uncompressed with the same recipe (``--adam``: Adam, the same epochs), over
   ``--seeds`` initialisations and data orders; the mean test accuracy of both models
   (the test set has 360 digits: one digit is 0.28 points, and single runs move by a
   point or two, hence the seeds).

Time on rate-limited links is measured by ``bench/bench_hosts.py --compression``
(two simulated hosts). Writes JSON (``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from bench_local import resnet50_shapes  # noqa: E402

from pskv.compression import COMPRESSORS, create  # noqa: E402

THRESHOLD = 0.5


def params(kind: str) -> dict[str, Any]:
    """The compression benchmarked for ``kind``: its defaults, and ``THRESHOLD`` where it takes one."""
    out: dict[str, Any] = {"type": kind}
    if "threshold" in COMPRESSORS[kind].defaults:
        out["threshold"] = THRESHOLD
    return out


def cpu_cost(kind: str, repeats: int) -> dict[str, Any]:
    """Compress + decompress the ResNet-50 list ``repeats`` times (fresh residuals once)."""
    rng = np.random.default_rng(0)
    grads = [rng.normal(0, 0.5, int(np.prod(s))).astype(np.float32) for s in resnet50_shapes()]
    comp = create(params(kind))
    residuals = [np.zeros(g.size, np.float32) for g in grads]
    comp_s, decomp_s = [], []
    payload_bytes = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        payloads = [comp.compress(g, r) for g, r in zip(grads, residuals)]
        t1 = time.perf_counter()
        for p, g in zip(payloads, grads):
            comp.decompress(p, g.size)
        t2 = time.perf_counter()
        comp_s.append(t1 - t0)
        decomp_s.append(t2 - t1)
        payload_bytes = sum(p.nbytes for p in payloads)
    raw = sum(g.nbytes for g in grads)
    return {"compress_s": statistics.median(comp_s), "decompress_s": statistics.median(decomp_s),
            "compress_range_s": [min(comp_s), max(comp_s)], "decompress_range_s": [min(decomp_s), max(decomp_s)],
            "payload_bytes": payload_bytes, "raw_bytes": raw, "ratio": raw / payload_bytes}


def loopback_exchange(repeats: int, compression: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    """Seconds per ResNet-50 push(block=False)+pull through loopback sockets: a pskv launch job, W=2, S=1."""
    shapes = [list(s) for s in resnet50_shapes()]
    spec: dict[str, Any] = {"repeats": repeats, "workloads": [
        {"name": "resnet50", "shapes": shapes, "key_base": 1000, "init": 0.0, "as_list": True,
         "modes": ["push_pull"], "warmup": 2, "iters": 3, "expect": 3.0}]}
    if compression:
        spec["compression"] = compression
    with tempfile.TemporaryDirectory(prefix="pskv-bench-compression-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "1", "--timeout", str(timeout),
                "--stop-grace", "2", "--env", "PSKV_SHM=0", "--",
                sys.executable, str(BENCH_DIR / "_dist_worker_pskv.py"), str(path)]
        res = subprocess.run(argv, cwd=REPO_DIR, capture_output=True, text=True, timeout=timeout + 30,
                             env={**os.environ, "PYTHONPATH": str(REPO_DIR)})
    found = [json.loads(m[1]) for m in re.finditer(r"^\[worker \d+\] (\{.*\})$", res.stdout, re.M)]
    if res.returncode != 0 or len(found) != 2:
        raise RuntimeError(f"pskv launch exited {res.returncode}:\n{(res.stdout + res.stderr)[-3000:]}")
    per_iter = [max(w["results"]["resnet50"]["samples_s"]["push_pull"][i] for w in found)
                for i in range(repeats)]  # seconds per iteration, the slower worker's sample
    return {"s_per_iter": statistics.median(per_iter), "range_s": [min(per_iter), max(per_iter)],
            "check": found[0]["results"]["resnet50"]["check"]}


def digits_accuracy(kind: str | None, epochs: int, seeds: int, timeout: float) -> dict[str, Any]:
    """Mean test accuracy of both digits models after ``epochs`` epochs over ``seeds`` seeds (one
    process, 2 replicas); uncompressed (``kind`` None) with the compressed runs' recipe."""
    runs = []
    for seed in range(seeds):
        argv = [sys.executable, str(REPO_DIR / "examples" / "train_digits.py"), "--devices", "2", "--epochs",
                str(epochs), "--min-accuracy", "0", "--seed", str(seed)]
        if kind:
            argv += ["--compression", kind, "--threshold", str(THRESHOLD)]
        else:
            argv += ["--adam"]
        res = subprocess.run(argv, cwd=REPO_DIR, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONPATH": str(REPO_DIR)})
        m = re.search(r"test accuracy: mlp ([\d.]+)%, cnn ([\d.]+)%", res.stdout)
        if res.returncode != 0 or m is None:
            raise RuntimeError(f"train_digits.py exited {res.returncode}:\n{(res.stdout + res.stderr)[-2000:]}")
        runs.append({"mlp": float(m[1]) / 100, "cnn": float(m[2]) / 100})
    return {"mlp": statistics.mean(r["mlp"] for r in runs), "cnn": statistics.mean(r["cnn"] for r in runs),
            "runs": runs, "epochs": epochs}


def accuracy_table(args: argparse.Namespace, accuracy: dict[str, Any], started: float, load: list[float]) -> int:
    """Print the digits accuracies against the uncompressed baseline and write them (``--accuracy-only``)."""
    base = accuracy["none"]
    print(f"digits, {args.epochs} epochs, mean of {args.seeds} seeds; points against uncompressed with the same "
          f"recipe (Adam)\n")
    print("| compressor | MLP | CNN | MLP points | CNN points | within 1 point |")
    print("|---|---:|---:|---:|---:|---|")
    for kind, acc in accuracy.items():
        dm, dc = (acc["mlp"] - base["mlp"]) * 100, (acc["cnn"] - base["cnn"]) * 100
        print(f"| {kind} | {acc['mlp']:.2%} | {acc['cnn']:.2%} | {dm:+.2f} | {dc:+.2f} "
              f"| {'—' if kind == 'none' else 'yes' if min(dm, dc) >= -1 else 'no'} |")
    path = args.json.with_name(args.json.stem + "_accuracy.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"accuracy": accuracy, "threshold": THRESHOLD, "seeds": args.seeds,
                                "load_average": load + [os.getloadavg()[0]], "wall_s": time.perf_counter() - started,
                                "commit": _commit()}, indent=1), encoding="utf-8")
    print(f"\nwrote {path}")
    return 0


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True,
                          text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="samples of each measurement (default 5)")
    p.add_argument("--epochs", type=int, default=30, help="digits epochs per model (default 30)")
    p.add_argument("--seeds", type=int, default=3, help="digits runs per compressor, each another seed (default 3)")
    p.add_argument("--no-accuracy", action="store_true", help="skip the digits runs")
    p.add_argument("--accuracy-only", action="store_true", help="only the digits runs (a JSON of their own)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    p.add_argument("--json", type=Path, default=BENCH_DIR / "results" / "compression.json")
    args = p.parse_args(argv)
    started, load = time.perf_counter(), [os.getloadavg()[0]]
    kinds = sorted(COMPRESSORS)
    accuracy = {} if args.no_accuracy else {k or "none": digits_accuracy(k, args.epochs, args.seeds, args.timeout)
                                            for k in (None, *kinds)}
    if args.accuracy_only:
        return accuracy_table(args, accuracy, started, load)
    cost = {k: cpu_cost(k, args.repeats) for k in kinds}
    exchange = {"none": loopback_exchange(args.repeats, None, args.timeout)}
    for k in kinds:
        exchange[k] = loopback_exchange(args.repeats, params(k), args.timeout)
    load.append(os.getloadavg()[0])
    base = exchange["none"]["s_per_iter"]
    print(f"ResNet-50 list (161 arrays, 97.5 MiB float32), each type's defaults (threshold {THRESHOLD} where it "
          f"takes one); medians of {args.repeats}; "
          f"loopback exchange = push(block=False)+pull, W=2, S=1, PSKV_SHM=0 (load {load[0]:.1f} -> {load[1]:.1f})\n")
    print("| compressor | payload MB (x fewer) | compress ms | decompress ms | (c+d) / uncompressed exchange "
          "| exchange ms/it | uncompressed ms/it | digits MLP / CNN |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    none_acc = accuracy.get("none")
    if none_acc:
        print(f"| none (Adam) | {cost[kinds[0]]['raw_bytes'] / 1e6:.1f} (1x) | — | — | — | {base * 1e3:.0f} "
              f"| {base * 1e3:.0f} | {none_acc['mlp']:.1%} / {none_acc['cnn']:.1%} |")
    for k in kinds:
        c, acc = cost[k], accuracy.get(k)
        share = (c["compress_s"] + c["decompress_s"]) / base
        print(f"| {k} | {c['payload_bytes'] / 1e6:.2f} ({c['ratio']:.0f}x) | {c['compress_s'] * 1e3:.0f} "
              f"| {c['decompress_s'] * 1e3:.0f} | {share:.0%} | {exchange[k]['s_per_iter'] * 1e3:.0f} "
              f"| {base * 1e3:.0f} | " + (f"{acc['mlp']:.1%} / {acc['cnn']:.1%}" if acc else "—") + " |")
    payload = {"cpu": cost, "exchange": exchange, "accuracy": accuracy, "threshold": THRESHOLD,
               "repeats": args.repeats, "load_average": load, "wall_s": time.perf_counter() - started,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "seeds": args.seeds, "commit": _commit()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
