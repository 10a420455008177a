"""Benchmark pskv's ``local`` store against MXNet 1.9.1's and against a NumPy memory bound.

Usage::

    python bench/bench_local.py [--quick] [--json PATH] [--no-mxnet | --require-mxnet]
                                [--repeats N] [--rounds R] [--mxnet-venv PATH]
                                [--kernel-threads N] [--bound-threads N]

In one invocation it measures, for each workload:

* **pskv** ``local`` store, in this process;
* **MXNet 1.9.1** ``local`` store, in a subprocess with the MXNet venv's python
  (``bench/setup_mxnet_venv.sh`` creates it; ``MXNET_VENV`` overrides its path);
* the **NumPy bound**: the minimum memory work of one iteration (sum the 4 values into
  one array, then copy it into 4 outs) done with plain NumPy in this process.

One *iteration* is ``push(key(s), 4 values per key)`` + ``pull(key(s), out=4 outs per
key)``, complete. ``GB/s = bytes of ONE value of the key(s) / iteration time``
(1 GB = 1e9 bytes). Workloads: one 1-D float32 key of 4 KB, 256 KB, 4 MB and 64 MB, and
the 161 ResNet-50 parameter arrays pushed and pulled as one key list.

The systems are measured in ``--rounds`` interleaved rounds (pskv, NumPy bound, MXNet,
then again), so slow drifts of a shared machine hit all of them; every number reported
is a median over all samples. Raw samples, medians and the environment go to
``--json`` (default ``bench/results/local.json``). Exit status is 0 whether or not the
targets are met.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]  # the runner's helpers, and the pskv of this checkout

from _mxnet_local import Step, expected_sum, sample_modes  # noqa: E402

DEFAULT_JSON = BENCH_DIR / "results" / "local.json"
DEVICES = 4
DTYPE = np.float32
GB = 1e9
GBPS_DEFINITION = "GB/s = bytes of ONE value of the key(s) / iteration time, 1 GB = 1e9 bytes"
ITERATION_DEFINITION = ("one iteration = push(key(s), 4 values per key) + pull(key(s), out=4 outs per key), "
                        "complete (MXNet: after wait_to_read on every out)")

NDArray = np.ndarray[Any, Any]
Shape = tuple[int, ...]


# -- workloads ------------------------------------------------------------------------------
def resnet50_shapes(num_classes: int = 1000) -> list[Shape]:
    """Parameter shapes of ResNet-50 v1 in torchvision's order (BN gamma/beta only, no running stats).

    Stem conv 7x7 + BN, then bottleneck stages of [3, 4, 6, 3] blocks (widths 64..512,
    expansion 4, a 1x1 projection + BN on each stage's first block), then the fc layer.
    161 arrays, 25,557,032 elements.
    """
    shapes: list[Shape] = [(64, 3, 7, 7), (64,), (64,)]
    in_ch = 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True):
        out_ch = 4 * width
        for block in range(blocks):
            shapes += [(width, in_ch, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out_ch, width, 1, 1), (out_ch,), (out_ch,)]
            if block == 0:
                shapes += [(out_ch, in_ch, 1, 1), (out_ch,), (out_ch,)]
            in_ch = out_ch
    shapes += [(num_classes, in_ch), (num_classes,)]
    return shapes


RESNET50_ARRAYS = 161
RESNET50_ELEMENTS = 25_557_032


@dataclass(frozen=True)
class Workload:
    """What one iteration pushes and pulls.

    Attributes:
        name: label in tables and JSON.
        shapes: one shape per key.
        as_list: push/pull the keys as one key-list call (else one key, not in a list).
        iters: iterations per timed sample.
        warmup: iterations run before timing, per mode.
    """

    name: str
    shapes: tuple[Shape, ...]
    as_list: bool
    iters: int
    warmup: int

    @property
    def elements(self) -> int:
        """Elements of one value of all keys together."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def value_bytes(self) -> int:
        """Bytes of ONE value of the key(s): the numerator of GB/s."""
        return self.elements * np.dtype(DTYPE).itemsize

    def spec(self) -> dict[str, Any]:
        """The JSON form given to the MXNet runner."""
        return {"name": self.name, "shapes": [list(s) for s in self.shapes], "as_list": self.as_list,
                "iters": self.iters, "warmup": self.warmup}


def iterations_per_sample(value_bytes: int, quick: bool) -> int:
    """Enough iterations that a sample moves ~256 MiB of values (32 MiB quick), 1..500 (1..100)."""
    target, cap = (32 << 20, 100) if quick else (256 << 20, 500)
    return max(1, min(cap, round(target / value_bytes)))


def make_workloads(quick: bool) -> list[Workload]:
    """The five workloads: 4 KB, 256 KB, 4 MB, 64 MB single keys and the ResNet-50 key list."""
    singles = [("4 KB", 4 << 10), ("256 KB", 256 << 10), ("4 MB", 4 << 20), ("64 MB", 64 << 20)]
    entries: list[tuple[str, tuple[Shape, ...], bool]] = [
        (name, ((nbytes // np.dtype(DTYPE).itemsize,),), False) for name, nbytes in singles
    ]
    entries.append(("ResNet-50 (161 keys)", tuple(resnet50_shapes()), True))
    workloads = []
    for name, shapes, as_list in entries:
        nbytes = sum(math.prod(s) for s in shapes) * np.dtype(DTYPE).itemsize
        iters = iterations_per_sample(nbytes, quick)
        workloads.append(Workload(name, shapes, as_list, iters, warmup=max(2, iters)))
    return workloads


def new_arrays(shapes: Sequence[Shape], fill: float) -> list[NDArray]:
    """One array per shape, filled with ``fill``."""
    return [np.full(s, fill, dtype=DTYPE) for s in shapes]


def device_values(shapes: Sequence[Shape]) -> list[list[NDArray]]:
    """Per key, the values of the 4 devices; device ``d`` pushes ``d + 1`` (as the MXNet runner)."""
    per_device = [new_arrays(shapes, d + 1) for d in range(DEVICES)]
    return [list(vals) for vals in zip(*per_device, strict=True)]


# -- pskv -----------------------------------------------------------------------------------
class PskvWorkload:
    """One workload on a fresh pskv ``local`` store."""

    def __init__(self, work: Workload, settings: dict[str, Any]) -> None:
        import pskv

        # create() is typed as the base class; 'local' gives a LocalStore (block=, wait()).
        self.kv = cast(pskv.LocalStore, pskv.create("local", **settings))
        keys = list(range(len(work.shapes)))
        self.kv.init(keys, new_arrays(work.shapes, 0.0))
        self.values = device_values(work.shapes)
        self.outs = [new_arrays([s] * DEVICES, 0.0) for s in work.shapes]
        if work.as_list:
            self._key: Any = keys
            self._vals: Any = self.values
            self._out: Any = self.outs
        else:
            self._key, self._vals, self._out = 0, self.values[0], self.outs[0]

    def blocking(self, n: int) -> None:
        """``n`` iterations of blocking push + pull."""
        kv, key, vals, out = self.kv, self._key, self._vals, self._out
        for _ in range(n):
            kv.push(key, vals)
            kv.pull(key, out=out)

    def pipelined(self, n: int) -> None:
        """``n`` iterations issued with ``block=False``, then ``kv.wait()``."""
        kv, key, vals, out = self.kv, self._key, self._vals, self._out
        for _ in range(n):
            kv.push(key, vals, block=False)
            kv.pull(key, out=out, block=False)
        kv.wait()

    def check(self) -> None:
        """Raise if any out does not hold the sum of the pushed values."""
        want = expected_sum(DEVICES)
        if not all(np.all(o == want) for outs in self.outs for o in outs):
            raise RuntimeError(f"pskv pulled a wrong value: expected {want} everywhere")


def measure_pskv(work: Workload, repeats: int, settings: dict[str, Any]) -> dict[str, list[float]]:
    """Samples (s/iteration) of pskv in both modes."""
    bench = PskvWorkload(work, settings)
    try:
        bench.blocking(2)
        bench.check()
        return sample_modes({"blocking": bench.blocking, "pipelined": bench.pipelined},
                            work.warmup, work.iters, repeats)
    finally:
        bench.kv.close()


# -- NumPy bound ----------------------------------------------------------------------------
class NumpyBound:
    """The minimum memory work of one iteration, in NumPy: ``store = v0 + v1 + v2 + v3``, then
    ``np.copyto(out_d, store)`` for the 4 outs, for every key.

    Two variants; the bound is the faster one's median:

    * ``plain``: whole-array ``np.add`` chain, then 4 ``np.copyto``, key by key;
    * ``blocked_threaded``: all keys' elements are split into ``threads`` equal contiguous
      parts; each thread sums its part in cache-sized blocks (every value read once, the
      store written once), then copies its part of the store into the 4 outs.

    Sum and copies stay separate passes, as a push followed by a pull must do them.
    """

    VARIANTS = ("plain", "blocked_threaded")
    BLOCK = 1 << 15  # elements: 128 KiB of float32, 5 blocks fit in L2

    def __init__(self, shapes: Sequence[Shape], threads: int) -> None:
        self.values = device_values(shapes)
        self.stores = new_arrays(shapes, 0.0)
        self.outs = [new_arrays([s] * DEVICES, 0.0) for s in shapes]
        self.threads = max(1, threads)
        self._parts = self._split([math.prod(s) for s in shapes], self.threads)
        self._pool = ThreadPoolExecutor(max_workers=self.threads - 1) if self.threads > 1 else None

    @staticmethod
    def _split(sizes: list[int], parts: int) -> list[list[tuple[int, int, int]]]:
        """Cut the concatenated elements of all arrays into ``parts`` equal runs of (array, lo, hi)."""
        total = sum(sizes)
        bounds = [total * p // parts for p in range(parts + 1)]
        runs: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
        offset = 0
        for index, size in enumerate(sizes):
            for p in range(parts):
                lo, hi = max(bounds[p], offset), min(bounds[p + 1], offset + size)
                if lo < hi:
                    runs[p].append((index, lo - offset, hi - offset))
            offset += size
        return runs

    def plain(self, n: int) -> None:
        """``n`` iterations of the whole-array variant."""
        for _ in range(n):
            for vals, store, outs in zip(self.values, self.stores, self.outs, strict=True):
                np.add(vals[0], vals[1], out=store)
                for v in vals[2:]:
                    np.add(store, v, out=store)
                for o in outs:
                    np.copyto(o, store)

    def _do_part(self, runs: list[tuple[int, int, int]]) -> None:
        flat = [(self.stores[i].reshape(-1), [v.reshape(-1) for v in self.values[i]], lo, hi) for i, lo, hi in runs]
        for store, vals, lo, hi in flat:
            for start in range(lo, hi, self.BLOCK):
                end = min(start + self.BLOCK, hi)
                dst = store[start:end]
                np.add(vals[0][start:end], vals[1][start:end], out=dst)
                for v in vals[2:]:
                    np.add(dst, v[start:end], out=dst)
        for (i, lo, hi), (store, _, _, _) in zip(runs, flat, strict=True):
            for o in self.outs[i]:
                np.copyto(o.reshape(-1)[lo:hi], store[lo:hi])

    def blocked_threaded(self, n: int) -> None:
        """``n`` iterations of the blocked, threaded variant."""
        for _ in range(n):
            if self._pool is None:
                self._do_part(self._parts[0])
                continue
            futures = [self._pool.submit(self._do_part, runs) for runs in self._parts[1:]]
            self._do_part(self._parts[0])
            for f in futures:
                f.result()

    def check(self) -> None:
        """Raise if an out does not hold the sum."""
        want = expected_sum(DEVICES)
        if not all(np.all(o == want) for outs in self.outs for o in outs):
            raise RuntimeError("NumPy bound computed a wrong sum")

    def close(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown()


def measure_numpy_bound(work: Workload, repeats: int, threads: int) -> dict[str, list[float]]:
    """Samples (s/iteration) of both NumPy-bound variants."""
    bound = NumpyBound(work.shapes, threads)
    try:
        steps: dict[str, Step] = {name: getattr(bound, name) for name in NumpyBound.VARIANTS}
        for step in steps.values():
            step(1)
            bound.check()
        return sample_modes(steps, work.warmup, work.iters, repeats)
    finally:
        bound.close()


# -- MXNet (subprocess) ---------------------------------------------------------------------
def mxnet_python(venv: Path) -> Path | None:
    """The MXNet venv's interpreter, or None if the venv does not exist."""
    python = venv / "bin" / "python"
    return python if python.exists() else None


def measure_mxnet(python: Path, workloads: Sequence[Workload], repeats: int) -> dict[str, Any]:
    """Run ``_mxnet_local.py`` once over all workloads; its parsed JSON output.

    Raises:
        RuntimeError: the runner failed or printed no JSON.
    """
    spec = {"devices": DEVICES, "repeats": repeats, "workloads": [w.spec() for w in workloads]}
    proc = subprocess.run([str(python), str(BENCH_DIR / "_mxnet_local.py"), "--spec-file", "-"],
                          input=json.dumps(spec), capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"MXNet runner exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"MXNet runner printed no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def missing_venv_message(venv: Path) -> str:
    """How to create the MXNet venv."""
    return (f"MXNet venv not found at {venv} (override with MXNET_VENV or --mxnet-venv).\n"
            f"  Create it with:  bash bench/setup_mxnet_venv.sh")


# -- statistics and summary -----------------------------------------------------------------
def stats(samples: Sequence[float]) -> dict[str, float | int]:
    """Median, quartiles, min and max of samples (seconds)."""
    ordered = sorted(samples)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    return {"n": len(ordered), "median_s": statistics.median(ordered), "p25_s": q1, "p75_s": q3,
            "min_s": ordered[0], "max_s": ordered[-1]}


def merge(into: dict[str, dict[str, list[float]]], name: str, samples: dict[str, list[float]]) -> None:
    """Append one round's samples of workload ``name`` to the accumulated ones."""
    per_mode = into.setdefault(name, {})
    for mode, values in samples.items():
        per_mode.setdefault(mode, []).extend(values)


def summarise(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per workload and mode: raw samples plus their statistics."""
    return {name: {mode: {"samples_s": values, **stats(values)} for mode, values in modes.items()}
            for name, modes in samples.items()}


def _median(system: dict[str, Any] | None, name: str, mode: str) -> float | None:
    if system is None or name not in system or mode not in system[name]:
        return None
    return float(system[name][mode]["median_s"])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def round_ratios(pskv: dict[str, Any], mxnet: dict[str, Any] | None, name: str, per_round: int) -> list[float]:
    """pskv/MXNet throughput ratio of each round's blocking medians (a noise gauge)."""
    if mxnet is None or name not in mxnet:
        return []

    def by_round(samples: list[float]) -> list[float]:
        return [statistics.median(samples[i:i + per_round]) for i in range(0, len(samples), per_round)]
    p_rounds = by_round(pskv[name]["blocking"]["samples_s"])
    m_rounds = by_round(mxnet[name]["blocking"]["samples_s"])
    return [m / p for p, m in zip(p_rounds, m_rounds, strict=False)]  # MXNet may have failed in a later round


def summary_row(work: Workload, pskv: dict[str, Any], mxnet: dict[str, Any] | None,
                bound: dict[str, Any], per_round: int) -> dict[str, Any]:
    """The reported medians, throughputs and ratios of one workload."""
    p_t = _median(pskv, work.name, "blocking")
    m_t = _median(mxnet, work.name, "blocking")
    b_t, best = min((t, v) for v in NumpyBound.VARIANTS if (t := _median(bound, work.name, v)) is not None)
    p_pipe = _median(pskv, work.name, "pipelined")
    m_pipe = _median(mxnet, work.name, "pipelined")
    return {
        "workload": work.name,
        "arrays": len(work.shapes),
        "value_bytes": work.value_bytes,
        "pskv_s": p_t, "mxnet_s": m_t, "numpy_bound_s": b_t, "numpy_bound_variant": best,
        "pskv_iter_per_s": _ratio(1.0, p_t), "mxnet_iter_per_s": _ratio(1.0, m_t),
        "pskv_gbps": _ratio(work.value_bytes / GB, p_t), "mxnet_gbps": _ratio(work.value_bytes / GB, m_t),
        "numpy_bound_gbps": _ratio(work.value_bytes / GB, b_t),
        "pskv_over_mxnet": _ratio(m_t, p_t), "pskv_over_bound": _ratio(b_t, p_t),
        "pskv_over_mxnet_by_round": round_ratios(pskv, mxnet, work.name, per_round),
        "pskv_pipelined_s": p_pipe, "mxnet_pipelined_s": m_pipe,
        "pipelined_pskv_over_mxnet": _ratio(m_pipe, p_pipe),
    }


@dataclass(frozen=True)
class Target:
    """A performance target from the issue; met when pskv/MXNet (blocking medians) is >= 1."""

    name: str
    workload: str
    text: str


TARGETS = (
    Target("resnet50_throughput", "ResNet-50 (161 keys)", "ResNet-50 list: pskv throughput >= 1.0x MXNet"),
    Target("64mb_throughput", "64 MB", "64 MB key: pskv throughput >= 1.0x MXNet"),
    Target("4kb_latency", "4 KB", "4 KB key: pskv time per iteration <= MXNet's"),
)


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """PASS / MISS (or n/a without MXNet) per target, on the blocking-mode medians."""
    by_name = {r["workload"]: r for r in rows}
    verdicts = []
    for t in TARGETS:
        ratio = by_name[t.workload]["pskv_over_mxnet"] if t.workload in by_name else None
        status = "n/a" if ratio is None else ("PASS" if ratio >= 1.0 else "MISS")
        by_round = by_name[t.workload]["pskv_over_mxnet_by_round"] if t.workload in by_name else []
        verdicts.append({**asdict(t), "ratio": ratio, "ratio_by_round": by_round, "status": status})
    return verdicts


# -- reporting ------------------------------------------------------------------------------
def _fmt(value: float | None, scale: float = 1.0) -> str:
    """3 significant digits (whole numbers from 1000 up); n/a for a missing value."""
    if value is None:
        return "n/a"
    v = value * scale
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _x(ratio: float | None) -> str:
    """A ratio as ``1.23x``."""
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _size(nbytes: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.4g} {unit}"
    return f"{nbytes} B"


def _spread(ratios: Sequence[float]) -> str:
    """The range of per-round ratios, e.g. ``1.10-1.95x``."""
    if not ratios:
        return "n/a"
    return f"{min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else _x(ratios[0])


def markdown_tables(rows: Sequence[dict[str, Any]]) -> str:
    """The main (blocking) table and the secondary pipelined table, as markdown."""
    main = ["| workload | value size | pskv ms | MXNet ms | NumPy bound ms | pskv it/s | pskv GB/s | MXNet GB/s "
            "| bound GB/s | pskv/MXNet | pskv/MXNet by round | pskv/bound |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        main.append(f"| {r['workload']} | {_size(r['value_bytes'])} | {_fmt(r['pskv_s'], 1e3)} | "
                    f"{_fmt(r['mxnet_s'], 1e3)} | {_fmt(r['numpy_bound_s'], 1e3)} | {_fmt(r['pskv_iter_per_s'])} | "
                    f"{_fmt(r['pskv_gbps'])} | {_fmt(r['mxnet_gbps'])} | {_fmt(r['numpy_bound_gbps'])} | "
                    f"{_x(r['pskv_over_mxnet'])} | {_spread(r['pskv_over_mxnet_by_round'])} | {_x(r['pskv_over_bound'])} |")
    pipe = ["| workload | pskv ms | MXNet ms | pskv/MXNet | pskv speedup from pipelining |",
            "|---|---:|---:|---:|---:|"]
    for r in rows:
        pipe.append(f"| {r['workload']} | {_fmt(r['pskv_pipelined_s'], 1e3)} | {_fmt(r['mxnet_pipelined_s'], 1e3)} | "
                    f"{_x(r['pipelined_pskv_over_mxnet'])} | {_x(_ratio(r['pskv_s'], r['pskv_pipelined_s']))} |")
    return "\n".join(main) + "\n\nPipelined (N iterations issued back-to-back, one wait at the end):\n\n" + "\n".join(pipe)


def target_lines(verdicts: Sequence[dict[str, Any]]) -> str:
    """One PASS/MISS line per target."""
    return "\n".join(f"  [{v['status']:>4}] {v['text']} (pskv/MXNet {_x(v['ratio'])}, by round {_spread(v['ratio_by_round'])})"
                     for v in verdicts)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str | None:
    """Output of a read-only git command in the checkout, or None."""
    try:
        out = subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def environment(settings: dict[str, Any]) -> dict[str, Any]:
    """Versions, machine facts, git state and pskv settings, taken before measuring (MXNet's come from its runner)."""
    import pskv
    from pskv.config import Config

    config = Config.from_env(**settings)
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "pskv": pskv.__version__,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "pskv_sources_modified": bool(_git("status", "--porcelain", "--", "pskv")),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_at_start": _load_average(),
        "pskv_config": asdict(config),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("PSKV_", "MXNET_", "OMP_", "MKL_", "OPENBLAS_"))},
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically (``PATH.tmp`` then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


# -- driver ---------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="pskv vs MXNet 1.9.1 local KVStore benchmark",
                                epilog=f"{ITERATION_DEFINITION}. {GBPS_DEFINITION}.")
    p.add_argument("--quick", action="store_true", help="fewer and shorter samples, one round (a smoke run)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"result file (default {DEFAULT_JSON.relative_to(REPO_DIR)})")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--no-mxnet", action="store_true", help="skip MXNet")
    group.add_argument("--require-mxnet", action="store_true", help="exit non-zero if MXNet cannot be run")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per workload and mode in each round (default 5, quick 3)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds over all systems (default 3, quick 1)")
    p.add_argument("--mxnet-venv", type=Path, default=Path(os.environ.get("MXNET_VENV", BENCH_DIR / ".venv-mxnet")),
                   help="MXNet venv (default $MXNET_VENV or bench/.venv-mxnet)")
    p.add_argument("--kernel-threads", type=int, default=None, help="pskv kernel_threads (default: pskv's default)")
    p.add_argument("--bound-threads", type=int, default=None, help="threads of the NumPy bound (default: usable CPUs, at most 8)")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.repeats < 1 or args.rounds < 1:
        p.error("--repeats and --rounds must be >= 1")
    return args


def default_bound_threads() -> int:
    """Usable CPUs, at most 8."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, usable))


class Runner:
    """Runs the rounds and accumulates every system's samples."""

    def __init__(self, args: argparse.Namespace, workloads: list[Workload], log: Callable[[str], None]) -> None:
        self.args = args
        self.workloads = workloads
        self.log = log
        self.settings = {} if args.kernel_threads is None else {"kernel_threads": args.kernel_threads}
        self.bound_threads = args.bound_threads or default_bound_threads()
        self.pskv: dict[str, dict[str, list[float]]] = {}
        self.bound: dict[str, dict[str, list[float]]] = {}
        self.mxnet: dict[str, dict[str, list[float]]] = {}
        self.mxnet_env: dict[str, Any] | None = None
        self.mxnet_error: str | None = None
        self.mxnet_python = None if args.no_mxnet else mxnet_python(args.mxnet_venv)
        if args.no_mxnet:
            self.mxnet_status = "not run: --no-mxnet"
        elif self.mxnet_python is None:
            self.mxnet_status = f"not run: no venv at {args.mxnet_venv}"
        else:
            self.mxnet_status = "pending"
        self.wall_s = 0.0
        self.env = environment(self.settings)  # before measuring: the commit and code that are measured

    def run(self) -> None:
        """All rounds: pskv, NumPy bound, then MXNet."""
        start = time.perf_counter()
        for r in range(self.args.rounds):
            self.log(f"round {r + 1}/{self.args.rounds}")
            self._round()
        self.wall_s = time.perf_counter() - start

    def _round(self) -> None:
        for w in self.workloads:
            self.log(f"  pskv   {w.name}")
            merge(self.pskv, w.name, measure_pskv(w, self.args.repeats, self.settings))
        for w in self.workloads:
            self.log(f"  numpy  {w.name}")
            merge(self.bound, w.name, measure_numpy_bound(w, self.args.repeats, self.bound_threads))
        if self.mxnet_python is None or self.mxnet_status.startswith("failed"):
            return
        self.log("  mxnet  (subprocess, all workloads)")
        try:
            out = measure_mxnet(self.mxnet_python, self.workloads, self.args.repeats)
        except (RuntimeError, OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
            self.mxnet_status = "failed (error in the log and the JSON)"
            self.mxnet_error = str(exc)
            self.log(f"MXNet run failed; no further MXNet rounds. {exc}")
            return
        self.mxnet_env = out["environment"]
        self.mxnet_status = "run"
        for name, result in out["results"].items():
            merge(self.mxnet, name, result["samples_s"])

    def payload(self) -> dict[str, Any]:
        """Everything that goes to the JSON file."""
        pskv, bound = summarise(self.pskv), summarise(self.bound)
        mxnet = summarise(self.mxnet) if self.mxnet else None
        rows = [summary_row(w, pskv, mxnet, bound, self.args.repeats) for w in self.workloads]
        return {
            "schema": "pskv-bench-local/1",
            "definitions": {"iteration": ITERATION_DEFINITION, "gbps": GBPS_DEFINITION,
                            "pskv_over_mxnet": "MXNet median time / pskv median time (throughput ratio)",
                            "pskv_over_bound": "NumPy-bound median time / pskv median time"},
            "settings": {"quick": self.args.quick, "rounds": self.args.rounds, "repeats_per_round": self.args.repeats,
                         "devices": DEVICES, "dtype": np.dtype(DTYPE).name, "bound_threads": self.bound_threads,
                         "wall_s": round(self.wall_s, 1)},
            "environment": {**self.env, "load_average_at_end": _load_average(),
                            "mxnet": self.mxnet_env, "mxnet_status": self.mxnet_status,
                            "mxnet_error": self.mxnet_error},
            "workloads": [{"name": w.name, "arrays": len(w.shapes), "elements": w.elements, "value_bytes": w.value_bytes,
                           "as_list": w.as_list, "iters_per_sample": w.iters, "warmup_iters": w.warmup}
                          for w in self.workloads],
            "results": {"pskv": pskv, "mxnet": mxnet, "numpy_bound": bound},
            "summary": rows,
            "targets": evaluate_targets(rows),
        }


def stderr_logger() -> Callable[[str], None]:
    """A progress logger to stderr (stdout holds only the report), stamped with seconds since now."""
    start = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", file=sys.stderr, flush=True)
    return log


def check_resnet_shapes(log: Callable[[str], None]) -> None:
    """Say so if the generated ResNet-50 differs from the reference count."""
    shapes = resnet50_shapes()
    arrays, elements = len(shapes), sum(math.prod(s) for s in shapes)
    if (arrays, elements) != (RESNET50_ARRAYS, RESNET50_ELEMENTS):
        log(f"note: ResNet-50 shapes give {arrays} arrays / {elements} elements, "
            f"reference is {RESNET50_ARRAYS} / {RESNET50_ELEMENTS}")


def print_report(payload: dict[str, Any], json_path: Path) -> None:
    """The header, both tables and the target verdicts, on stdout."""
    env, settings = payload["environment"], payload["settings"]
    mx_version = (env["mxnet"] or {}).get("mxnet", "-")
    samples = settings["rounds"] * settings["repeats_per_round"]
    print(f"\npskv {env['pskv']} vs MXNet {mx_version} ({env['mxnet_status']}); {env['cpu_count']} CPUs, "
          f"{env['cpu_model']}; {env['date_utc']}")
    print(f"{ITERATION_DEFINITION}.\n{GBPS_DEFINITION}. Medians of {samples} samples; "
          f"ratios > 1 mean pskv is faster.\n")
    print(markdown_tables(payload["summary"]))
    print("\nTargets (blocking medians):\n" + target_lines(payload["targets"]))
    print(f"\nraw samples and environment: {json_path} (measuring took {settings['wall_s']:.0f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the report, write the JSON."""
    args = parse_args(argv)
    log = stderr_logger()
    check_resnet_shapes(log)
    runner = Runner(args, make_workloads(args.quick), log)
    if not args.no_mxnet and runner.mxnet_python is None:
        log(missing_venv_message(args.mxnet_venv))
        if args.require_mxnet:
            log("--require-mxnet: stopping")
            return 2
        log("MXNet is marked 'not run'")
    runner.run()
    payload = runner.payload()
    write_json(args.json, payload)
    print_report(payload, args.json)
    if args.require_mxnet and runner.mxnet_status != "run":
        log(f"--require-mxnet: MXNet {runner.mxnet_status}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
