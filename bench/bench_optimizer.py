"""Micro-benchmark of one optimizer update: pskv's Updater before / after vs ``torch.optim``.

Usage::

    python bench/bench_optimizer.py [--quick] [--json PATH] [--rounds R] [--iters N]
                                    [--baseline-git REV | --baseline-dir DIR | --no-baseline]
                                    [--optimizers sgd,adam,...] [--threads T]

``--threads`` (default 1) is torch's intra-op thread count; NumPy's ufuncs use one thread.

For each optimizer (SGD momentum 0.9, NAG, Adam, AdamW, AdaGrad, RMSProp; all with
``wd`` and ``rescale_grad=1/64``) and each workload it times one update of

* **before**: pskv's ``Updater`` from a baseline copy of ``pskv/optimizer`` (by default
  the optimizer package at git revision ``BASELINE_REV``, read with ``git show``; or a
  directory holding a copy of the package), imported under another module name;
* **after**: pskv's ``Updater`` of this checkout;
* **torch.optim**: the equivalent ``torch.optim`` class with ``foreach=True`` (torch
  backend only). torch.optim has no ``rescale_grad``: it is handed the already rescaled
  gradient, so its numbers do not include that multiplication.

Workloads: ``big`` = one float32 key of 1,860,000 elements; ``small`` = 6 float32 keys
(8192, 128, 8192, 64, 640, 10 elements) updated by one list call
``updater(keys, grads, weights)`` (one ``step()`` over 6 parameters for torch.optim).
Backends: NumPy arrays and torch CPU tensors.

Variants are interleaved: every round runs ``--iters`` updates of each variant in turn,
so drifts of a shared machine hit them all; the number reported is the median over the
rounds of the mean time per update. Medians and raw samples go to ``--json`` (default
``bench/results/optimizer.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(REPO_DIR))  # the pskv of this checkout

DEFAULT_JSON = BENCH_DIR / "results" / "optimizer.json"
BASELINE_REV = "f6080a7"  # the last commit with the allocating optimizer rules
BASELINE_MODULE = "_pskv_baseline_optimizer"
BIG = (1_860_000,)
SMALL = [(8192,), (128,), (8192,), (64,), (640,), (10,)]
RESCALE = 1.0 / 64

# name -> (pskv name, pskv kwargs, torch.optim class name, torch kwargs)
CASES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "sgd": (
        "sgd",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4},
        "SGD",
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
    ),
    "nag": (
        "nag",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4},
        "SGD",
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": True},
    ),
    "adam": (
        "adam",
        {"learning_rate": 1e-3, "wd": 1e-4, "epsilon": 1e-8},
        "Adam",
        {"lr": 1e-3, "weight_decay": 1e-4, "eps": 1e-8},
    ),
    "adamw": (
        "adamw",
        {"learning_rate": 1e-3, "wd": 1e-2, "epsilon": 1e-8},
        "AdamW",
        {"lr": 1e-3, "weight_decay": 1e-2, "eps": 1e-8},
    ),
    "adagrad": (
        "adagrad",
        {"learning_rate": 0.01, "wd": 1e-4, "eps": 1e-10},
        "Adagrad",
        {"lr": 0.01, "weight_decay": 1e-4, "eps": 1e-10},
    ),
    "rmsprop": (
        "rmsprop",
        {"learning_rate": 1e-3, "wd": 1e-4, "rho": 0.9, "epsilon": 1e-8},
        "RMSprop",
        {"lr": 1e-3, "weight_decay": 1e-4, "alpha": 0.9, "eps": 1e-8},
    ),
}


def load_baseline(rev: str | None, folder: str | None) -> Any:
    """Import a copy of ``pskv/optimizer`` (from git ``rev`` or ``folder``) as ``BASELINE_MODULE``."""
    root = Path(tempfile.mkdtemp(prefix="pskv-bench-opt-"))
    pkg = root / BASELINE_MODULE
    pkg.mkdir()
    if folder is not None:
        names = [p.name for p in Path(folder).glob("*.py")]
        texts = {n: (Path(folder) / n).read_text() for n in names}
    else:
        assert rev is not None
        listing = subprocess.run(
            ["git", "ls-tree", "--name-only", f"{rev}:pskv/optimizer"],
            cwd=REPO_DIR,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        texts = {
            n: subprocess.run(
                ["git", "show", f"{rev}:pskv/optimizer/{n}"], cwd=REPO_DIR, check=True, capture_output=True, text=True
            ).stdout
            for n in listing
            if n.endswith(".py")
        }
    for name, text in texts.items():
        (pkg / name).write_text(text.replace("pskv.optimizer", BASELINE_MODULE))
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(BASELINE_MODULE)
    finally:
        sys.path.remove(str(root))
        shutil.rmtree(root, ignore_errors=True)


def _arrays(shapes: list[tuple[int, ...]], backend: str, seed: int) -> tuple[list[Any], list[Any]]:
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if backend == "torch":
        import torch

        return [torch.from_numpy(w) for w in ws], [torch.from_numpy(g) for g in gs]
    return ws, gs


Runner = Callable[[], None]


def make_pskv(module: Any, case: str, shapes: list[tuple[int, ...]], backend: str) -> Runner:
    name, kwargs, _, _ = CASES[case]
    upd = module.get_updater(module.create(name, rescale_grad=RESCALE, **kwargs))
    ws, gs = _arrays(shapes, backend, 0)
    if len(shapes) == 1:
        w, g = ws[0], gs[0]

        def run() -> None:
            upd(0, g, w)

    else:
        keys = list(range(len(shapes)))

        def run() -> None:
            upd(keys, gs, ws)

    run()  # creates the states
    return run


def make_torch_optim(case: str, shapes: list[tuple[int, ...]]) -> Runner:
    import torch

    _, _, cls_name, kwargs = CASES[case]
    ws, gs = _arrays(shapes, "torch", 0)
    params = [torch.nn.Parameter(w) for w in ws]
    for p, g in zip(params, gs, strict=True):
        p.grad = g * RESCALE  # torch.optim has no rescale_grad: hand it the rescaled gradient
    opt = getattr(torch.optim, cls_name)(params, foreach=True, **kwargs)

    def run() -> None:
        opt.step()

    run()
    return run


def measure(variants: dict[str, Runner], rounds: int, iters: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for label, run in variants.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            samples[label].append((time.perf_counter() - t0) / iters)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 31, quick 5)")
    ap.add_argument("--iters", type=int, default=None, help="updates per round and variant (default: by size)")
    base = ap.add_mutually_exclusive_group()
    base.add_argument(
        "--baseline-git", default=BASELINE_REV, help=f"git revision of the baseline (default {BASELINE_REV})"
    )
    base.add_argument("--baseline-dir", default=None, help="a directory holding a copy of the baseline pskv/optimizer")
    base.add_argument("--no-baseline", action="store_true", help="skip the 'before' column")
    ap.add_argument("--optimizers", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads (default 1, like NumPy's single-threaded ufuncs)"
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import pskv.optimizer as after

    before = None
    if not args.no_baseline:
        before = load_baseline(None if args.baseline_dir else args.baseline_git, args.baseline_dir)
    rounds = args.rounds or (5 if args.quick else 31)
    cases = [c for c in args.optimizers.split(",") if c]
    workloads = {"big": [BIG], "small": SMALL}
    results: list[dict[str, Any]] = []
    header = f"{'optimizer':9} {'workload':8} {'backend':7} {'before ms':>10} {'after ms':>10} {'speedup':>8} {'torch.optim ms':>15}"
    print(header)
    print("-" * len(header))
    for case in cases:
        for wl, shapes in workloads.items():
            iters = args.iters or (10 if wl == "big" else 200)
            if args.quick:
                iters = max(1, iters // 5)
            for backend in ("numpy", "torch"):
                variants: dict[str, Runner] = {}
                if before is not None:
                    variants["before"] = make_pskv(before, case, shapes, backend)
                variants["after"] = make_pskv(after, case, shapes, backend)
                if backend == "torch":
                    variants["torch.optim"] = make_torch_optim(case, shapes)
                samples = measure(variants, rounds, iters)
                med = {k: statistics.median(v) for k, v in samples.items()}
                row = {
                    "optimizer": case,
                    "workload": wl,
                    "backend": backend,
                    "iters_per_round": iters,
                    "median_s": med,
                    "samples_s": samples,
                }
                results.append(row)

                def ms(label: str, med: dict[str, float] = med) -> str:
                    return f"{med[label] * 1e3:.4f}" if label in med else "-"

                speed = f"{med['before'] / med['after']:.2f}x" if "before" in med else "-"
                print(
                    f"{case:9} {wl:8} {backend:7} {ms('before'):>10} {ms('after'):>10} {speed:>8} {ms('torch.optim'):>15}",
                    flush=True,
                )
    doc = {
        "benchmark": "optimizer update, median over rounds of mean seconds per update",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline": None if before is None else (args.baseline_dir or f"git:{args.baseline_git}"),
        "rounds": rounds,
        "rescale_grad": RESCALE,
        "workloads": {"big": [list(s) for s in [BIG]], "small": [list(s) for s in SMALL]},
        "cases": {
            k: {"pskv": [v[0], v[1]], "torch.optim": [v[2], {**v[3], "foreach": True}]} for k, v in CASES.items()
        },
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
        },
        "results": results,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
