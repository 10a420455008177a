"""pskv launch --restart-workers: a worker that dies mid-training is started again alone,
rejoins the running job (kv.is_recovery) while the others wait in their sync rounds, learns
from the servers which of its rank's pushes arrived (kv.resume_step), and the job ends with
the values of a run without the crash — also when it died right after a push returned.

A push is applied at most once per (worker, key, push number): a captured push message
sent again (from another connection or the same one) changes nothing."""

from __future__ import annotations

import logging
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
from pskv.protocol import ArraySpec, Command, Header, decode, encode
from pskv.protocol.bodies import Hello
from pskv.testing.loopback import LoopbackNetwork
from pskv.worker import KVWorker
from tests.fault.launched import finals, launch_job

# argv: the step worker 1 dies at (-1: never), "before" or "after" its push of that step
WORKER = """
import os, sys
os.environ["MXNET_KVSTORE_BIGARRAY_BOUND"] = "1000"  # w is split over both servers
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at, when = 10, int(sys.argv[1]), sys.argv[2]
kv = pskv.create("dist_sync")
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))    # a replacement keeps the servers' optimizer
kv.init(["w", "b"], [np.linspace(-1, 1, 3000, dtype=np.float32), np.zeros(5)])  # a replacement only registers
start = kv.resume_step()  # 0, or in a replacement: the steps of this rank whose pushes reached the servers
if kv.is_recovery:
    print(f"rejoined at step {start} with w[-1] = {float(kv.pull('w')[-1])!r}", flush=True)
for step in range(start, steps):
    dies = kv.rank == 1 and step == crash_at and not kv.is_recovery
    if dies and when == "before":
        print("worker 1 dies", flush=True)
        os._exit(3)  # before pushing this step: worker 0's round waits for the replacement
    kv.push(["w", "b"], [np.cos(np.arange(3000, dtype=np.float32) * (step + 1) + kv.rank), np.full(5, step + 1.0)])
    if dies:
        print("worker 1 dies", flush=True)
        os._exit(3)  # right after the push returned: it is in its round; the replacement must not push it again
    w, b = kv.pull("w"), kv.pull("b")
    print(f"after {step} {kv.rank} {float(w[-1])!r}", flush=True)
print(f"final {kv.rank} {float(w.astype(np.float64).sum())!r} {float(b.sum())!r} {w.tobytes().hex()[:64]}",
      flush=True)
kv.close()
"""


def launch(tmp: Path, crash_at: int, when: str, *extra: str) -> tuple[int, str]:
    return launch_job(tmp, WORKER, [str(crash_at), when], extra, deadline=90.0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, str], dict[int, str]]:
    """The crash-free run: both workers' final values, and w[-1] (of w's part on server 1) after each step."""
    code, clean = launch(tmp_path_factory.mktemp("clean"), -1, "after")
    assert code == 0, clean
    values = finals(clean)
    assert len(values) == 2 and values[0] == values[1]
    return values, {int(m.group(1)): m.group(2) for m in re.finditer(r"\[worker 1\] after (\d+) 1 (\S+)", clean)}


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("crash_at", "when", "resumes_at"), [(4, "before", 4), (6, "after", 7), (0, "after", 1)])
def test_a_dead_worker_is_replaced_and_the_job_ends_as_without_the_crash(tmp_path, reference, crash_at, when,
                                                                        resumes_at):
    code, out = launch(tmp_path, crash_at, when, "--restart-workers", "1", "--recovery-timeout", "30")
    assert code == 0, out
    assert "worker 1 dies" in out
    assert "worker 1 on 127.0.0.1 exited with code 3; starting it again (1 of at most 1 worker restarts)" in out, out
    final, after = reference
    # the servers told it which of its pushes had arrived; its first pull has the values after the last of them
    assert f"rejoined at step {resumes_at} with w[-1] = {after[resumes_at - 1]}\n" in out, out
    assert finals(out) == final, out  # every round got both workers' pushes, exactly once


@pytest.mark.timeout(120)
def test_a_second_failure_beyond_the_budget_ends_the_job(tmp_path):
    code, out = launch(tmp_path, 2, "before", "--restart-workers", "0")
    assert code == 3, out
    assert "starting it again" not in out and "worker 1 on 127.0.0.1 exited with code 3; stopping the job" in out, out


# -- a push is applied at most once per (worker, key, push number) --------------------------
def _tapped_store(num_servers: int = 2) -> tuple[DistStore, LoopbackNetwork, list[tuple[int, bytes, list[bytes]]]]:
    """A one-worker loopback store (w split over the servers) whose messages to the servers are captured."""
    cluster = ClusterConfig(num_servers=num_servers, num_workers=1, role="worker", root_uri="127.0.0.1", root_port=1,
                            shm=0, heartbeat_interval=0, bigarray_bound=4)
    network = LoopbackNetwork(cluster)
    captured: list[tuple[int, bytes, list[bytes]]] = []
    post = network.post

    def tap(target: int, frames: list[Any]) -> None:
        if target >= 0:
            captured.append((target, b"loopback-worker", [bytes(memoryview(f).cast("B")) for f in frames]))
        post(target, frames)
    network.post = tap  # type: ignore[method-assign]
    kv = DistStore("dist_sync", None, cluster, worker=KVWorker(cluster, sync=True, client=network.client))
    kv.set_optimizer(SGD(learning_rate=1.0))  # every applied push changes w by -grad
    kv.init("w", np.zeros(8, np.float32))
    return kv, network, captured


def _pushes(captured: list[tuple[int, bytes, list[bytes]]]) -> list[tuple[int, list[bytes]]]:
    return [(t, f) for t, _, f in captured if decode(f)[0].command in (Command.PUSH, Command.PUSHPULL)]


def _hello(sender: int, token: str) -> list[bytes]:
    """A HELLO as worker ``sender``'s new session opens with (its token from the job)."""
    return encode(Header(Command.HELLO, 7, sender, body=Hello("0123456789abcdef", token).encode()))


def test_a_replayed_push_message_is_not_applied_again(caplog):
    kv, network, captured = _tapped_store()
    kv.push("w", np.ones(8, np.float32))
    kv.pushpull("w", np.full(8, 2.0, np.float32), out=np.empty(8, np.float32))
    assert kv.pull("w").tolist() == [-3.0] * 8
    replays = _pushes(captured)
    assert len(replays) == 4  # two pushes, each one message per server
    caplog.set_level(logging.WARNING, "pskv.server")
    sender = kv._worker.client.node_id
    for core in network.cores:  # a new connection that opens as a worker session does (HELLO, its token) ...
        core.handle(b"a-replayer", _hello(sender, network.client.info.token))
    for target, frames in replays:  # ... sends the captured bytes again; the same connection under new request ids
        network.cores[target].handle(b"a-replayer", frames)
        header, buffers = decode(frames)
        network.cores[target].handle(b"loopback-worker", encode(header._replace(request=10**6 + header.request),
                                                                [bytes(b) for b in buffers]))
    assert kv.pull("w").tolist() == [-3.0] * 8  # not applied twice (neither connection's request ids were seen)
    assert "had arrived already" in caplog.text
    kv.push("w", np.ones(8, np.float32))  # the worker's own next push is applied as usual
    assert kv.pull("w").tolist() == [-4.0] * 8 and kv.push_count("w") == 3
    kv.close()


def test_a_push_numbered_far_ahead_is_refused_and_changes_nothing():
    kv, network, _ = _tapped_store(num_servers=1)
    kv.push("w", np.ones(8, np.float32))
    replies: list[list[bytes]] = []
    core = network.cores[0]
    send = core._send  # type: ignore[attr-defined]
    core._send = lambda identity, frames: replies.append(frames) if identity == b"x" else send(identity, frames)  # type: ignore[attr-defined]
    sender = kv._worker.client.node_id
    core.handle(b"x", _hello(sender, network.client.info.token))
    spec = ArraySpec(kv._keys["w"].skey, "float32", (8,), 0, 10**9)
    core.handle(b"x", encode(Header(Command.PUSH, 99, sender, (spec,)), [np.ones(8, np.float32)]))
    reply = replies[-1]
    assert decode(reply)[0].command is Command.ERROR and b"push number 1000000000" in bytes(reply[0])
    assert f"push of key 'w' (server key {spec.key}): push number".encode() in bytes(reply[0])  # as the user wrote it
    assert kv.pull("w").tolist() == [-1.0] * 8  # not applied, and the worker's numbering is undisturbed
    kv.push("w", np.ones(8, np.float32))
    assert kv.pull("w").tolist() == [-2.0] * 8
    kv.close()


@pytest.mark.parametrize("late", [False, True], ids=["lost", "arrives-after-the-rejoin"])
def test_a_replacement_of_a_worker_that_died_between_the_servers_of_one_push_applies_it_once(monkeypatch, late):
    """w is split over 2 servers; the dying process's 2nd push reached server 0 only. The replacement
    learns that (REJOIN), goes on at step 1, and its push of step 1 is applied on server 1 alone —
    or nowhere, if the old process's message to server 1 arrives after all, after the REJOIN."""
    kv, network, _ = _tapped_store()
    kv.push("w", np.ones(8, np.float32))  # step 0: both servers
    post = network.post
    held: list[list[bytes]] = []
    network.post = lambda target, frames: held.append(frames) if target == 1 else post(target, frames)  # type: ignore[method-assign]
    kv.push("w", np.full(8, 2.0, np.float32), block=False)  # step 1: server 1's message is lost; the process dies
    network.post = post  # type: ignore[method-assign]
    kv._worker.client.close()  # the process is gone: its waiting request fails
    with pytest.raises(pskv.KVStoreError):
        kv.wait(timeout=5)
    kv.close()

    monkeypatch.setattr("pskv.testing.loopback._WORKER", b"replacement")  # the new process's connection
    replacement = LoopbackNetwork(kv._cluster, network.secret)  # a process of the same job
    replacement.cores = network.cores  # the same servers ...
    network.client = replacement.client  # ... answer the new process
    replacement.client.info = replace(replacement.client.info, recovery=True)
    replacement.client.rejoin(2, 5.0)
    again = DistStore("dist_sync", None, kv._cluster, worker=KVWorker(kv._cluster, sync=True,
                                                                        client=replacement.client))
    assert again.is_recovery
    again.init("w", np.zeros(8, np.float32))  # registers only
    assert again.push_count("w") == 1 and again.resume_step() == 1
    if late:  # the old process's message was still on its way: it lands now, once
        network.cores[1].handle(b"loopback-worker", [bytes(memoryview(f).cast("B")) for f in held[0]])
    again.push("w", np.full(8, 2.0, np.float32))  # step 1 again: number 2, new on server 1 only (if at all)
    assert again.pull("w").tolist() == [-3.0] * 8  # 1 + 2, each once (its repeats were ignored)
    again.push("w", np.full(8, 4.0, np.float32))
    assert again.pull("w").tolist() == [-7.0] * 8 and again.push_count("w") == 3
    again.close()
