"""Record MXNet 1.9.1's lazy (row-sparse) optimizer updates on its 'local' store, for pskv's tests.

Run in the MXNet venv (``bash bench/setup_mxnet_venv.sh``)::

    bench/.venv-mxnet/bin/python bench/mxnet_lazy_reference.py tests/data/mxnet_lazy_local.json

For each optimizer: a row-sparse key holding every row of a random ``(rows, dim)`` float32
table, ``set_optimizer``, then pushes of two row-sparse gradients each (one per device,
rows overlapping, some steps without a row of the other, one step with no rows at all),
the whole table read back by ``row_sparse_pull`` after each push. MXNet applies its lazy
updates here (``sgd_mom_update``, ``adam_update``, ``_sparse_adagrad_update``,
``ftrl_update`` on row-sparse weight, state and gradient). One SGD run uses
``lazy_update=False`` (the dense update). ``tests/unit/test_lazy_update.py`` replays the
pushes on pskv's 'local' store.
"""

from __future__ import annotations

import json
import sys

import mxnet as mx
import numpy as np

ROWS, DIM = 10, 3
STEPS = [[0, 2, 3, 5, 6, 7, 8, 9, 1, 4], [2, 7], [], [1, 7, 8], [4]]
OPTIMIZERS = [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "rescale_grad": 0.5}),
    ("sgd", {"learning_rate": 0.2, "wd": 0.05}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "lazy_update": False}),
    ("adam", {"learning_rate": 0.05, "wd": 0.01, "rescale_grad": 2.0}),
    ("adagrad", {"learning_rate": 0.1, "eps": 1e-12}),  # eps sits inside the root in MXNet, outside in pskv
    ("ftrl", {"learning_rate": 0.2, "lamda1": 0.05, "beta": 1.0, "wd": 0.01}),
]


def record(name: str, params: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.array(table).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.create(name, **params))
    pushes, pulls = [], []
    for rows in STEPS:
        half = sorted(rows[: len(rows) // 2 + 1]) if rows else []
        values = []
        for ids in (sorted(rows), half):
            data = rng.standard_normal((len(ids), DIM)).astype(np.float32)
            values.append({"rows": ids, "data": data.tolist()})
        grads = [mx.nd.sparse.row_sparse_array((mx.nd.array(np.array(v["data"], np.float32).reshape(-1, DIM)),
                                                mx.nd.array(v["rows"], dtype="int64")), shape=(ROWS, DIM))
                 for v in values]
        kv.push(0, grads)
        out = mx.nd.sparse.zeros("row_sparse", (ROWS, DIM))
        kv.row_sparse_pull(0, out=out, row_ids=mx.nd.arange(ROWS, dtype="int64"))
        pushes.append(values)
        pulls.append(out.asnumpy().tolist())
    return {"optimizer": name, "params": params, "table": table.tolist(), "pushes": pushes, "pulls": pulls}


def main() -> None:
    runs = [record(name, params, seed) for seed, (name, params) in enumerate(OPTIMIZERS)]
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"mxnet": mx.__version__, "store": "local", "rows": ROWS, "dim": DIM, "runs": runs}, f)
    print(f"wrote {sys.argv[1]} (MXNet {mx.__version__})")


if __name__ == "__main__":
    main()
