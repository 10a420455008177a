"""Metrics (pskv top): the bodies that carry them refuse hostile values, the scheduler's window
rates them, a job's nodes are reported through the scheduler, and ``pskv top`` fails in one line."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import numpy as np
import pytest

import pskv
from pskv.cli import main as cli_main
from pskv.cluster import Scheduler
from pskv.cluster.rates import MetricsWindow
from pskv.config import ClusterConfig
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.metrics import JobMetrics, MetricsClient, NodeMetrics, scheduler_address, snapshot
from pskv.protocol import Command, Header
from pskv.protocol import bodies as b
from pskv.testing import InProcessCluster
from pskv.top import render
from pskv.worker import KVWorker

GOOD = [3, 2, 4096, 1024, 0.5, 1, 1, 11]


def heartbeat(metrics: object) -> Header:
    return Header(Command.HEARTBEAT, 1, 9, body=json.dumps({"m": metrics}))


def test_heartbeat_and_report_round_trip():
    counters = b.Counters(*GOOD)
    assert b.Heartbeat.parse(heartbeat(GOOD)) == b.Heartbeat(counters)
    assert b.Heartbeat.parse(Header(Command.HEARTBEAT, 1, 9)) == b.Heartbeat(None)  # an old node's: no body
    report = b.JobReport(2, 1, 3, (b.NodeReport(8, "alive", 0.2, counters, (1.0, 2.0, 3.0, 4.0, 0.1)),
                                   b.NodeReport(9, "left", 4.0, None, None)))
    assert b.JobReport.parse(Header(Command.REPLY, 1, 1, body=report.encode())) == report
    elastic = report._replace(view=7)  # an elastic job's view; an older scheduler's reply has none (0)
    assert b.JobReport.parse(Header(Command.REPLY, 1, 1, body=elastic.encode())) == elastic


@pytest.mark.parametrize("metrics", [
    [-1, 0, 0, 0, 0.0, 0, 0, 0],  # negative
    [True, 0, 0, 0, 0.0, 0, 0, 0],  # a bool is no count
    [0.5, 0, 0, 0, 0.0, 0, 0, 0],  # a float is no count
    [1 << 63, 0, 0, 0, 0.0, 0, 0, 0],  # past 2**62
    [0, 0, 0, 0, float("nan"), 0, 0, 0],  # json.dumps writes NaN, json.loads reads it
    [0, 0, 0, 0, float("inf"), 0, 0, 0],
    [0, 0, 0, 0, 1e13, 0, 0, 0],  # seconds past the bound
    [0, 0, 0, 0, "1", 0, 0, 0],
    [0, 0, 0, 0, 0.0, 0, 0, 5],  # waits_for: no node id
    [0, 0, 0, 0, 0.0, 0, 0, 1 << 40],
    [0, 0, 0, 0, 0.0, 0, 0, True],
    [0, 0, 0],  # too short
    [0] * 9,  # too long
    {"ops": 1},  # not the list form
    "x" * 100,
    [[0] * 10] * 7,  # nested
])
def test_hostile_metrics_are_refused(metrics):
    with pytest.raises(ProtocolError, match="HEARTBEAT"):
        b.Heartbeat.parse(heartbeat(metrics))


@pytest.mark.parametrize(("body", "match"), [
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[1, "alive", 0, None, None]]}, "not a node"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[8, "zombie", 0, None, None]]}, "not a node"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[8, "alive", -1, None, None]]}, "age"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[8, "alive", 0, None, [1, 2]]]}, "rates"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[8, "alive", 0, None, [1e30, 0, 0, 0, 0]]]}, "rate"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [[8, "alive", 0, [0], None]]}, "metrics"),
    ({"workers": -1, "servers": 1, "registered": 2, "nodes": []}, "workers"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [0] * (b.MAX_NODES + 1)}, "more than"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [], "view": -1}, "view"),
    ({"workers": 1, "servers": 1, "registered": 2, "nodes": [], "view": True}, "view"),
])
def test_hostile_reports_are_refused(body, match):
    with pytest.raises(ProtocolError, match=match):
        b.JobReport.parse(Header(Command.REPLY, 1, 1, body=json.dumps(body)))


def test_window_rates_totals_over_the_last_seconds():
    window = MetricsWindow(1, 1)
    window.add(9, b.Counters(), now=100.0)
    assert window.rates(9) is None  # one report: no rate yet
    window.add(9, b.Counters(10, 5, 1000, 2000, 0.5, 2, 1, 8), now=101.0)
    assert window.rates(9) == (10.0, 5.0, 1000.0, 2000.0, 0.5)
    window.add(9, b.Counters(4, 5, 1000, 2000, 0.5), now=102.0)  # counted down: a new process, rated anew
    assert window.rates(9) is None
    for t in range(103, 200):  # old reports leave the window: memory is bounded
        window.add(9, b.Counters(t), now=float(t))
    assert window.rates(9)[0] == pytest.approx(1.0)
    report = window.report({9: ("alive", 0.1), 8: ("dead", 12.0)}, 2)
    assert [(n.node, n.state, n.totals is None) for n in report.nodes] == [(8, "dead", True), (9, "alive", False)]
    window.forget(9)
    assert window.rates(9) is None


def test_scheduler_drops_malformed_metrics_and_keeps_good_ones():
    scheduler = Scheduler(ClusterConfig(num_servers=1, num_workers=1), address="tcp://127.0.0.1:0")
    try:
        scheduler._take_metrics(b"peer", heartbeat([-5, 0, 0, 0, 0.0, 0, 0, 0]), 9)  # logged, not kept
        scheduler._take_metrics(b"peer", Header(Command.HEARTBEAT, 1, 9, body="[[[["), 9)
        assert scheduler._rates.report({9: ("alive", 0.0)}, 1).nodes[0].totals is None
        scheduler._take_metrics(b"peer", heartbeat(GOOD), 9)
        assert scheduler._rates.report({9: ("alive", 0.0)}, 1).nodes[0].totals == b.Counters(*GOOD)
    finally:
        scheduler.stop()


def test_a_jobs_nodes_through_the_scheduler():
    """Workers of an in-process cluster push and pull; kv.metrics() (pskv.metrics.snapshot) shows
    every node with its rounds, bytes and rates, as the scheduler gathered them from heartbeats,
    and a worker that closed its store as left."""
    # values of 1000 elements split over both servers (bigarray_bound): every node has work
    with InProcessCluster(2, 2, deadline=30, heartbeat_interval=0.1, bigarray_bound=100) as cluster:
        def work(config: ClusterConfig) -> tuple[JobMetrics, dict[str, str]]:
            kv = pskv.create("dist_sync", cluster=config)
            kv.init(1, np.zeros(1000, np.float32))
            out = np.zeros(1000, np.float32)
            deadline = time.monotonic() + 20
            done = False
            while True:  # until one worker saw every node at work: element 0 of the sum tells both
                value = np.ones(1000, np.float32)
                value[0] = float(done)
                kv.pushpull(1, value, out=out)
                if out[0] > 0:
                    break
                seen = kv.metrics(timeout=5)
                done = all(n.rounds_per_s and n.bytes_in and n.bytes_out for n in seen.nodes) \
                    or time.monotonic() > deadline
                time.sleep(0.05)
            seen = kv.metrics(timeout=5)
            kv.barrier()  # neither leaves before the other has seen it at work
            states: dict[str, str] = {}
            if kv.rank == 1:
                kv.close()  # leaves the job, then waits for worker 0 to leave too
                return seen, states
            while time.monotonic() < deadline:  # worker 0 sees worker 1 leave
                states = {n.node: n.state for n in kv.metrics(timeout=5).nodes}
                if states["worker 1"] == "left":
                    break
                time.sleep(0.05)
            kv.close()
            return seen, states

        seen, states = cluster.run_workers(work)[0]
    assert states == {"server 0": "alive", "server 1": "alive", "worker 0": "alive", "worker 1": "left"}
    assert (seen.num_workers, seen.num_servers, seen.registered) == (2, 2, 4)
    assert sorted(n.node for n in seen.nodes) == ["server 0", "server 1", "worker 0", "worker 1"]
    for n in seen.nodes:
        assert n.state == "alive" and n.rounds > 0 and n.bytes_in > 0 and n.bytes_out > 0, n
        assert n.ops_per_s is not None and n.ops_per_s > 0, n
    # values of 4000 bytes: each worker pushed (and pulled) as many bytes as its rounds say (a
    # report may fall between the counts of one call)
    worker = next(n for n in seen.nodes if n.node == "worker 0")
    assert worker.bytes_out % 4000 == 0 and abs(worker.bytes_out // 4000 - worker.rounds) <= 1, worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_top_without_a_scheduler_is_one_line_within_its_timeout(capsys):
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    assert cli_main(["top", "--scheduler", f"127.0.0.1:{port}", "--once", "--timeout", "0.5"]) == 1
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port} did not answer within 0.5 s" in err[0], err
    with pytest.raises(OperationTimeoutError, match=f"127.0.0.1:{port}"):
        snapshot(str(port), timeout=0.2)


def test_top_usage_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["top", "--port-file", str(tmp_path / "missing"), "--once"]) == 2
    assert cli_main(["top", "--once"]) == 2
    assert cli_main(["top", "--scheduler", "host:notaport", "--once"]) == 2
    assert cli_main(["top", "--scheduler", "bad host:5", "--once"]) == 2
    assert cli_main(["top", "--scheduler", "127.0.0.1:1", "--curve-key", str(tmp_path / "nokey"), "--once"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("pskv top: error: ") for line in lines), lines
    assert "missing" in lines[0] and "--scheduler HOST:PORT" in lines[1] and "host:notaport" in lines[2]
    assert "cannot connect to the scheduler at tcp://bad host:5" in lines[3] and "nokey" in lines[4]


def test_addresses():
    assert scheduler_address("10.0.0.1:9091") == "tcp://10.0.0.1:9091"
    assert scheduler_address(" tcp://h:1\n") == "tcp://h:1"
    assert scheduler_address("9091") == "tcp://127.0.0.1:9091"
    with MetricsClient("127.0.0.1:9") as client:
        assert client.address == "tcp://127.0.0.1:9"


def test_render_names_every_node_and_its_state():
    def node(name: str, state: str, rate: float | None) -> NodeMetrics:
        role, rank = name.split()
        return NodeMetrics(name, role, int(rank), state, 0.3, rate, rate, rate, rate, rate, 2, 1, "worker 1",
                           5, 5, 10, 10, 0.1)

    job = JobMetrics("tcp://127.0.0.1:5", 2, 1, 3, (node("server 0", "alive", 2048.0), node("worker 0", "alive", 0.25),
                                                    node("worker 1", "dead", None)))
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render(job))
    text = console.export_text()
    assert "127.0.0.1:5" in text and "2.0KiB" in text and "25%" in text and "1 (worker 1)" in text
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("worker 1")] == [["worker", "1", "dead"]]
    assert "elastic" not in text
    console = Console(width=120, record=True)
    console.print(render(dataclasses.replace(job, view=3)))
    assert "2 worker(s) (elastic: view 3)" in console.export_text()


def test_under_curve_only_a_key_holder_gets_the_metrics(tmp_path):
    from pskv.errors import TransportError
    from pskv.transport.security import generate_keys, write_key_file

    key = write_key_file(tmp_path / "cluster.key", generate_keys())
    other = write_key_file(tmp_path / "other.key", generate_keys())
    scheduler = Scheduler(ClusterConfig(num_servers=1, num_workers=1, curve_key_file=str(key)),
                          address="tcp://127.0.0.1:0")
    try:
        address = scheduler.start()
        seen = snapshot(address, timeout=5, curve_key_file=str(key))
        assert (seen.num_workers, seen.num_servers, seen.registered, seen.nodes) == (1, 1, 0, ())
        for key_file in ("", str(other)):  # no key, another job's key: refused in the handshake
            with pytest.raises(TransportError, match="refused the connection's security handshake.*--curve-key"):
                snapshot(address, timeout=5, curve_key_file=key_file)
    finally:
        scheduler.stop()


def test_a_silent_node_shows_as_dead():
    """A worker whose process stops without leaving (its network thread ends: no more
    heartbeats) is dead for the scheduler after PS_HEARTBEAT_TIMEOUT, and so in the metrics."""
    with InProcessCluster(1, 1, deadline=30, heartbeat_interval=0.1, heartbeat_timeout=0.5) as cluster:
        def work(config: ClusterConfig) -> dict[str, str]:
            worker = KVWorker(config)  # the store's worker layer, handed in: its connection is stopped below
            kv = pskv.DistStore("dist_sync", cluster=config, worker=worker)
            kv.init(1, np.zeros(10, np.float32))
            worker.client.close()  # as a killed process: no SHUTDOWN, no heartbeat
            deadline = time.monotonic() + 20
            while True:
                states = {n.node: n.state for n in snapshot(cluster.config.scheduler_address, timeout=5).nodes}
                if states["worker 0"] == "dead" or time.monotonic() > deadline:
                    return states

        states = cluster.run_workers(work)[0]
    assert states == {"server 0": "alive", "worker 0": "dead"}


def test_a_round_waiting_for_a_slow_worker_is_a_stall_naming_it():
    """Worker 0 pushes and pulls; worker 1 holds its push back: the server's round stalls waiting
    for worker 1 (named), and worker 0's pull stalls waiting for the server (named)."""
    go = threading.Event()
    with InProcessCluster(1, 2, deadline=30, heartbeat_interval=0.1) as cluster:
        def work(config: ClusterConfig) -> dict[str, tuple[int, str]]:
            kv = pskv.create("dist_sync", cluster=config)
            kv.init(1, np.zeros(10, np.float32))
            stalled: dict[str, tuple[int, str]] = {}
            if kv.rank == 1:
                go.wait(20)
            else:
                kv.push(1, np.ones(10, np.float32))
                pull = kv.pull(1, out=np.zeros(10, np.float32), block=False)  # waits for worker 1's push
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    stalled = {n.node: (n.stalls, n.waits_for) for n in kv.metrics(timeout=5).nodes}
                    if stalled["server 0"][0] and stalled["worker 0"][0]:
                        break
                    time.sleep(0.1)
                go.set()
                pull.wait(20)
            if kv.rank == 1:
                kv.push(1, np.ones(10, np.float32))  # late: the round completes, the pull returns
            kv.close()
            return stalled

        stalled = cluster.run_workers(work)[0]
    assert stalled["server 0"] == (1, "worker 1") and stalled["worker 0"] == (1, "server 0"), stalled
