"""Distributed data-parallel training through pskv's parameter server.

Run it under the launcher (scheduler, servers and workers on this machine):

    pskv launch -n 2 -s 2 -- python examples/dist_data_parallel.py

A softmax-regression classifier is trained on a synthetic 10-class problem. Every
worker takes its share of each global mini-batch, computes the gradient of its share,
and pushes it; the servers sum the workers' gradients and run SGD with momentum (the
optimizer travels to them as a JSON config); every worker then pulls the new weights.
At the end rank 0 repeats the training in one process with the whole batch and checks
that the distributed result is the same (with a synchronous store: an asynchronous one's
result depends on the order the pushes arrive in) and that the test accuracy is >= 0.9.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pskv
from pskv.errors import InvalidArgumentError
from pskv.optimizer import SGD

LR, MOMENTUM, WD = 0.1, 0.9, 1e-4


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.6, size=(classes, dim))
    y = rng.integers(0, classes, size=n)
    return (centers[y] + rng.normal(size=(n, dim))).astype(np.float64), y


def gradients(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Summed cross-entropy over the slice and its (summed) gradients."""
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum()
    p[np.arange(len(y)), y] -= 1.0
    return float(loss), x.T @ p, p.sum(axis=0)


def train(kv: pskv.KVStoreBase, rank: int, workers: int, x: np.ndarray, y: np.ndarray, batch: int,
          epochs: int, report: bool, x_test: np.ndarray, y_test: np.ndarray) -> dict[str, np.ndarray]:
    dim, classes = x.shape[1], int(y.max()) + 1
    kv.set_optimizer(SGD(learning_rate=LR, momentum=MOMENTUM, wd=WD, rescale_grad=1.0 / batch))
    kv.init(["w", "b"], [np.zeros((dim, classes)), np.zeros(classes)])
    w, b = kv.pull("w"), kv.pull("b")
    lo_share, hi_share = batch * rank // workers, batch * (rank + 1) // workers
    for epoch in range(epochs):
        start, total = time.perf_counter(), 0.0
        for lo in range(0, len(x) - batch + 1, batch):
            xs, ys = x[lo + lo_share: lo + hi_share], y[lo + lo_share: lo + hi_share]
            loss, gw, gb = gradients(w, b, xs, ys)
            total += loss
            kv.push(["w", "b"], [gw, gb])  # summed over workers, then SGD on the servers
            kv.pull(["w", "b"], out=[w, b])
        if report:
            acc = float(((x_test @ w + b).argmax(1) == y_test).mean())
            print(f"epoch {epoch + 1}/{epochs}  worker-0 loss {total / (len(x) / workers):.4f}  "
                  f"test accuracy {acc:.3f}  {len(x) / (time.perf_counter() - start):,.0f} samples/s", flush=True)
    return {"w": w, "b": b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5, help="passes over the 8,192 training samples (default 5)")
    parser.add_argument("--batch", type=int, default=64, help="global batch: samples per step over all workers "
                                                              "(default 64)")
    parser.add_argument("--store", default="dist_sync",
                        help="store type (default dist_sync); the final check that the result equals one "
                             "process's applies to synchronous stores only")
    args = parser.parse_args()
    x_all, y_all = make_data(10240, 32, 10, seed=0)
    x, y, x_test, y_test = x_all[:8192], y_all[:8192], x_all[8192:], y_all[8192:]
    for option, value, high in (("--epochs", args.epochs, None), ("--batch", args.batch, len(x))):
        if value < 1 or (high is not None and value > high):
            parser.error(f"{option} must be >= 1" + (f" and <= {high}" if high else "") + f", got {value}")

    try:
        kv = pskv.create(args.store)
    except InvalidArgumentError as exc:  # an unknown type; a dist_* store outside pskv launch
        parser.error(str(exc))
    rank, workers, sync = kv.rank, kv.num_workers, kv.store_type.sync
    if rank == 0:
        print(f"pskv {pskv.__version__}: {workers} workers, store {kv.type!r}, softmax regression on "
              f"{len(x)} samples, global batch {args.batch}, SGD(momentum={MOMENTUM}) on the servers", flush=True)
    result = train(kv, rank, workers, x, y, args.batch, args.epochs, rank == 0, x_test, y_test)
    kv.close()

    if rank == 0:
        with pskv.create("local") as local:
            single = train(local, 0, 1, x, y, args.batch, args.epochs, False, x_test, y_test)
        diff = max(float(np.abs(result[k] - single[k]).max()) for k in result)
        acc = float(((x_test @ result["w"] + result["b"]).argmax(1) == y_test).mean())
        print(f"{workers} workers vs 1 process with the whole batch: max weight difference {diff:.2e}", flush=True)
        print(f"final test accuracy {acc:.3f}", flush=True)
        if diff > 1e-9 and sync:  # an asynchronous store's result depends on the order the pushes came in
            raise SystemExit("distributed result does not match single-process training")
        if acc < 0.9:
            raise SystemExit(f"test accuracy {acc:.3f} is below 0.9 (too few epochs or steps?)")


if __name__ == "__main__":
    main()
