"""The launcher's half of elastic jobs, without processes: ``-n MIN:MAX``, discovery, the plan, the contract."""

from __future__ import annotations

import argparse
import re
import time

import pytest

import pskv
from pskv.cli import main as cli_main
from pskv.config import ClusterConfig
from pskv.errors import LaunchError
from pskv.launch import LaunchConfig, add_arguments, config_from_args
from pskv.launch.contract import ProcessSpec, contract_env
from pskv.launch.discovery import HostDiscovery, parse_hosts
from pskv.launch.elastic import FIXED, ElasticWorkers, workers_of

BASE = {"num_workers": 3, "num_servers": 1, "command": ("python", "train.py"), "min_workers": 2, "max_workers": 4}


def parse(*argv: str) -> LaunchConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args([*argv, "--", "python", "train.py"]))


def test_n_min_max_makes_an_elastic_job_starting_max_workers():
    config = parse("-n", "2:4", "-s", "1", "--elastic-timeout", "30", "--respawn-cooldown", "0")
    assert (config.num_workers, config.min_workers, config.max_workers, config.elastic) == (4, 2, 4, True)
    assert (config.elastic_timeout, config.respawn_cooldown) == (30.0, 0.0)
    assert not parse("-n", "3").elastic and parse("-n", "3").max_workers == 0


@pytest.mark.parametrize("change,match", [
    ({"min_workers": 0}, "-n MIN:MAX needs 1 <= MIN <= MAX"),
    ({"min_workers": 4, "num_workers": 3}, "-n MIN:MAX needs 1 <= MIN <= MAX"),
    ({"worker_restarts": 1}, "--restart-workers does not go with an elastic job"),
    ({"num_servers": 0}, "-s 0 does not go with an elastic job"),
    ({"max_restarts": 2}, "--max-restarts does not go with an elastic job"),
    ({"launcher": "mpi", "hostfile": "h"}, "runs with --launcher local, ssh or slurm, not mpi"),
    ({"elastic_timeout": 0}, "--elastic-timeout must be > 0 seconds"),
    ({"respawn_cooldown": -1}, "--respawn-cooldown must be >= 0 seconds"),
    ({"max_workers": 0, "min_workers": 0, "host_discovery_script": "x"}, "--host-discovery-script needs an elastic job"),
])
def test_an_elastic_config_refuses(change, match):
    with pytest.raises(pskv.InvalidArgumentError, match=re.escape(match)):
        LaunchConfig(**{**BASE, **change})


def test_a_malformed_n_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        cli_main(["launch", "-n", "2:x", "--", "prog"])
    assert "expected W or MIN:MAX (numbers), got '2:x'" in capsys.readouterr().err


def test_the_contract_tells_every_process_the_bounds_and_only_the_scheduler_the_token():
    config = LaunchConfig(**BASE)
    layout = config.layout("127.0.0.1", 9000)
    scheduler, server = contract_env(layout, "scheduler", "h"), contract_env(layout, "server", "h", rank=0)
    worker = contract_env(layout, "worker", "h", rank=5, local_rank=5)
    for env in (scheduler, server, worker):
        assert (env["PSKV_MIN_WORKERS"], env["PSKV_MAX_WORKERS"], env["PSKV_ELASTIC_TIMEOUT"]) == ("2", "4", "600")
    assert re.fullmatch("[0-9a-f]{64}", scheduler["PSKV_LAUNCH_TOKEN"])
    assert "PSKV_LAUNCH_TOKEN" not in server and "PSKV_LAUNCH_TOKEN" not in worker
    assert worker["DMLC_WORKER_ID"] == "5" and "RANK" not in worker  # the slot; no torchrun ranks
    assert "PSKV_MAX_WORKERS" not in contract_env(LaunchConfig(**{**BASE, "min_workers": 0, "max_workers": 0})
                                                  .layout("127.0.0.1", 9000), "server", "h", rank=0)


def test_an_elastic_jobs_heartbeats_default_to_half_a_second_and_three_unless_set():
    elastic = {"PSKV_MIN_WORKERS": "1", "PSKV_MAX_WORKERS": "4"}
    config = ClusterConfig.from_env(elastic)
    assert (config.heartbeat_interval, config.heartbeat_timeout) == (0.5, 3.0)
    assert ClusterConfig.from_env({**elastic, "PS_HEARTBEAT_TIMEOUT": "7"}).heartbeat_timeout == 7.0
    assert ClusterConfig.from_env({}).heartbeat_timeout == 10.0


def test_discovery_lines_are_host_and_slots():
    assert parse_hosts("a:2\nb\n# note\n\nc:0  # none now\na:1\n") == {"a": 3, "b": 1, "c": 0}
    with pytest.raises(ValueError, match="expected HOST or HOST:SLOTS, got 'a:x'"):
        parse_hosts("a:x")


def test_a_failing_first_discovery_stops_the_launch_and_a_later_failure_keeps_the_last_hosts(tmp_path):
    with pytest.raises(LaunchError, match="--host-discovery-script 'exit 3': exited with 3"):
        HostDiscovery("exit 3", 1.0, {}, print).start()
    hosts, notes = tmp_path / "hosts", []
    hosts.write_text("h:2\n")
    discovery = HostDiscovery(f"cat {hosts}", 0.01, {}, notes.append)
    assert discovery.start() == {"h": 2}
    try:
        hosts.write_text("h:x\n")
        deadline = time.monotonic() + 10
        while not notes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert discovery.slots() == {"h": 2} and "keeping the hosts it named before" in notes[0]
    finally:
        discovery.stop()


class Found:
    """A discovery whose answer the test sets."""

    def __init__(self, hosts: dict[str, int]) -> None:
        self.hosts = hosts

    def slots(self) -> dict[str, int]:
        return dict(self.hosts)

    def stop(self) -> None:
        pass


def spec(slot: int) -> ProcessSpec:
    return ProcessSpec("worker", slot, "127.0.0.1", ("prog",))


def test_the_plan_starts_fresh_slots_up_to_max_and_keeps_a_departed_place_cool():
    now, started, notes = [0.0], [], []
    found = Found({"a": 2, "b": 1})
    workers = ElasticWorkers(1, 4, found, found.slots(), 10.0, notes.append, clock=lambda: now[0])  # type: ignore[arg-type]
    workers._roster = None  # no scheduler here: reports are not sent
    workers._start = lambda slot, host, local: started.append(slot)
    for host in workers._first:
        workers._launch(host)
    assert started == [0, 1, 2] and workers.live == {0: "a", 1: "b", 2: "a"}  # round-robin over the hosts
    assert workers.departed(spec(2), -9, "was killed by SIGKILL")  # a departure: the job goes on
    assert "worker slot 2 on 127.0.0.1 was killed by SIGKILL: it left the job; 2 workers go on" in notes[-1]
    workers.tick()
    assert started == [0, 1, 2]  # slot 2's place on a cools
    now[0] = 11.0
    workers.tick()
    assert started == [0, 1, 2, 3] and workers.live[3] == "a"  # a fresh slot, never 2 again
    found.hosts = {"a": 2, "b": 1, "c": 5}
    workers.tick()
    assert started == [0, 1, 2, 3, 4] and len(workers.live) == 4  # MAX
    assert not workers.departed(spec(0), 0, "exited 0")  # an exit 0: the job ends, nothing more starts
    found.hosts["d"] = 9
    workers.tick()
    assert started == [0, 1, 2, 3, 4]


def test_the_last_workers_failure_is_the_jobs_and_a_fixed_job_has_no_departures():
    found = Found({"a": 1})
    workers = ElasticWorkers(1, 2, found, found.slots(), 0.0, print)  # type: ignore[arg-type]
    workers._start = lambda *started: None
    workers._launch("a")
    assert not workers.departed(spec(0), 1, "exited with code 1")  # nobody left to go on
    assert not FIXED.departed(spec(0), 1, "exited with code 1")


def test_fewer_discovered_slots_than_min_is_a_launch_error():
    config = LaunchConfig(**{**BASE, "host_discovery_script": "echo 127.0.0.1:1"})
    with pytest.raises(LaunchError, match="^--host-discovery-script named 1 worker slots; an elastic job needs MIN 2 "):
        workers_of(config, print)
    # no script: the message names where the slots came from, -H's hosts or the allocation's
    hosts = {**BASE, "launcher": "ssh", "hostfile": "h1:1,h2:1", "min_workers": 3}
    with pytest.raises(LaunchError, match="^-H h1:1,h2:1 named 2 worker slots; an elastic job needs MIN 3 to start"):
        workers_of(LaunchConfig(**hosts), print, {"h1": 1, "h2": 1})
    with pytest.raises(LaunchError, match=r"^the allocation \(SLURM_JOB_NODELIST\) named 2 worker slots"):
        workers_of(LaunchConfig(**{**hosts, "launcher": "slurm", "hostfile": None}), print, {"h1": 1, "h2": 1})
    config, workers = workers_of(LaunchConfig(**{**BASE, "host_discovery_script": "echo a:2; echo b:9"}), print)
    try:
        assert config.num_workers == 4 and isinstance(workers, ElasticWorkers)
    finally:
        workers.close()


def test_a_host_with_fewer_slots_has_its_newest_workers_drained_once_and_their_exit_0_is_no_end():
    found, notes = Found({"a": 3}), []
    workers = ElasticWorkers(1, 4, found, found.slots(), 0.0, notes.append)  # type: ignore[arg-type]
    workers._start = lambda *started: None
    for host in workers._first:
        workers._launch(host)
    found.hosts = {"a": 1}
    workers.tick()
    workers.tick()  # asked once only
    assert set(workers._draining) == {1, 2} and [n for n in notes if "drained at the next commit" in n] == [
        "a has fewer slots now: worker slot 2 is drained at the next commit",
        "a has fewer slots now: worker slot 1 is drained at the next commit"]
    assert workers.departed(spec(2), 0, "exited 0")  # drained: not the job's end
    assert "worker slot 2 on 127.0.0.1 was drained: it left the job at a commit; 2 workers go on" in notes[-1]
    workers.tick()
    assert set(workers._draining) == {1} and len(workers.live) == 2


def test_a_drained_worker_that_does_not_leave_in_time_is_stopped_once_and_its_exit_is_a_departure():
    now, stopped, notes = [0.0], [], []
    found = Found({"a": 2})
    workers = ElasticWorkers(1, 4, found, found.slots(), 0.0, notes.append, clock=lambda: now[0],  # type: ignore[arg-type]
                             drain_timeout=5.0)
    workers._start, workers._stop = (lambda *started: None), stopped.append
    for host in workers._first:
        workers._launch(host)
    found.hosts = {"a": 1}
    workers.tick()
    now[0] = 4.0
    workers.tick()
    assert stopped == []
    now[0] = 6.0
    workers.tick()
    workers.tick()
    assert stopped == [1] and "worker slot 1 did not leave within --drain-timeout 5 s of its drain" in notes[-1]
    assert workers.departed(spec(1), -15, "was killed by SIGTERM")  # stopped: a departure, the job goes on
