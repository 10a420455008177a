"""Step time of a model with a store-held embedding table, with and without prefetching the next batch's rows.

Run in a job (each worker prints one JSON line; rank 0's is the result)::

    pskv launch -n 2 -s 2 -- python bench/bench_embedding_prefetch.py --rows 1000000
    python bench/bench_embedding_prefetch.py --store local       # one process

Model: ``pskv.parallel.Embedding(rows, dim)`` on ``fields`` Zipf-distributed ids per sample,
concatenated into an MLP; SGD on the store (``Trainer``, one CPU replica). Each round
trains ``steps`` batches without and then with :class:`pskv.parallel.PrefetchingIter`
(a table of its own per mode, drawn on the servers), alternating ``rounds`` times; the
median step time per mode is reported, with the rows each step pulled in forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import pskv
from pskv.parallel import DataParallelExecutorGroup, Embedding, PrefetchingIter, Trainer


def batches(rng: np.random.Generator, n: int, batch: int, fields: int, rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for _ in range(n):
        ids = (rng.zipf(1.2, (batch, fields)) - 1) % rows
        out.append((ids.astype(np.int64), (ids[:, 0] % 2).astype(np.int64)))
    return out


def spin(ms: float) -> None:
    """Busy CPU work for ``ms`` milliseconds (holding the GIL in small slices, as Python data code does)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        sum(range(200))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="dist_sync")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--fields", type=int, default=8)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host-ms", type=float, default=0.0,
                    help="CPU work per step between step() and the next forward (a data pipeline), in ms")
    args = ap.parse_args()
    torch.set_num_threads(1)
    kv = pskv.create(args.store)
    rng = np.random.default_rng(kv.rank)
    samples: dict[str, list[float]] = {"plain": [], "prefetch": []}
    pulled: dict[str, float] = {"plain": 0, "prefetch": 0}
    waited: dict[str, float] = {"plain": 0.0, "prefetch": 0.0}
    for r in range(args.rounds):
        for mode in ("plain", "prefetch"):
            emb = Embedding(args.rows, args.dim, kv, f"emb-{mode}-{r}", init={"type": "normal", "std": 0.01, "seed": r})
            net = torch.nn.Sequential()
            net.add_module("emb", emb)
            net.add_module("flat", torch.nn.Flatten())
            net.add_module("mlp", torch.nn.Sequential(torch.nn.Linear(args.fields * args.dim, 256), torch.nn.ReLU(),
                                                      torch.nn.Linear(256, 2)))
            group = DataParallelExecutorGroup(net, ["cpu"], loss=torch.nn.CrossEntropyLoss())
            t = Trainer(group, "sgd", {"learning_rate": 0.1}, kvstore=kv, prefix=f"{mode}{r}/")
            data = batches(rng, args.steps + 1, args.batch, args.fields, args.rows)
            it = PrefetchingIter(data, {emb: lambda b: b[0]}) if mode == "prefetch" else data
            group.bind_exec([("data", (args.batch, args.fields))], [("label", (args.batch,))])
            start = None
            for i, batch in enumerate(it):
                if i == 1:  # the first step creates the optimizer and broadcasts: not timed
                    start = time.perf_counter()
                    before = emb.table.stats["rows_pulled"]
                    wait_before = emb.table.stats["pull_wait_s"]
                group.forward(batch)
                group.backward()
                t.step()
                spin(args.host_ms)
            assert start is not None
            samples[mode].append((time.perf_counter() - start) / args.steps)
            pulled[mode] += emb.table.stats["rows_pulled"] - before
            waited[mode] += emb.table.stats["pull_wait_s"] - wait_before
            t.close()
            group.close()
    result = {"store": args.store, "workers": kv.num_workers, "rows": args.rows, "dim": args.dim,
              "fields": args.fields, "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
              "host_ms": args.host_ms,
              "step_ms": {m: round(1000 * statistics.median(v), 2) for m, v in samples.items()},
              "samples_ms": {m: [round(1000 * s, 2) for s in v] for m, v in samples.items()},
              "rows_pulled_per_step": {m: round(n / (args.steps * args.rounds)) for m, n in pulled.items()},
              "forward_wait_ms_per_step": {m: round(1000 * w / (args.steps * args.rounds), 2) for m, w in waited.items()}}
    print(json.dumps({"rank": kv.rank, **result}), flush=True)
    kv.close()


if __name__ == "__main__":
    main()
