"""StepOrder (pskv/server/steps.py): which open sync rounds the workers' meeting marks show cannot complete."""

from __future__ import annotations

import numpy as np

from pskv.protocol import Role, node_id
from pskv.protocol.bodies import Meeting
from pskv.server.shard import ServerShard
from pskv.server.steps import StepOrder

W0, W1 = node_id(Role.WORKER, 0), node_id(Role.WORKER, 1)


def setup():
    shard = ServerShard(2)
    shard.init(5, 0, "float32", np.zeros(3, np.float32))
    refused = []
    steps = StepOrder(shard, lambda part, reason: refused.append((part.key, str(reason), reason.kind)), lambda: "s0")
    for w in (W0, W1):  # the store's creation meeting
        steps.marked(w, Meeting(1, True, "create"))
    return shard, shard.part(5, 0, "push"), steps, refused


def test_a_mark_at_a_meeting_fails_an_open_round_pushed_before_it():
    shard, part, steps, refused = setup()
    shard.push(part, W1, np.ones(3, np.float32), 1)  # worker 1's extra step
    steps.marked(W0, Meeting(2, True, "barrier"))  # worker 0 at barrier#2 without pushing it
    assert refused == [(5, "mismatched step counts: worker 1 is ahead: it pushed key 5 for sync round 1, which "
                           "worker 0 will not push before barrier#2; every worker must push a key as many times as "
                           "the others between two collectives: with uneven data, call kv.join() on a worker that "
                           "has run out of batches (or use Trainer.fit(uneven=True))", "CollectiveMismatchError")]
    assert steps.take_report() == (2, refused[0][1]) and steps.take_report() is None  # once, for the scheduler


def test_a_str_key_is_named_as_every_server_error_names_it():
    shard, part, steps, refused = setup()
    shard.key_names = {5: "fc1_weight"}
    shard.push(part, W1, np.ones(3, np.float32), 1)
    steps.marked(W0, Meeting(2, True, "barrier"))
    assert "it pushed key 'fc1_weight' (server key 5) for sync round 1" in refused[0][1]


def test_a_push_made_before_the_meeting_that_comes_after_the_mark_fails_its_round():
    shard, part, steps, refused = setup()
    steps.marked(W0, Meeting(2, True, "barrier"))
    assert steps.watch and refused == []
    shard.push(part, W1, np.ones(3, np.float32), 1)
    steps.pushed([part], W1)
    assert len(refused) == 1 and "worker 1 is ahead" in refused[0][1]


def test_pushes_after_the_meeting_and_matching_steps_fail_nothing():
    shard, part, steps, refused = setup()
    shard.push(part, W0, np.ones(3, np.float32), 1)  # both push before the meeting: the round completes
    shard.push(part, W1, np.ones(3, np.float32), 1)
    for w in (W0, W1):
        steps.marked(w, Meeting(2, True, "barrier"))
    assert not steps.watch
    shard.push(part, W1, np.ones(3, np.float32), 2)  # after the meeting, worker 0 is merely slower
    steps.pushed([part], W1)
    assert refused == [] and steps.take_report() is None


def test_an_unsettled_mark_accuses_nobody_and_a_joined_worker_is_not_waited_for():
    shard, part, steps, refused = setup()
    shard.push(part, W1, np.ones(3, np.float32), 1)
    steps.marked(W0, Meeting(2, False, "barrier"))  # its own pushes may still be on the way
    assert refused == []
    shard.join(W0)
    steps.marked(W0, Meeting(3, True, "join"))
    assert refused == []


def test_a_replacement_process_is_not_compared():
    shard, part, steps, refused = setup()
    steps.forget(W1)  # a replacement took over rank 1: it sends no marks
    shard.push(part, W1, np.ones(3, np.float32), 1)
    steps.marked(W0, Meeting(2, True, "barrier"))
    steps.pushed([part], W1)
    assert refused == []
