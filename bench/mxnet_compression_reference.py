"""Record MXNet 1.9.1's 2-bit gradient compression on its 'device' store, for pskv's tests.

Run in the MXNet venv (``bash bench/setup_mxnet_venv.sh``)::

    bench/.venv-mxnet/bin/python bench/mxnet_compression_reference.py tests/data/mxnet_2bit_device.json

For each threshold: three devices push random float32 gradients into one key six times
(no updater: the store keeps the sum of what each device's compressed gradient decodes
to), and the value pulled after each push is recorded with the gradients.
``tests/unit/test_compression.py`` replays the pushes on pskv's 'device' store and
expects the same values, bit for bit.
"""

from __future__ import annotations

import json
import sys

import mxnet as mx
import numpy as np


def record(threshold: float, rounds: int = 6, devices: int = 3, size: int = 37, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    kv = mx.kv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    kv.init(3, mx.nd.zeros((size,)))
    grads, pulls = [], []
    for _ in range(rounds):
        g = [rng.uniform(-0.8, 0.8, size).astype(np.float32) for _ in range(devices)]
        kv.push(3, [mx.nd.array(x, ctx=mx.cpu(j)) for j, x in enumerate(g)])
        out = mx.nd.zeros((size,))
        kv.pull(3, out=out)
        grads.append([x.tolist() for x in g])
        pulls.append(out.asnumpy().tolist())
    return {"threshold": threshold, "grads": grads, "pulls": pulls}


def main() -> None:
    runs = [record(0.5), record(0.25, seed=8)]
    payload = {"mxnet": mx.__version__, "store": "device", "type": "2bit", "runs": runs}
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(payload, f)
    print(f"wrote {sys.argv[1]} (MXNet {mx.__version__})")


if __name__ == "__main__":
    main()
