"""Models, data and checks shared by the two worker scripts of ``bench/bench_train.py``.

Both sides (pskv and PyTorch DDP) build exactly the same thing from this module:

* the **models** — ``mlp`` and ``cnn`` are copies of ``mlp()`` / ``cnn()`` in
  ``examples/train_digits.py`` (kept in sync by hand; the benchmark must not depend on
  an example's command line), ``mlp_large`` a 784-1024-1024-10 MLP (1.86 M parameters,
  7.5 MB of gradients per step: the bandwidth-bound row);
* the **data** — scikit-learn's 1,797 handwritten digits (8x8, scaled to [0, 1]) for
  ``mlp`` and ``cnn``; for ``mlp_large`` a fixed synthetic set of 4,096 784-dimensional
  inputs in 10 Gaussian clusters (class centroids ~ N(0, 0.25), unit noise: learnable,
  so the loss must fall). The set is shuffled with a fixed seed and dealt out by worker
  rank (``rank::world``); each worker cycles through its own full batches of ``batch``
  samples, already as tensors (no data loader in the timed loop);
* the **initial parameters** — ``torch.manual_seed(INIT_SEED)`` before building the
  model, on every worker of every system;
* the **optimizer** — SGD with momentum (``torch.optim.SGD`` on DDP, pskv's ``sgd`` on
  the servers: the same update, ``buf = m * buf + g; w -= lr * buf``) and the loss
  ``CrossEntropyLoss(reduction='mean')``, averaged over the global batch on both sides.

So the two systems compute the same training run, up to floating-point summation
order; the driver checks that their first losses agree (see :func:`loss_trajectory`).

It also holds the workers' side of the driver's **run tokens** (:class:`Gate`) and the
phases every worker goes through (:func:`run_models`): all clusters run at the same
time, but a cluster works only while it holds the token, so the systems' timed samples
alternate a second or so apart and no two clusters ever compute at once.

Imports torch, NumPy and (for the digits) scikit-learn; not pskv.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

INIT_SEED = 1234   # torch.manual_seed before building a model: same initial parameters everywhere
DATA_SEED = 7      # shuffle of the data set before it is dealt out to the workers
PROBE_STEPS = 10   # steps with the loss recorded, before the warm-up and after the last sample


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model with its data and optimizer.

    Attributes:
        id: short name (``--models``, JSON).
        name: label in the table.
        data: ``digits`` or ``synthetic784``.
        learning_rate, momentum: SGD hyperparameters (both systems).
        batch: samples per worker per step.
        iters: steps per timed sample (full run); ``--quick`` divides it.
        warmup: untimed steps before the first sample (full run).
        probe: steps with the loss recorded at the start and at the end (the checks).
    """

    id: str
    name: str
    data: str
    learning_rate: float
    momentum: float
    batch: int
    iters: int
    warmup: int
    probe: int = PROBE_STEPS

    def build(self) -> Any:
        """The model, with the shared initial parameters."""
        import torch

        torch.manual_seed(INIT_SEED)
        return FACTORIES[self.id]()


def mlp() -> Any:
    """``examples/train_digits.py``'s MLP: 64-128-64-10 (17,226 parameters)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def cnn() -> Any:
    """``examples/train_digits.py``'s CNN: two 3x3 convolutions, max-pool, two dense layers (38,282 parameters)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def mlp_large() -> Any:
    """784-1024-1024-10 MLP (1,863,690 parameters, 7.5 MB of float32 gradients)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


def resnet18() -> Any:
    """ResNet-18 for 32x32 inputs (11,173,962 parameters, 44.7 MB of float32 gradients).

    He et al.'s 18-layer layout (four stages of two basic blocks, 64-128-256-512 channels,
    batch norm, 1x1 projection shortcuts where the shape changes, global average pool,
    one dense layer) with the usual CIFAR stem: a 3x3 stride-1 first convolution and no
    max-pool, so the first stage sees 32x32 (torchvision's ``resnet18`` with that stem
    and 10 classes; written out here so that the benchmark needs no torchvision).
    """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                             if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))

    layers: list[Any] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


FACTORIES = {"mlp": mlp, "cnn": cnn, "mlp_large": mlp_large, "resnet18": resnet18}

MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", "MLP 64-128-64-10 (digits)", "digits", 0.1, 0.9, 32, 250, 50),
    "cnn": ModelSpec("cnn", "CNN 2 conv + 2 dense (digits)", "digits", 0.1, 0.9, 32, 60, 15),
    "mlp_large": ModelSpec("mlp_large", "MLP 784-1024-1024-10 (synthetic)", "synthetic784", 0.01, 0.9, 32, 25, 8),
    "resnet18": ModelSpec("resnet18", "ResNet-18 (synthetic 3x32x32)", "synthetic3x32", 0.01, 0.9, 8, 2, 1, 4),
}


@functools.cache
def _dataset(kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # N, 1, 8, 8
        return x, digits.target.astype(np.int64)
    if kind == "synthetic784":
        rng = np.random.default_rng(11)
        y = rng.integers(0, 10, 4096).astype(np.int64)
        centroids = 0.5 * rng.standard_normal((10, 784), dtype=np.float32)
        return centroids[y] + rng.standard_normal((4096, 784), dtype=np.float32), y
    if kind == "synthetic3x32":
        rng = np.random.default_rng(13)
        y = rng.integers(0, 10, 1024).astype(np.int64)
        centroids = rng.standard_normal((10, 3, 32, 32), dtype=np.float32)
        return centroids[y] + rng.standard_normal((1024, 3, 32, 32), dtype=np.float32), y
    raise ValueError(f"unknown data set {kind!r}")


def worker_batches(spec: ModelSpec, rank: int, world: int) -> list[tuple[Any, Any]]:
    """This worker's full batches ``(x, y)`` as tensors: the shuffled set dealt out by rank."""
    import torch

    x, y = _dataset(spec.data)
    order = np.random.default_rng(DATA_SEED).permutation(len(x))[rank::world]
    n = len(order) // spec.batch
    return [(torch.from_numpy(np.ascontiguousarray(x[order[i * spec.batch:(i + 1) * spec.batch]])),
             torch.from_numpy(np.ascontiguousarray(y[order[i * spec.batch:(i + 1) * spec.batch]])))
            for i in range(n)]


def param_digest(params: Any) -> dict[str, Any]:
    """SHA-256 of the parameters' bytes (in order) plus their float64 sum: equal on all workers iff in sync."""
    h = hashlib.sha256()
    total = 0.0
    count = 0
    for p in params:
        a = p.detach().cpu().contiguous().numpy()
        h.update(a.tobytes())
        total += float(a.astype(np.float64).sum())
        count += a.size
    return {"sha256": h.hexdigest(), "sum": total, "elements": count}


def preload(spec: dict[str, Any]) -> None:
    """Build the spec's data sets now (imports scikit-learn), before the worker joins the token server:
    the clusters' start-up overlaps, the gated phases then do only per-model work."""
    for work in spec["models"]:
        _dataset(MODELS[work["id"]].data)


class StepSplit:
    """Where a worker's timed steps (``train``, not the probes) spend their time: forward (with the loss),
    backward (with what the system does in its gradient hooks), and the rest (pskv: ``trainer.step()``,
    waiting for the new weights; DDP: ``opt.step()``, DDP's all-reduce having finished in backward)."""

    def __init__(self) -> None:
        self.steps = 0
        self.wall = [0.0, 0.0, 0.0]
        self.cpu = [0.0, 0.0, 0.0]
        self.process_cpu = 0.0

    def add(self, *seconds: float) -> None:
        """One step's three parts' wall times, the main thread's CPU times, then the whole process's
        CPU time (all its threads), in seconds."""
        self.steps += 1
        for k in range(3):
            self.wall[k] += seconds[k]
            self.cpu[k] += seconds[3 + k]
        self.process_cpu += seconds[6]

    def json(self) -> dict[str, Any]:
        """Mean milliseconds per step of each part (wall time and the main thread's CPU time) and of
        the process's CPU time."""
        n = max(1, self.steps)
        out: dict[str, Any] = {"steps": self.steps, "process_cpu_ms": 1e3 * self.process_cpu / n}
        for k, name in enumerate(("forward", "backward", "step")):
            out[f"{name}_ms"] = 1e3 * self.wall[k] / n
            out[f"{name}_cpu_ms"] = 1e3 * self.cpu[k] / n
        return out


class Cycle:
    """Endless iteration over a worker's batches (the same sequence on every system)."""

    def __init__(self, batches: list[tuple[Any, Any]]) -> None:
        self.batches = batches
        self.i = 0

    def next(self) -> tuple[Any, Any]:
        """The next batch."""
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        return b


def loss_trajectory(first: list[float], other: list[float]) -> float:
    """Largest absolute difference between two systems' recorded losses, step by step."""
    return max((abs(a - b) for a, b in zip(first, other)), default=float("inf"))


# -- run tokens and phases --------------------------------------------------------------------
class Gate:
    """A worker's line protocol with the driver's token server (``PSKV_BENCH_GATE=host:port``).

    ``hello LABEL RANK`` once; then per phase ``ready PHASE``, wait for ``go``, run it, and
    ``done PHASE [VALUE]``. Without the variable every phase runs at once (a worker started
    by hand).
    """

    def __init__(self, label: str, rank: int) -> None:
        addr = os.environ.get("PSKV_BENCH_GATE")
        self._sock: socket.socket | None = None
        if addr:
            host, port = addr.rsplit(":", 1)
            self._sock = socket.create_connection((host, int(port)), timeout=None)
            self._reader = self._sock.makefile("r", encoding="ascii")
            self._send(f"hello {label} {rank}")

    def _send(self, line: str) -> None:
        assert self._sock is not None
        self._sock.sendall((line + "\n").encode("ascii"))

    def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` when the driver says go; returns its result."""
        if self._sock is None:
            return fn()
        self._send(f"ready {name}")
        answer = self._reader.readline().strip()
        if answer != "go":
            raise RuntimeError(f"gate: expected 'go' for {name}, got {answer!r}")
        result = fn()
        self._send(f"done {name}" + (f" {result:.9f}" if isinstance(result, float) else ""))
        return result

    def close(self) -> None:
        """Say goodbye (the driver then expects the process to exit)."""
        if self._sock is not None:
            self._send("bye")
            self._sock.close()
            self._sock = None


class TrainJob(Protocol):
    """One model being trained by one worker of a system."""

    def train(self, n: int) -> None:
        """``n`` complete steps."""

    def probe(self, n: int) -> list[float]:
        """``n`` steps, returning each step's mean loss over the worker's batch."""

    def final_params(self) -> Any:
        """The parameters, in order, after the last step (synchronised)."""

    def close(self) -> dict[str, Any]:
        """Release the model; returns extra facts for the JSON."""


def run_models(spec: dict[str, Any], gate: Gate, barrier: Callable[[], None],
               make_job: Callable[[ModelSpec], TrainJob]) -> dict[str, Any]:
    """Every model of the driver's spec, phase by phase, each phase when the driver says go.

    Per model: ``prep`` (build, first probe, warm-up), ``samples`` timed samples (each:
    barrier, then ``iters`` steps; seconds per step), ``final`` (last probe, barrier,
    parameter digest). Returns the per-model results for the JSON line.
    """
    results: dict[str, Any] = {}
    for work in spec["models"]:
        mid, iters, probe = work["id"], int(work["iters"]), int(work.get("probe", PROBE_STEPS))
        state: dict[str, Any] = {}

        def prep(mid: str = mid, work: dict[str, Any] = work, state: dict[str, Any] = state, probe: int = probe) -> None:
            started = time.perf_counter()
            job = make_job(MODELS[mid])
            barrier()
            state.update(job=job, first=job.probe(probe))
            job.train(max(1, int(work["warmup"])))
            state["prep_s"] = time.perf_counter() - started

        def sample(iters: int = iters, state: dict[str, Any] = state) -> float:
            barrier()
            start = time.perf_counter()
            state["job"].train(iters)
            return (time.perf_counter() - start) / iters

        def final(state: dict[str, Any] = state, probe: int = probe) -> None:
            job = state["job"]
            state["last"] = job.probe(probe)
            barrier()
            state["digest"] = param_digest(job.final_params())
            state["extra"] = job.close()

        gate.phase(f"prep:{mid}", prep)
        samples = [gate.phase(f"sample:{mid}:{k}", sample) for k in range(int(spec["samples"]))]
        gate.phase(f"final:{mid}", final)
        results[mid] = {"samples_s": samples, "iters": iters, "warmup": int(work["warmup"]),
                        "first_losses": state["first"], "last_losses": state["last"],
                        "final_params": state["digest"],
                        "steps": 2 * probe + int(work["warmup"]) + iters * len(samples),
                        "prep_s": state["prep_s"], **state["extra"]}
    return results
