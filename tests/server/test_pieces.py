"""The server node's pieces on their own, without sockets: repeats, dead workers, control, checkpoints."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from pskv.config import ClusterConfig
from pskv.errors import CheckpointError, InvalidArgumentError, OptimizerStateError
from pskv.optimizer import SGD, Updater
from pskv.optimizer.updater import install_optimizer, updater_from_states
from pskv.protocol import Command, Header, decode
from pskv.server.checkpointing import ShardCheckpoints
from pskv.server.control import ControlHandlers
from pskv.server.dedup import DROPPED, SEEN_PER_SOCKET, Regather, ReplyCache, Resend
from pskv.server.liveness import DeadWorkers, StallReport
from pskv.server.paths import AllowedPaths
from pskv.server.shard import ServerShard

W0, W1 = 9, 11  # node ids of workers 0 and 1


def shard(sync: bool = True) -> ServerShard:
    s = ServerShard(2, sync)
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    return s


# -- ReplyCache -------------------------------------------------------------------------------
def test_a_repeat_gets_what_the_first_request_got():
    cache = ReplyCache()
    assert cache.begin(b"a", 1) is None  # new: handle it
    assert cache.begin(b"a", 1) is DROPPED  # still being answered
    cache.answered([b"ack"])
    cache.end()
    assert cache.begin(b"a", 1) == Resend([b"ack"])
    assert cache.begin(b"b", 1) is None  # another socket: its own request ids


def test_long_answers_are_not_kept_and_a_pull_is_served_again():
    cache = ReplyCache()
    assert cache.begin(b"a", 1) is None
    cache.answered([b"header", b"values"])  # a reply with values: not kept
    cache.end()
    assert cache.begin(b"a", 1) is DROPPED
    cache.end()
    assert cache.begin(b"a", 2) is None  # a pull, answered later
    answered = cache.later()
    assert answered is not None
    cache.answered([b"error"])  # after later(): not the answer of record
    cache.end()
    assert cache.begin(b"a", 2) is DROPPED
    answered()
    assert cache.begin(b"a", 2) is None  # served again ...
    assert cache.begin(b"a", 2) is DROPPED  # ... and in flight once more


def test_an_answered_pushpull_is_regathered_and_not_recorded_twice():
    s = shard()
    part = s.part(7, 0, "test")
    cache = ReplyCache()
    assert cache.begin(b"a", 3) is None
    answered = cache.later([(part, 1)], shared=False)
    assert answered is not None
    cache.end()
    answered()
    repeat = cache.begin(b"a", 3)
    assert isinstance(repeat, Regather) and repeat.parts == [(part, 1)] and not repeat.shared
    assert cache.later([(part, 1)]) is None  # answering a repeat records nothing


def test_only_the_recent_request_ids_of_a_socket_are_remembered():
    cache = ReplyCache()
    for request in range(SEEN_PER_SOCKET + 1):
        assert cache.begin(b"a", request) is None
        cache.answered([b"ack"])
        cache.end()
    assert cache.begin(b"a", 0) is None  # forgotten: handled as new
    assert cache.begin(b"a", SEEN_PER_SOCKET) == Resend([b"ack"])


# -- DeadWorkers / StallReport ----------------------------------------------------------------
def test_a_dead_worker_fails_the_waiting_pulls_at_once_without_recovery():
    s = shard()
    dead = DeadWorkers(s, 0.0, lambda: "server 0")
    failed: list[str] = []
    s.push(s.part(7, 0, "test"), W0, np.ones(4, np.float32))
    s.pull(s.part(7, 0, "test"), 1, lambda part: None, failed.append)
    assert not dead
    dead.on_node_dead(W1)
    assert dead and dead.names() == "worker 1" and failed == [dead.reason()]
    dead.on_node_alive(W1)
    assert not dead


def test_after_a_death_the_workers_that_end_are_not_named_with_it():
    """The others end after a death (their calls failed): a pull failed later names the dead worker, as its reason."""
    dead = DeadWorkers(shard(), 0.0, lambda: "server 0")
    dead.on_node_left(W0)
    assert dead.names() == "worker 0"
    dead.on_node_dead(W1)
    assert dead.names() == "worker 1" and dead.reason().startswith("worker 1 died")


def test_with_recovery_a_dead_worker_is_waited_for_then_given_up_on(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("pskv.server.liveness.time", SimpleNamespace(monotonic=lambda: now[0]))
    s = shard()
    dead = DeadWorkers(s, 30.0, lambda: "server 0")
    failed: list[str] = []
    s.pull(s.part(7, 0, "test"), 1, lambda part: None, failed.append)
    dead.on_node_dead(W1)
    now[0] += 29
    dead.check_recovery()
    assert not dead and not failed  # within the timeout: still waiting for a replacement
    now[0] += 2
    dead.check_recovery()
    assert dead.dead == {W1} and len(failed) == 1
    s.push(s.part(7, 0, "test"), W1, np.ones(4, np.float32))
    counts = dead.rejoined(W1)  # a replacement: alive again, told which pushes of its rank arrived
    assert not dead and counts == [(7, 0, 1)] and s.part(7, 0, "test").pushes[W1].count == 1


def test_a_worker_that_left_fails_exactly_the_pulls_whose_rounds_need_its_pushes():
    s = ServerShard(3, True)
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    s.init(8, 0, "float32", np.zeros(4, np.float32))
    p7, p8 = s.part(7, 0, "test"), s.part(8, 0, "test")
    w2 = 15  # node id of worker 2
    dead = DeadWorkers(s, 0.0, lambda: "server 0")
    failed7: list[str] = []
    failed8: list[str] = []
    s.push(p7, W0, np.ones(4, np.float32))  # worker 0 pushed key 7's open round, not key 8's
    s.push(p7, W1, np.ones(4, np.float32))
    s.push(p8, W1, np.ones(4, np.float32))
    s.pull(p7, 1, lambda part: None, failed7.append)  # waits for worker 2 only
    s.pull(p8, 1, lambda part: None, failed8.append)  # waits for workers 0 and 2
    s.key_names = {8: "fc2_weight"}  # a str key: named as every server error names it
    dead.on_node_left(W0)
    assert failed7 == [] and len(failed8) == 1 and "worker 0 will never push again" in failed8[0]
    assert "it pushed key 'fc2_weight' (server key 8) for sync round 1" in failed8[0]
    assert not dead and dead.names() == "worker 0"  # left is not dead; a failed pull names it
    assert dead.left_reason([(p7, 1)]) is None and dead.left_reason([(p7, 2)]) is not None
    assert dead.left_reason([(p8, None)]) is not None  # a push not arrived yet joins key 8's open round
    done: list[int] = []
    s.pull(p7, 1, lambda part: done.append(part.round))
    s.push(p7, w2, np.ones(4, np.float32))  # the round worker 0 pushed completes as usual
    assert done == [1] and failed7 == []


def test_a_worker_death_in_async_mode_changes_nothing():
    s = shard(sync=False)
    dead = DeadWorkers(s, 0.0, lambda: "server 0")
    dead.on_node_dead(W1)
    assert not dead


def test_a_stalled_round_is_reported_once_naming_the_missing_worker(caplog):
    s = shard()
    s.push(s.part(7, 0, "test"), W0, np.ones(4, np.float32))
    report = StallReport(s, 2, 0.0, lambda: "server 0", {})
    with caplog.at_level(logging.WARNING, logger="pskv.server"):
        report.report()
        report.report()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "round 1 of key 7" in lines[0] and "for worker 1 (pushed: worker 0)" in lines[0]
    StallReport(s, 2, 0.0, lambda: "server 0", {7: "fc1_weight"}).report()  # a str key, named as errors name it
    assert "round 1 of key 'fc1_weight' (server key 7) (offset 0)" in caplog.records[-1].getMessage()


# -- optimizer helpers, control commands, checkpoints -------------------------------------------
def test_install_optimizer_keeps_the_state_of_a_pskv_updater_only():
    fresh = install_optimizer(None, SGD(learning_rate=0.1, momentum=0.9))
    assert isinstance(fresh, Updater)
    w = np.ones(3, np.float32)
    fresh(0, np.ones(3, np.float32), w)
    again = install_optimizer(fresh, SGD(learning_rate=0.5, momentum=0.9))
    assert again is fresh and fresh.optimizer.learning_rate == 0.5 and 0 in fresh.states
    assert install_optimizer(lambda k, g, w: None, SGD()) is not fresh


def test_updater_from_states_needs_the_optimizer_config(tmp_path):
    updater = SGD(learning_rate=0.2, momentum=0.9).get_updater()
    updater(0, np.ones(3, np.float32), np.ones(3, np.float32))
    built = updater_from_states(updater.get_states(dump_optimizer=True))
    assert built.optimizer.learning_rate == 0.2 and built.optimizer.get_update_count(0) == 1
    updater.save_states(tmp_path / "s", dump_optimizer=True)
    assert updater_from_states(str(tmp_path / "s")).optimizer.learning_rate == 0.2
    with pytest.raises(OptimizerStateError):
        updater_from_states(updater.get_states())
    with pytest.raises(CheckpointError, match="no config"):
        updater_from_states(updater.get_states(), no_config=CheckpointError("no config"))


def control(s: ServerShard, tmp_path, max_bytes: int = 1 << 20) -> tuple[ControlHandlers, list[list]]:
    sent: list[list] = []
    cluster = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1)
    checkpoints = ShardCheckpoints(s, cluster, lambda: "server 0")
    return ControlHandlers(s, checkpoints, lambda identity, frames: sent.append(frames), lambda: 1, lambda: 0,
                           AllowedPaths([str(tmp_path)]), max_bytes), sent


def call(handler, command: Command, body: dict) -> None:
    handler(b"w", Header(command, 1, W0, body=json.dumps(body)), [])


def test_control_commands_install_send_and_take_the_optimizer_state(tmp_path):
    from pskv.optimizer import transfer

    s = shard()
    handlers, sent = control(s, tmp_path)
    with pytest.raises(OptimizerStateError):
        call(handlers.save_states, Command.SAVE_STATES, {})
    call(handlers.set_optimizer, Command.SET_OPTIMIZER, SGD(learning_rate=0.3, momentum=0.9).to_config())
    first = s.updater
    call(handlers.set_optimizer, Command.SET_OPTIMIZER, SGD(learning_rate=0.4, momentum=0.9).to_config())
    assert s.updater is first and isinstance(first, Updater) and first.optimizer.learning_rate == 0.4
    part = s.parts[(7, 0)]
    for w in (W0, W1):
        s.push(part, w, np.ones(4, np.float32))
    call(handlers.save_states, Command.SAVE_STATES, {"dump_optimizer": True})
    header, buffers = decode(sent[-1])
    doc = transfer.document(header, buffers)  # a copy: the next update does not change it
    assert [(k.key, k.count, k.names) for k in doc.keys] == [(7, 1, ("momentum",))]
    for w in (W0, W1):
        s.push(part, w, np.ones(4, np.float32))
    np.testing.assert_allclose(doc.keys[0].arrays[0], 2.0)  # the sum 1 + 1, not the next step's 3.8
    s.updater = None
    body, specs, arrays = transfer.message(doc)
    handlers.load_states(b"w", Header(Command.LOAD_STATES, 2, W0, specs, body=body), [memoryview(a) for a in arrays])
    assert isinstance(s.updater, Updater) and s.updater.optimizer.learning_rate == 0.4  # the state's optimizer
    assert s.updater.optimizer.get_update_count(7) == 1
    small, _ = control(s, tmp_path, max_bytes=20)
    with pytest.raises(InvalidArgumentError, match="exceeds PSKV_MAX_MESSAGE_BYTES=20"):
        call(small.save_states, Command.SAVE_STATES, {})


def test_a_saved_shard_restores_values_rounds_counts_and_optimizer(tmp_path):
    from pskv.checkpoints import write_manifest

    s = shard()
    s.updater = SGD(learning_rate=0.1).get_updater()
    part = s.part(7, 0, "test")
    for w in (W0, W1):
        s.push(part, w, np.ones(4, np.float32))
    handlers, sent = control(s, tmp_path)
    call(handlers.save_checkpoint, Command.SAVE_CHECKPOINT, {"dir": str(tmp_path)})
    body = json.loads(decode(sent[-1])[0].body)
    assert body["open_rounds"] == 0 and body["bytes"] > 0
    write_manifest(tmp_path, {"num_servers": 1})
    cluster = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1,
                            server_rank=0)
    restored = ServerShard(2, True)
    loaded = ShardCheckpoints(restored, cluster, lambda: "server 0")
    loaded.restore(str(tmp_path))
    again = restored.part(7, 0, "test")
    assert again.round == 1 and again.value.tolist() == part.value.tolist()
    assert isinstance(restored.updater, Updater) and restored.updater.optimizer.learning_rate == 0.1
    loaded.apply_saved_counts()
    assert {w: log.count for w, log in again.pushes.items()} == {W0: 1, W1: 1} and not again.restored
