"""An elastic job's view on one server (pskv.server.members): epochs refused or held, members, rollback."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.protocol import Command, Header, Role, node_id
from pskv.protocol.bodies import View
from pskv.server.commits import CommitSnapshots, NoCommits
from pskv.server.members import ViewMembers
from pskv.server.shard import ServerShard

W = [node_id(Role.WORKER, slot) for slot in range(4)]


def setup(limit: int = 8):
    shard = ServerShard(3)
    shard.init(7, 0, "float32", np.zeros(2, np.float32))
    commits = CommitSnapshots(shard)
    asked: list[int] = []
    view = ViewMembers(shard, commits, tuple(W[:3]), ask_view=lambda: asked.append(1), limit=limit)
    view.adopt(View(1, (0, 1, 2)))
    return shard, commits, view, asked


def push(epoch: int, sender: int) -> Header:
    return Header(Command.PUSH, sender=sender, request=1, epoch=epoch)


def test_a_view_sets_the_members_and_the_workers_a_round_waits_for():
    shard, _, view, _ = setup()
    assert view.epoch == 1 and view.members == frozenset(W[:3]) and shard.num_workers == 3
    view.adopt(View(2, (0, 2, 3), commit=0, cause="mixed"))
    assert view.workers == (W[0], W[2], W[3]) and view.rank(W[3]) == 2 and view.rank(W[1]) == -1
    assert view.adopt(View(2, (0,))) == [] and view.workers == (W[0], W[2], W[3])  # the same epoch again: ignored


def test_an_older_epoch_is_refused_and_a_newer_one_held_until_its_view_comes():
    _, _, view, asked = setup()
    with pytest.raises(pskv.MembershipChangedError, match="view 0 reached a server in view 1"):
        view.stale(b"w0", push(0, W[0]), [b"frame"])
    assert view.stale(b"w3", push(2, W[3]), [b"hello"]) and view.stale(b"w0", push(2, W[0]), [b"push"])
    assert view.stale(b"w0", push(3, W[0]), [b"later"])
    assert len(asked) == 2  # once per newer epoch
    assert view.adopt(View(2, (0, 1, 2, 3), commit=0, cause="refill")) == [(b"w3", [b"hello"]), (b"w0", [b"push"])]
    assert view.adopt(View(3, (0, 1, 2, 3), commit=0, cause="refill")) == [(b"w0", [b"later"])]


def test_held_messages_are_bounded():
    _, _, view, _ = setup(limit=2)
    view.stale(b"a", push(2, W[0]), [b"1"])
    view.stale(b"b", push(2, W[1]), [b"2"])
    with pytest.raises(pskv.MembershipChangedError, match="view 2 has not reached this server yet and 2 messages"):
        view.stale(b"c", push(2, W[2]), [b"3"])


def test_a_failure_view_rolls_back_to_its_commit_and_push_numbers_start_over():
    shard, commits, view, _ = setup()
    p = shard.part(7, 0, "test")
    for w in W[:3]:
        shard.push(p, w, np.ones(2, np.float32))
    commits.take(1)  # COMMIT 1; its release names it in the next view
    assert commits.commit == 0
    for w in W[:2]:
        shard.push(p, w, np.ones(2, np.float32))  # worker 2 departs before its push
    view.adopt(View(2, (0, 1), commit=1, cause="failure"))
    assert commits.commit == 1 and p.round == 1 and p.value.tolist() == [3, 3]
    assert not p.pushes and not p.pushed and shard.num_workers == 2
    assert shard.round_of_push(p, W[0], 0) == 0  # push 0 of the new view: the current value
    for w in W[:2]:
        shard.push(p, w, np.ones(2, np.float32))
    assert p.round == 2 and p.value.tolist() == [2, 2]


def test_a_commit_view_promotes_its_commit_and_keeps_the_values():
    shard, commits, view, _ = setup()
    p = shard.part(7, 0, "test")
    for w in W[:3]:
        shard.push(p, w, np.ones(2, np.float32))
    commits.take(1)
    view.adopt(View(2, (0, 1, 2, 3), commit=1, cause="grow"))
    assert commits.commit == 1 and p.value.tolist() == [3, 3] and not p.pushes and shard.num_workers == 4


def test_a_view_naming_a_commit_this_server_never_took_is_refused():
    _, _, view, _ = setup()
    with pytest.raises(pskv.InvalidArgumentError, match="commit 4 was not taken"):
        view.adopt(View(2, (0, 1), commit=4, cause="failure"))


def test_a_job_that_is_not_elastic_refuses_a_message_naming_a_view():
    shard = ServerShard(2)
    view = ViewMembers(shard, NoCommits(), (W[0], W[1]))
    assert view.epoch == 0 and view.members == {W[0], W[1]}
    with pytest.raises(pskv.InvalidArgumentError, match="not elastic"):
        view.stale(b"w0", push(1, W[0]), [b"x"])
