"""Server checkpoints: kv.save_checkpoint writes every server's shard atomically; a job
started with resume_from continues from it exactly (values, optimizer state, summed keys)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pskv
from pskv.checkpoints import latest_server_checkpoint as latest_checkpoint
from pskv.checkpoints import read_manifest
from pskv.optimizer import SGD
from pskv.partition import server_key
from pskv.server.snapshot import read_shard
from pskv.testing import InProcessCluster

DEADLINE = 30.0
N = 1_500_000  # split over the servers (bigarray bound 1e6)


def grads(step: int, rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    return {"w": rng.normal(size=N).astype(np.float32), "b": rng.normal(size=7).astype(np.float64)}


def train(kv, steps: range, save_at: frozenset[int] | set[int] = frozenset(), root: str | None = None) -> dict[str, np.ndarray]:
    """Init (kept on resume), SGD with momentum on the servers, deterministic gradients."""
    kv.set_optimizer(SGD(learning_rate=0.01, momentum=0.9, wd=1e-3))
    kv.init(["w", "b"], [np.ones(N, np.float32), np.zeros(7, np.float64)])
    kv.init("count", np.zeros(1, np.float64), summed=True)
    for step in steps:
        g = grads(step, kv.rank)
        kv.push(["w", "b", "count"], [g["w"], g["b"], np.ones(1)])
        if step in save_at:
            kv.save_checkpoint(meta={"step": step}) if root is None else kv.save_checkpoint(f"{root}/s{step}", {"step": step})
    return {k: kv.pull(k) for k in ("w", "b", "count")}


def run(fn, servers=2, workers=2, shm=1, **settings):
    with InProcessCluster(servers, workers, deadline=DEADLINE, shm=shm, **settings) as cluster:
        return cluster.run_stores(fn)


@pytest.mark.parametrize("shm", [0, 1])
def test_resuming_from_a_checkpoint_gives_the_uninterrupted_result(tmp_path, shm):
    reference = run(lambda kv: train(kv, range(6)), shm=shm)[0]

    root = str(tmp_path / "ckpts")
    run(lambda kv: train(kv, range(4), save_at={1, 3}), shm=shm, checkpoint_dir=root)
    latest = latest_checkpoint(root)
    assert latest is not None and latest.name == "ckpt-2"  # numbered in order
    manifest = read_manifest(latest)
    assert manifest["meta"] == {"step": 3} and manifest["num_servers"] == 2 and manifest["open_rounds"] == 0

    def resume(kv):
        assert kv.resumed["meta"] == {"step": 3}
        return train(kv, range(kv.resumed["meta"]["step"] + 1, 6))
    for got in run(resume, shm=shm, resume_from=str(latest)):
        for k in ("w", "b"):  # the same floats: values and momentum came back exactly
            np.testing.assert_array_equal(got[k], reference[k], err_msg=k)
        assert got["count"].tolist() == [2.0]  # still a summed key: the last round's plain sum, no SGD


def test_checkpoint_files_are_safetensors_and_json_with_every_part(tmp_path):
    run(lambda kv: train(kv, range(2), save_at={1}, root=str(tmp_path)), state_dir=str(tmp_path))
    directory = tmp_path / "s1"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["store"] == "dist_sync" and len(manifest["files"]) == 2
    parts = [p for rank in range(2) for p in read_shard(directory, rank).parts]
    assert sum(p.value.size for p in parts if p.dtype == "float32") == N  # w, split over both servers
    assert {p.round for p in parts} == {2}
    assert all(read_shard(directory, r).optimizer for r in range(2))  # state + config
    assert not list(directory.glob(".*tmp*"))  # no temporary files left


def test_a_directory_without_manifest_is_not_a_checkpoint_and_resume_refuses_it(tmp_path):
    run(lambda kv: train(kv, range(2), save_at={1}, root=str(tmp_path)), state_dir=str(tmp_path))
    (tmp_path / "s1" / "manifest.json").unlink()  # as if the save had crashed before the commit point
    with pytest.raises(pskv.CheckpointError, match="no manifest.json"):
        read_manifest(tmp_path / "s1")
    with InProcessCluster(2, 2, deadline=DEADLINE, resume_from=str(tmp_path / "s1")) as cluster:
        with pytest.raises(pskv.NodeFailedError, match="could not start: CheckpointError: .*no manifest.json"):
            cluster.run_workers(lambda cfg: pskv.create("dist_sync", cluster=cfg), timeout=3)
    assert any(isinstance(e, pskv.CheckpointError) for e in cluster.errors)


def test_resume_refuses_a_checkpoint_of_another_server_count(tmp_path):
    run(lambda kv: train(kv, range(1), save_at={0}, root=str(tmp_path)), state_dir=str(tmp_path))
    with InProcessCluster(3, 2, deadline=DEADLINE, resume_from=str(tmp_path / "s0")) as cluster:
        with pytest.raises(pskv.NodeFailedError, match="could not start: CheckpointError: .*written by 2 servers"):
            cluster.run_workers(lambda cfg: pskv.create("dist_sync", cluster=cfg), timeout=3)
    assert any("written by 2 servers" in str(e) for e in cluster.errors)


def test_init_that_does_not_fit_the_restored_value_fails_naming_the_key(tmp_path):
    run(lambda kv: train(kv, range(1), save_at={0}, root=str(tmp_path)), state_dir=str(tmp_path))

    def fn(kv):  # one worker: a failed init on worker 0 leaves the others at init's barrier
        with pytest.raises(pskv.RemoteError, match="ShapeMismatchError.*key") as info:
            kv.init("b", np.zeros(8, np.float64))
        return str(info.value)
    [text] = run(fn, workers=1, resume_from=str(tmp_path / "s0"))
    hashed = server_key("b")  # the user's name, with the server's key beside it, not the key alone
    assert f"of key 'b' (server key {hashed}): a part of 8 elements does not match the stored part of 7 elements" \
        in text, text
    assert f"of key {hashed}" not in text and f"init({hashed}" not in text and "shape" not in text, text


def test_save_checkpoint_needs_a_path_or_a_checkpoint_dir_and_json_meta(tmp_path):
    def fn(kv):
        with pytest.raises(pskv.InvalidArgumentError, match="PSKV_CHECKPOINT_DIR"):
            kv.save_checkpoint()
        with pytest.raises(pskv.InvalidArgumentError, match="JSON"):
            kv.save_checkpoint(str(tmp_path / "x"), meta=object())
        return kv.resumed
    assert run(fn) == [None, None]
    with pskv.create("local") as kv, pytest.raises(pskv.NotSupportedError):
        kv.save_checkpoint(str(tmp_path / "y"))
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_the_checkpoint_command_lists_verifies_and_names_the_newest(tmp_path, capsys):
    from pskv.cli import main

    root = tmp_path / "ckpts"
    run(lambda kv: train(kv, range(4), save_at={1, 3}), checkpoint_dir=str(root))
    assert main(["checkpoint", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(": ok, server checkpoint, dist_sync with 2 server(s)" in line for line in out), out
    assert '"step": 3' in out[1] and "newest" in out[1] and "newest" not in out[0]
    (root / "ckpt-2" / "server-1.safetensors").unlink()  # damaged: the older one is the newest usable now
    assert main(["checkpoint", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "NOT usable" in out[1] and "newest" in out[0], out
