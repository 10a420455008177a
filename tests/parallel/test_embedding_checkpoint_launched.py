"""Training checkpoints with embedding tables through ``pskv launch -n 2 -s 2``: a job resumed from a
training checkpoint, started from its ``servers/`` (``PSKV_RESUME_FROM``), ends with the floats of the
job that never stopped (tests/parallel/test_embedding_checkpoint.py has the in-process tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pskv.checkpoints import mark_latest_training  # noqa: E402

V, D, L, C = 60, 4, 3, 3
DRAWN = {"type": "normal", "std": 0.5, "seed": 4}
LAUNCHED = textwrap.dedent(f"""
    import json, os, sys
    import numpy as np, torch, pskv
    from pskv.parallel import DataParallelExecutorGroup, Embedding, NDArrayIter, Trainer

    epochs, root = int(sys.argv[1]), sys.argv[2]
    kv = pskv.create("dist_sync")
    emb = Embedding({V}, {D}, kv, "table", init={DRAWN!r}, dtype=torch.float64)
    model = torch.nn.Sequential(emb, torch.nn.Flatten(), torch.nn.Linear({L * D}, {C}).double())
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model[2].parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64) * 0.3)
    group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
    trainer = Trainer(group, "adam", {{"learning_rate": 0.05}}, kvstore=kv)
    rng = np.random.default_rng(5)
    x = rng.integers(0, {V}, (64, {L}))
    data = NDArrayIter(x, x[:, 1] % {C}, batch_size=8, shuffle=True, seed=3, num_parts=2, part_index=kv.rank)
    history = trainer.fit(data, num_epoch=epochs, progress=False, checkpoint_dir=root,
                          resume=bool(os.environ.get("PSKV_RESUME_FROM")))
    trainer.close()
    out = {{"rank": kv.rank, "epochs": [h["epoch"] for h in history],
           "table": emb.table.rows(torch.arange({V})).tolist(),
           "params": {{k: v.tolist() for k, v in group.get_params()[0].items()}}}}
    print("RESULT " + json.dumps(out), flush=True)
    kv.close()
""")


def launch(tmp_path, epochs: int, root: str, resume_from: str = "") -> list[dict]:
    repo = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "60",
            "--", sys.executable, "-c", LAUNCHED, str(epochs), root]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("PSKV_RESUME_FROM", None)
    if resume_from:
        env["PSKV_RESUME_FROM"] = resume_from
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=100, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    results = sorted((json.loads(ln.split("RESULT ", 1)[1]) for ln in out.splitlines() if "RESULT " in ln),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1], out[-4000:]
    return results


@pytest.mark.timeout(200)
def test_a_launched_job_resumes_its_table_from_a_training_checkpoint_bitwise(tmp_path):
    """pskv launch -n 2 -s 2: 2 epochs with a checkpoint after each; then a job started with
    PSKV_RESUME_FROM=<epoch 1's checkpoint>/servers resumes from it for the second: the first job's floats.
    (Resuming from a checkpoint that is not the newest: ``mark_latest_training`` names it.)"""
    want = launch(tmp_path, 2, "ckpt")
    first = tmp_path / "ckpt" / "epoch-0000"
    assert (tmp_path / "ckpt" / "epoch-0001").is_dir()  # the newest one, which the resumed job must not take
    mark_latest_training(tmp_path / "ckpt", first)  # resume from the first epoch's checkpoint
    got = launch(tmp_path, 2, "ckpt", resume_from=str(first / "servers"))
    for r, w in zip(got, want):
        assert r["epochs"] == [1] and w["epochs"] == [0, 1]
        assert r["table"] == w["table"] and r["params"] == w["params"]
