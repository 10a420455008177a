"""Data-parallel training through a pskv 'local' store, on one machine.

A softmax-regression classifier is trained on a synthetic 10-class problem. Each
mini-batch is split over N simulated devices (NumPy replicas); every replica computes
its gradient, the store sums the N gradients and runs SGD with momentum on its stored
weights, and every replica pulls the new weights — the KVStore pattern MXNet's Module
used. At the end the same training is repeated on one device with the whole batch, to
show that data-parallel training through the store gives the same weights.

This is a single-process demo; distributed training (scheduler, servers, workers) is
the subject of pskv's parameter server.

Run:  python examples/local_data_parallel.py [--devices 4] [--epochs 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pskv
from pskv.optimizer import SGD


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.6, size=(classes, dim))
    y = rng.integers(0, classes, size=n)
    x = centers[y] + rng.normal(size=(n, dim))
    return x.astype(np.float64), y


def loss_and_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Summed cross-entropy over the slice and its gradients (summed, not averaged)."""
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum()
    p[np.arange(len(y)), y] -= 1.0
    return float(loss), x.T @ p, p.sum(axis=0)


def train(devices: int, epochs: int, batch: int, x: np.ndarray, y: np.ndarray,
          x_test: np.ndarray, y_test: np.ndarray, verbose: bool) -> dict[str, np.ndarray]:
    dim, classes = x.shape[1], int(y.max()) + 1
    kv = pskv.create("local")
    # rescale_grad turns the summed gradient of the global batch into its mean.
    kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=1e-4, rescale_grad=1.0 / batch))
    kv.init(["w", "b"], [np.zeros((dim, classes)), np.zeros(classes)])
    replicas = [{"w": kv.pull("w"), "b": kv.pull("b")} for _ in range(devices)]
    bounds = [batch * i // devices for i in range(devices + 1)]
    for epoch in range(epochs):
        start, total = time.perf_counter(), 0.0
        for lo in range(0, len(x) - batch + 1, batch):
            grads_w, grads_b = [], []
            for d, rep in enumerate(replicas):  # each "device" works on its slice
                xs = x[lo + bounds[d]: lo + bounds[d + 1]]
                ys = y[lo + bounds[d]: lo + bounds[d + 1]]
                loss, gw, gb = loss_and_grad(rep["w"], rep["b"], xs, ys)
                total += loss
                grads_w.append(gw)
                grads_b.append(gb)
            kv.push(["w", "b"], [grads_w, grads_b])  # summed over devices, then SGD in the store
            kv.pull(["w", "b"], out=[[r["w"] for r in replicas], [r["b"] for r in replicas]])
        if verbose:
            acc = float(((x_test @ replicas[0]["w"] + replicas[0]["b"]).argmax(1) == y_test).mean())
            print(f"epoch {epoch + 1}/{epochs}  train loss {total / len(x):.4f}  "
                  f"test accuracy {acc:.3f}  {len(x) / (time.perf_counter() - start):,.0f} samples/s")
    result = {"w": kv.pull("w"), "b": kv.pull("b")}
    kv.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=4, help="simulated devices the batch is split over (default 4)")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the 8,192 training samples (default 5)")
    parser.add_argument("--batch", type=int, default=64, help="samples per step, over all devices (default 64)")
    args = parser.parse_args()
    x_all, y_all = make_data(10240, 32, 10, seed=0)
    x, y, x_test, y_test = x_all[:8192], y_all[:8192], x_all[8192:], y_all[8192:]
    for option, value, low, high in (("--devices", args.devices, 1, None), ("--epochs", args.epochs, 1, None),
                                     ("--batch", args.batch, 1, len(x))):
        if value < low or (high is not None and value > high):
            parser.error(f"{option} must be >= {low}" + (f" and <= {high}" if high else "") + f", got {value}")
    print(f"pskv {pskv.__version__}: softmax regression, {len(x)} samples, batch {args.batch} "
          f"split over {args.devices} devices, SGD(momentum=0.9) running in a 'local' store")
    parallel = train(args.devices, args.epochs, args.batch, x, y, x_test, y_test, verbose=True)
    single = train(1, args.epochs, args.batch, x, y, x_test, y_test, verbose=False)
    diff = max(float(np.abs(parallel[k] - single[k]).max()) for k in parallel)
    acc = float(((x_test @ parallel["w"] + parallel["b"]).argmax(1) == y_test).mean())
    print(f"{args.devices} devices vs 1 device with the whole batch: max weight difference {diff:.2e}")
    print(f"final test accuracy {acc:.3f}")
    if diff > 1e-9:
        raise SystemExit("data-parallel result does not match single-device training")
    if acc < 0.9:
        raise SystemExit(f"test accuracy {acc:.3f} is below 0.9 (too few epochs or steps?)")


if __name__ == "__main__":
    main()
