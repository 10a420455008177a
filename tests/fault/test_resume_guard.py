"""A replacement worker cannot push a step twice by accident (issue 28, finding 6).

A replacement numbers its pushes on from those of its rank that reached the servers. A
program that goes on from its own progress file instead of ``kv.resume_step()`` would push
an applied step again under the next number, summed into a later round. Until it asked
``resume_step()``, its pushes (and pushpulls) of the keys its rank had pushed are refused on
the worker, before anything is sent, with an InvalidArgumentError naming ``kv.resume_step()``;
a replacement of a worker that never pushed a key goes on as usual.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pskv
from pskv.config import ClusterConfig
from pskv.kvstore.dist import DistStore
from pskv.optimizer import SGD
from pskv.testing.loopback import LoopbackNetwork
from pskv.worker import KVWorker
from tests.fault.launched import finals, launch_job

# argv: the step worker 1 dies at, right after its push returned (-1: never). Each worker
# keeps its own progress file: the step it pushes next, written before the push.
WORKER = """
import os, sys
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at = 8, int(sys.argv[1])
kv = pskv.create("dist_sync")
progress = f"progress-{kv.rank}"
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
kv.init(["w", "b"], [np.linspace(-1, 1, 300, dtype=np.float32), np.zeros(5)])
start = 0
if kv.is_recovery:
    start = int(open(progress).read())  # the step it had pushed last: it is in the servers' rounds already
    try:
        kv.push(["w", "b"], [np.ones(300, np.float32), np.ones(5)])
        print("replacement pushed without resume_step", flush=True)
    except pskv.InvalidArgumentError as exc:
        print(f"refused: {type(exc).__name__}: {exc}", flush=True)
    start = kv.resume_step()
    print(f"resume_step {start}", flush=True)
for step in range(start, steps):
    open(progress, "w").write(str(step))
    kv.push(["w", "b"], [np.cos(np.arange(300, dtype=np.float32) * (step + 1) + kv.rank), np.full(5, step + 1.0)])
    if kv.rank == 1 and step == crash_at and not kv.is_recovery:
        print("worker 1 dies", flush=True)
        os._exit(3)  # right after the push returned
    w, b = kv.pull("w"), kv.pull("b")
print(f"final {kv.rank} {float(w.astype(np.float64).sum())!r} {float(b.sum())!r} {w.tobytes().hex()[:64]}",
      flush=True)
kv.close()
"""


@pytest.mark.timeout(240)
def test_a_replacement_that_skips_resume_step_is_refused_and_the_job_stays_exact(tmp_path: Path) -> None:
    code, clean = launch_job(tmp_path / "a", WORKER, ["-1"], [], deadline=90.0)
    assert code == 0, clean
    reference = finals(clean)
    assert len(reference) == 2 and reference[0] == reference[1], clean

    code, out = launch_job(tmp_path / "b", WORKER, ["3"], ["--restart-workers", "1", "--recovery-timeout", "30"],
                           deadline=90.0)
    assert code == 0, out
    assert "worker 1 dies" in out and "replacement pushed without resume_step" not in out, out
    refused = re.search(r"refused: InvalidArgumentError: push of key '(w|b)': .*call kv\.resume_step\(\) first", out)
    assert refused, out
    assert "resume_step 4" in out, out
    assert finals(out) == reference, out  # the refused push reached no server: every round summed exactly once


# -- the guard, in process -----------------------------------------------------------------------
def _cluster() -> ClusterConfig:
    return ClusterConfig(num_servers=2, num_workers=1, role="worker", root_uri="127.0.0.1", root_port=1,
                         shm=0, heartbeat_interval=0, bigarray_bound=4)


def _replacement(monkeypatch: pytest.MonkeyPatch, pushes: int) -> tuple[DistStore, list[Any]]:
    """A replacement of a one-worker job's worker that had pushed ``w`` ``pushes`` times; its messages captured."""
    cluster = _cluster()
    network = LoopbackNetwork(cluster)
    kv = DistStore("dist_sync", None, cluster, worker=KVWorker(cluster, sync=True, client=network.client))
    kv.set_optimizer(SGD(learning_rate=1.0))  # every applied push changes w by -grad
    kv.init("w", np.zeros(8, np.float32))
    for _ in range(pushes):
        kv.push("w", np.ones(8, np.float32))
    kv._worker.client.close()  # the process is gone
    kv.close()

    monkeypatch.setattr("pskv.testing.loopback._WORKER", b"replacement")
    again = LoopbackNetwork(cluster, network.secret)  # a process of the same job ...
    again.cores = network.cores  # ... talking to the same servers
    network.client = again.client
    sent: list[Any] = []
    post = again.post

    def tap(target: int, frames: list[Any]) -> None:
        sent.append(frames)
        post(target, frames)
    again.post = tap  # type: ignore[method-assign]
    assert again.client.info is not None
    again.client.info = replace(again.client.info, recovery=True)
    again.client.rejoin(2, 5.0)
    store = DistStore("dist_sync", None, cluster, worker=KVWorker(cluster, sync=True, client=again.client))
    store.init("w", np.zeros(8, np.float32))  # registers only
    return store, sent


def test_a_replacement_of_a_worker_that_pushed_is_refused_until_resume_step(monkeypatch):
    kv, sent = _replacement(monkeypatch, 2)
    before = len(sent)
    with pytest.raises(pskv.InvalidArgumentError, match=r"push of key 'w'.*\(2 of them\).*kv\.resume_step\(\) first"):
        kv.push("w", np.ones(8, np.float32))
    with pytest.raises(pskv.InvalidArgumentError, match=r"pushpull of key 'w'.*kv\.resume_step\(\)"):
        kv.pushpull("w", np.ones(8, np.float32))
    assert len(sent) == before  # refused before anything was sent
    assert kv.pull("w").tolist() == [-2.0] * 8
    assert kv.resume_step() == 2
    assert "push" not in vars(kv) and "pushpull" not in vars(kv)  # asked: its own methods again
    kv.push("w", np.full(8, 3.0, np.float32))  # push number 3: applied
    assert kv.pull("w").tolist() == [-5.0] * 8
    kv.close()


def test_a_replacement_of_a_worker_that_never_pushed_pushes_as_usual(monkeypatch):
    kv, _ = _replacement(monkeypatch, 0)
    assert kv.is_recovery and "push" not in vars(kv)
    kv.push("w", np.ones(8, np.float32))  # step 0: nothing of it had arrived
    assert kv.pull("w").tolist() == [-1.0] * 8 and kv.push_count("w") == 1
    kv.close()


def test_a_store_that_is_no_replacement_has_no_guard():
    cluster = _cluster()
    network = LoopbackNetwork(cluster)
    kv = DistStore("dist_sync", None, cluster, worker=KVWorker(cluster, sync=True, client=network.client))
    kv.init("w", np.zeros(8, np.float32))
    kv.push("w", np.ones(8, np.float32))
    assert "push" not in vars(kv) and "pushpull" not in vars(kv)
    kv.close()
