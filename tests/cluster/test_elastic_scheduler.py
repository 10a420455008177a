"""An elastic job's scheduler in one process over loopback TCP: a worker joins at a commit, one dies, the
launcher reports an exit; every member gets the same views (pskv/cluster/elastic.py, issue 24)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

import pskv
from pskv.cluster import Scheduler
from pskv.cluster.elastic import COMMIT_MEETING, COMMITTED_MEETING
from pskv.config import ClusterConfig
from pskv.metrics import snapshot
from pskv.protocol import Command, Header, Role, decode, encode
from pskv.protocol.bodies import Roster, View
from tests.cluster.test_scheduler import WAIT, Node

TOKEN = "5e" * 32
SETTINGS = {"min_workers": 1, "max_workers": 3, "heartbeat_interval": 0.05, "heartbeat_timeout": 1.0}


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def elastic_job(ctx, slots: int = 2, **changed):
    """A scheduler, one server and workers of slots 0..slots-1, registered."""
    settings = {**SETTINGS, **changed}
    scheduler = Scheduler(ClusterConfig(num_servers=1, num_workers=slots, launch_token=TOKEN, **settings), ctx,
                          address="tcp://127.0.0.1:0")
    scheduler.start()
    port = int(scheduler.address.rsplit(":", 1)[1])
    cfg = ClusterConfig(root_uri="127.0.0.1", root_port=port, num_servers=1, num_workers=slots, **settings)
    nodes = [Node(ctx, cfg, Role.SERVER, "tcp://127.0.0.1:5000")]
    nodes += [Node(ctx, cfg, Role.WORKER) for _ in range(slots)]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda item: item[1].member.register(item[0] - 1), enumerate(nodes)))
    return scheduler, cfg, nodes


def meet_all(pool, workers, name: str, timeout: float = WAIT):
    return [f.result(WAIT) for f in [pool.submit(w.member.barrier, Role.WORKER, timeout, name) for w in workers]]


def wait_for(check, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def roster(ctx, scheduler, report: Roster) -> Header:
    launcher = ctx.socket(zmq.DEALER)
    launcher.linger = 0
    launcher.connect(scheduler.address)
    try:
        launcher.send_multipart(encode(Header(Command.ROSTER, 1, 0, body=report.encode())))
        assert launcher.poll(WAIT * 1000)
        return decode(launcher.recv_multipart())[0]
    finally:
        launcher.close(0)


def test_a_joiner_is_admitted_at_a_commit_and_departures_make_views_every_member_hears(ctx, caplog):
    caplog.set_level(logging.INFO, "pskv.scheduler")
    scheduler, cfg, nodes = elastic_job(ctx)
    server, w0, w1 = nodes
    joiner = Node(ctx, cfg, Role.WORKER)
    try:
        first = View(1, (0, 1), 0, "start")
        assert {n.member.info.view for n in nodes} == {first} and w1.member.info.num_workers == 2
        with ThreadPoolExecutor(3) as pool:
            joining = pool.submit(joiner.member.register, 2)  # slot 2 waits for the next commit
            time.sleep(0.2)
            assert not joining.done()
            meet_all(pool, [w0, w1], COMMIT_MEETING)
            assert not joining.done()  # the first meeting makes no commit
            released = meet_all(pool, [w0, w1], COMMITTED_MEETING)
            grown = View(2, (0, 1, 2), 1, "grow")
            assert [met.view for met in released] == [grown, grown]
            info = joining.result(WAIT)
            assert info.view == grown and info.num_workers == 3 and grown.rank_of(2) == 2
            for w in (w0, w1):
                w.member.adopt(grown)
            meet_all(pool, [w0, w1, joiner], "barrier")  # view 2's first meeting: counted anew, all three
            wait_for(lambda: server.member.view == grown, "the server hears of view 2 from its heartbeats")
            job = snapshot(scheduler.address, timeout=WAIT)  # pskv top's question
            assert (job.view, job.num_workers) == (2, 3)

            # slot 1 dies while the others wait at a meeting: they fail together, in view 3
            waiting = [pool.submit(w.member.barrier, Role.WORKER, WAIT, "barrier") for w in (w0, joiner)]
            w1.stop()
            for f in waiting:
                with pytest.raises(pskv.MembershipChangedError, match=r"barrier#2 is of view 2, and the job is in "
                                   r"view 3: slots 0,2 \(W=2\) from commit 1 \(failure: slot 1 missed heartbeats"):
                    f.result(WAIT)
            failed = View(3, (0, 2), 1, "failure")
            wait_for(lambda: w0.member.view == failed and joiner.member.view == failed, "the survivors hear of it")

            # the launcher reports slot 2's exit: a view at once, not after the heartbeat timeout
            refused = roster(ctx, scheduler, Roster("gone", 2, "00" * 32))
            assert refused.command is Command.ERROR and "launch token" in refused.body
            started = time.monotonic()
            assert roster(ctx, scheduler, Roster("gone", 2, TOKEN)).command is Command.REPLY
            w0.member.adopt(failed)
            wait_for(lambda: w0.member.view is not None and w0.member.view.epoch == 4, "view 4")
            assert w0.member.view == View(4, (0,), 1, "failure") and time.monotonic() - started < 1.0
        assert "scheduler: view 2: slots 0,1,2 (W=3) from commit 1 (grow: slot 2)" in caplog.text
    finally:
        for n in (*nodes, joiner):
            n.stop()
        scheduler.stop()


def test_a_job_that_is_not_elastic_refuses_roster_reports_and_sends_no_views(ctx):
    from tests.cluster.test_scheduler import start_cluster

    scheduler, nodes, infos = start_cluster(ctx, 1, 1)
    try:
        assert infos[1].view is None and nodes[1].member.view is None
        reply = roster(ctx, scheduler, Roster("gone", 0, TOKEN))
        assert reply.command is Command.ERROR and "this job is not elastic" in reply.body
    finally:
        for n in nodes:
            n.stop()
        scheduler.stop()


def test_at_the_startup_timeout_min_workers_start_the_job_and_a_late_slot_joins_at_a_commit(ctx):
    settings = {**SETTINGS, "startup_timeout": 0.5}
    scheduler = Scheduler(ClusterConfig(num_servers=1, num_workers=2, **settings), ctx, address="tcp://127.0.0.1:0")
    scheduler.start()
    port = int(scheduler.address.rsplit(":", 1)[1])
    cfg = ClusterConfig(root_uri="127.0.0.1", root_port=port, num_servers=1, num_workers=2,
                        **{**settings, "startup_timeout": WAIT})
    server, w0, late = Node(ctx, cfg, Role.SERVER, "tcp://127.0.0.1:5000"), Node(ctx, cfg, Role.WORKER), \
        Node(ctx, cfg, Role.WORKER)
    try:
        with ThreadPoolExecutor(2) as pool:
            registered = [pool.submit(server.member.register, 0), pool.submit(w0.member.register, 0)]
            alone = View(1, (0,), 0, "start")
            assert [f.result(WAIT).view for f in registered] == [alone, alone]  # 1 of 2 workers, MIN 1
            joining = pool.submit(late.member.register, 1)
            time.sleep(0.2)
            assert not joining.done()
            w0.member.barrier(Role.WORKER, WAIT, COMMIT_MEETING)
            assert w0.member.barrier(Role.WORKER, WAIT, COMMITTED_MEETING).view == View(2, (0, 1), 1, "grow")
            assert joining.result(WAIT).view == View(2, (0, 1), 1, "grow")
    finally:
        for n in (server, w0, late):
            n.stop()
        scheduler.stop()


def test_below_min_the_meetings_wait_then_the_scheduler_fails_them_and_the_job(ctx):
    scheduler, _, nodes = elastic_job(ctx, min_workers=2, elastic_timeout=0.3)
    _, w0, _ = nodes
    try:
        assert roster(ctx, scheduler, Roster("gone", 1, TOKEN)).command is Command.REPLY
        text = r"only 1 of at least 2 workers for 0.3 s \(PSKV_ELASTIC_TIMEOUT; pskv launch --elastic-timeout\)"
        with pytest.raises(pskv.NodeFailedError, match=f"^the elastic job failed: {text}"):  # held, then failed
            w0.member.adopt(View(2, (0,), 0, "failure"))
            w0.member.barrier(Role.WORKER, WAIT, "barrier")
        with pytest.raises(pskv.NodeFailedError, match=f"the elastic job failed: {text}"):
            scheduler.run(WAIT)
    finally:
        for n in nodes:
            n.stop()
        scheduler.stop()


def test_a_node_that_asks_for_the_view_gets_it_at_once_through_on_view(ctx):
    scheduler, _, nodes = elastic_job(ctx, heartbeat_interval=30.0, heartbeat_timeout=60.0)  # no beat comes soon
    server = nodes[0]
    heard: list[View] = []
    server.member._on_view = heard.append  # as a server's ViewMembers would
    try:
        assert roster(ctx, scheduler, Roster("gone", 1, TOKEN)).command is Command.REPLY
        server.member.ask_view()
        wait_for(lambda: heard, "the view, in the reply to the heartbeat ask_view sent")
        assert heard == [View(2, (0,), 0, "failure")] and server.member.view == heard[0]
        from pskv.metrics import MetricsClient

        client = MetricsClient(scheduler.address)
        try:
            assert client.query(WAIT).num_workers == 1  # pskv top: the view's workers, not the two it started with
        finally:
            client.close()
        server.member.adopt(heard[0])
        server.member.ask_view()  # the scheduler sends a view only to a node behind it
        time.sleep(0.3)
        assert heard == [View(2, (0,), 0, "failure")]
    finally:
        for n in nodes:
            n.stop()
        scheduler.stop()
