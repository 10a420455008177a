"""pskv.parallel.Embedding through ``pskv launch -n 2 -s 2``: a Trainer fits an embedding (drawn on the
servers) plus an MLP with prefetching, and ends where the same global batches take a local store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROWS, DIM, FIELDS, CLASSES, N, BATCH, EPOCHS = 5000, 4, 3, 3, 96, 8, 2
INIT = {"type": "normal", "std": 0.3, "seed": 7}
PARAMS = {"learning_rate": 0.3, "momentum": 0.9}

COMMON = textwrap.dedent(f"""
    import numpy as np, torch
    from pskv.parallel import DataParallelExecutorGroup, Embedding, NDArrayIter, PrefetchingIter, Trainer

    def data():
        rng = np.random.default_rng(0)
        x = (rng.zipf(1.3, ({N}, {FIELDS})) - 1) % {ROWS}
        return x, x[:, 0] % {CLASSES}

    def net(kv):
        emb = Embedding({ROWS}, {DIM}, kv, "table", init={INIT!r}, dtype=torch.float64)
        mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear({FIELDS * DIM}, 8), torch.nn.Tanh(),
                                  torch.nn.Linear(8, {CLASSES})).double()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
        return emb, torch.nn.Sequential(emb, mlp)
""")

WORKER = COMMON + textwrap.dedent(f"""
    import json, pskv
    kv = pskv.create("dist_sync")
    emb, model = net(kv)
    group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
    trainer = Trainer(group, "sgd", {PARAMS!r}, kvstore=kv)
    x, y = data()
    train = NDArrayIter(x, y, batch_size={BATCH}, shuffle=True, seed=3, num_parts=2, part_index=kv.rank)
    history = trainer.fit(PrefetchingIter(train, {{emb: lambda b: b.data[0]}}), num_epoch={EPOCHS}, progress=False)
    trainer.close()
    stats = dict(emb.table.stats)  # before reading the table below
    rows = np.unique(x)
    out = {{"rank": kv.rank, "loss": [h["loss"] for h in history], "rows": rows.tolist(),
           "table": emb.table.rows(torch.from_numpy(rows)).tolist(), "stats": stats,
           "params": {{k: v.tolist() for k, v in group.get_params()[0].items()}}}}
    print("RESULT " + json.dumps(out), flush=True)
    kv.close()
""")


def reference() -> tuple[dict, np.ndarray]:
    """The same global batches on a local store: two replicas, replica r takes worker r's part."""
    scope: dict = {}
    exec(COMMON, scope)
    kv = pskv.create("local")
    emb, model = scope["net"](kv)
    group = DataParallelExecutorGroup(model, ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss(),
                                      data_shapes=[("data", (2 * BATCH, FIELDS))])
    trainer = Trainer(group, "sgd", PARAMS, kvstore=kv)
    x, y = scope["data"]()
    parts = [NDArrayIter(x, y, batch_size=BATCH, shuffle=True, seed=3, num_parts=2, part_index=r) for r in (0, 1)]
    for epoch in range(EPOCHS):
        for p in parts:
            p.set_epoch(epoch)
        for b0, b1 in zip(*parts):
            group.forward((np.concatenate([b0.data[0], b1.data[0]]), np.concatenate([b0.label[0], b1.label[0]])))
            group.backward()
            trainer.step()
    trainer.close()
    rows = np.unique(x)
    return {k: v.numpy() for k, v in group.get_params()[0].items()}, emb.table.rows(torch.from_numpy(rows)).numpy()


@pytest.mark.timeout(120)
def test_a_launched_job_fits_a_store_embedding_like_the_local_store():
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "90",
            "--", sys.executable, "-c", WORKER]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    results = [json.loads(ln.split("RESULT ", 1)[1]) for ln in out.splitlines() if "RESULT " in ln]
    assert sorted(r["rank"] for r in results) == [0, 1], out[-4000:]
    params, table = reference()
    for r in results:
        np.testing.assert_allclose(np.array(r["table"]), table, rtol=1e-9, atol=1e-12)
        for name, value in params.items():
            np.testing.assert_allclose(np.array(r["params"][name]), value, rtol=1e-9, atol=1e-12, err_msg=name)
        assert r["loss"][-1] < r["loss"][0]
        assert r["stats"]["prefetch_hits"] == EPOCHS * (N // 2 // BATCH - 1)  # all but each epoch's first batch
        assert r["stats"]["rows_pulled"] <= EPOCHS * (N // 2) * FIELDS  # at most the ids its batches held
