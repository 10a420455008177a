"""Measure MXNet's ``local`` KVStore; run by ``bench/bench_local.py`` inside the MXNet venv.

Usage (normally you do not call this yourself)::

    .venv-mxnet/bin/python bench/_mxnet_local.py --spec-file SPEC.json   # or "-" (stdin, default)
    .venv-mxnet/bin/python bench/_mxnet_local.py --spec '{"devices": 4, ...}'

The spec is one JSON object::

    {"devices": 4, "repeats": 5,
     "workloads": [{"name": "4 KB", "shapes": [[1024]], "as_list": false,
                    "iters": 500, "warmup": 500}]}

One *iteration* is ``kv.push(key(s), devices values per key)`` followed by
``kv.pull(key(s), out=devices outs per key)``, complete. Two modes are timed:

* ``blocking``: every iteration ends with ``wait_to_read()`` on every out;
* ``pipelined``: ``iters`` iterations are issued back-to-back, then ``mx.nd.waitall()``.

Prints one JSON object on stdout: versions, settings, and per workload the raw samples
(seconds per iteration, one per timed loop of ``iters`` iterations).

This file imports only the standard library, NumPy and MXNet. MXNet is imported inside
:func:`main`, so ``bench_local.py`` reuses the dependency-free timing helpers below
(:func:`sample_modes`) and both systems are timed by the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Step = Callable[[int], None]
"""Runs ``n`` complete iterations of one mode."""

MODES = ("blocking", "pipelined")


# -- timing protocol (shared with bench_local.py) -----------------------------------------
def seconds_per_iteration(step: Step, iters: int) -> float:
    """Time one loop of ``iters`` iterations; return seconds per iteration."""
    start = time.perf_counter()
    step(iters)
    return (time.perf_counter() - start) / iters


def sample_modes(steps: dict[str, Step], warmup: int, iters: int, repeats: int) -> dict[str, list[float]]:
    """Warm every mode up, then take ``repeats`` samples of each, interleaving the modes.

    Interleaving spreads slow drifts of a shared machine evenly over the modes.

    Args:
        steps: mode name -> function running ``n`` complete iterations of that mode.
        warmup: iterations run once per mode before timing.
        iters: iterations per timed sample.
        repeats: samples per mode.

    Returns:
        mode name -> samples in seconds per iteration.
    """
    for step in steps.values():
        step(max(1, warmup))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            samples[name].append(seconds_per_iteration(step, iters))
    return samples


def expected_sum(devices: int) -> float:
    """The pulled value when device ``d`` pushes ``d + 1`` everywhere: ``1 + 2 + ... + devices``."""
    return float(devices * (devices + 1) // 2)


# -- MXNet ----------------------------------------------------------------------------------
class MxWorkload:
    """One workload on a fresh MXNet ``local`` store: keys, per-device values and outs.

    Device ``d`` (``mx.cpu(d)``) pushes arrays filled with ``d + 1``.
    """

    def __init__(self, mx: Any, shapes: list[tuple[int, ...]], as_list: bool, devices: int) -> None:
        self._mx = mx
        self.kv = mx.kv.create("local")
        keys = list(range(len(shapes)))
        self.kv.init(keys, [mx.nd.zeros(s) for s in shapes])
        self.values = [[mx.nd.full(s, d + 1, ctx=mx.cpu(d)) for d in range(devices)] for s in shapes]
        self.outs = [[mx.nd.zeros(s, ctx=mx.cpu(d)) for d in range(devices)] for s in shapes]
        self._flat_outs = [o for per_key in self.outs for o in per_key]
        self.devices = devices
        if as_list:
            self._key: Any = keys
            self._vals: Any = self.values
            self._out: Any = self.outs
        else:
            if len(shapes) != 1:
                raise ValueError("a single-key workload has exactly one shape")
            self._key, self._vals, self._out = 0, self.values[0], self.outs[0]

    def _issue(self) -> None:
        self.kv.push(self._key, self._vals)
        self.kv.pull(self._key, out=self._out)

    def blocking(self, n: int) -> None:
        """``n`` iterations, each waited for (``wait_to_read`` on every out)."""
        for _ in range(n):
            self._issue()
            for o in self._flat_outs:
                o.wait_to_read()

    def pipelined(self, n: int) -> None:
        """``n`` iterations issued back-to-back, then ``mx.nd.waitall()``."""
        for _ in range(n):
            self._issue()
        self._mx.nd.waitall()

    def check(self) -> None:
        """Raise if any out does not hold the sum of the pushed values."""
        want = expected_sum(self.devices)
        for o in self._flat_outs:
            if not np.all(o.asnumpy() == want):
                raise RuntimeError(f"MXNet pulled a wrong value for shape {o.shape}: expected {want}")


def run_workload(mx: Any, spec: dict[str, Any], devices: int, repeats: int) -> dict[str, Any]:
    """Build one workload, check it once, and sample both modes."""
    shapes = [tuple(int(d) for d in s) for s in spec["shapes"]]
    work = MxWorkload(mx, shapes, bool(spec["as_list"]), devices)
    work.blocking(2)
    work.check()
    samples = sample_modes({"blocking": work.blocking, "pipelined": work.pipelined},
                           int(spec["warmup"]), int(spec["iters"]), repeats)
    del work
    mx.nd.waitall()
    return {"iters": int(spec["iters"]), "samples_s": samples}


def environment(mx: Any) -> dict[str, Any]:
    """Versions, compiled-in MXNet features and the MXNet/OpenMP environment variables."""
    try:
        features = sorted(f.name for f in mx.runtime.Features().values() if f.enabled)
    except Exception:  # noqa: BLE001 - informational only
        features = []
    env = {k: v for k, v in os.environ.items() if k.startswith(("MXNET_", "OMP_", "KMP_"))}
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mxnet": mx.__version__,
        "mxnet_features": features,
        "env": env,
    }


def read_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The spec from ``--spec`` or ``--spec-file`` (``-`` reads stdin)."""
    if args.spec is not None:
        return json.loads(args.spec)
    if args.spec_file == "-":
        return json.load(sys.stdin)
    with open(args.spec_file, encoding="utf-8") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    """Run every workload of the spec and print the result as one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="the spec as a JSON string")
    parser.add_argument("--spec-file", default="-", help="path of a JSON spec file; '-' reads stdin (default)")
    args = parser.parse_args(argv)
    spec = read_spec(args)
    import mxnet as mx  # only here: the timing helpers above must import without MXNet

    devices, repeats = int(spec["devices"]), int(spec["repeats"])
    results = {w["name"]: run_workload(mx, w, devices, repeats) for w in spec["workloads"]}
    json.dump({"environment": environment(mx), "results": results}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
