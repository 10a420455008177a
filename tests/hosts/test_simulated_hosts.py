"""Jobs on simulated hosts (:mod:`pskv.testing.hosts`), started through ``pskv launch --launcher ssh``.

Each host is a network namespace with its own host name, so workers reach servers of
their own host through shared memory and the others through sockets over the bridge,
as on real machines. Needs root; skips where namespaces are not permitted.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pskv.testing.hosts import SimulatedHosts, Unavailable, netem_available, strip_ssh_options
from pskv.testing.hosts import main as hosts_main
from pskv.testing.jobs import ProcessGroup, run_launch, start_launch

WORKERS = 4
SERVERS = 2
ITERS = 5
BIG = 3000  # elements: over the bigarray bound below, so split over both servers
JOB_TIMEOUT = 60.0  # a job takes seconds; on a loaded 2-core machine, starting its Python processes takes half a minute
HEARTBEAT_TIMEOUT = 2.0
ENV = ["--env", "MXNET_KVSTORE_BIGARRAY_BOUND=1000", "--env", "PSKV_STARTUP_TIMEOUT=20"]

# Each worker pushes integer-valued arrays (exact float sums in any order) to three keys
# and pulls them every round; at the end it prints each key's SHA-256 and which servers'
# shared-memory directories it has mapped (the shared-memory path in use).
WORKER = r"""
import hashlib, os, sys, time
import numpy as np
import pskv

kv = pskv.create("dist_sync")
rank = kv.rank
keys = ["small", "mid", "big"]
sizes = [7, 500, int(sys.argv[1])]
kv.init(keys, [np.zeros(n, np.float32) for n in sizes])
print(f"ready rank={rank}", flush=True)
pace = float(sys.argv[3])
try:
    for i in range(int(sys.argv[2])):
        rng = np.random.default_rng(1000 * rank + i)
        kv.push(keys, [rng.integers(-50, 50, n).astype(np.float32) for n in sizes])
        out = kv.pull(keys)
        print(f"iter {i}", flush=True)
        time.sleep(pace)
except (pskv.NodeFailedError, pskv.OperationTimeoutError) as exc:
    print(f"failed node={getattr(exc, 'node', None)!r} type={type(exc).__name__} error={exc}", flush=True)
    kv.close()
    sys.exit(3)
for k, o in zip(keys, out):
    print(f"value rank={rank} key={k} sha256={hashlib.sha256(np.ascontiguousarray(o).tobytes()).hexdigest()}",
          flush=True)
# one 4 MiB key in one call (a gradient bucket): between hosts its messages to each server are paced
# (pskv.worker.pacing); count the calls that held a message for an answer
from pskv.worker import pacing
holding, paced = pacing.Pacing._holding, []
pacing.Pacing._holding = lambda self, pacer: (paced.append(pacer), holding(self, pacer))[1]
kv.init("bucket", np.zeros(1 << 20, np.float32))
bucket = np.zeros(1 << 20, np.float32)
kv.pushpull("bucket", np.full(1 << 20, rank + 1.0, np.float32), out=bucket)
print(f"bucket rank={rank} sum={bucket.min()},{bucket.max()} window={kv._worker.client.pacing.window} "
      f"paced={len(paced)}", flush=True)
maps = open("/proc/self/maps").read()
dirs = sorted({line.split("/")[-2] for line in maps.splitlines() if "server-" in line and "/pskv-" in line})
print(f"shm rank={rank} host={os.uname().nodename} dirs={len(dirs)}", flush=True)
print(f"channels rank={rank} {','.join(kv._worker.client.channels())}", flush=True)
kv.close()
"""


def launch_args(hosts: SimulatedHosts, tmp_path: Path, slots: list[int], iters: int = ITERS, pace: float = 0.0,
                env: tuple[str, ...] = (), server_hosts: int = 0) -> list[str]:
    """``pskv launch --launcher ssh`` arguments of the worker job on ``hosts`` (``slots[i]`` workers on host i).

    ``server_hosts``: the last that many hosts are dedicated server hosts (``--server-hostfile``)
    and the hostfile lists the others.
    """
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    hostfile = tmp_path / "hosts"
    if not server_hosts:
        hosts.hostfile(hostfile, slots)
    else:
        workers_on, servers_on = hosts.hosts[:-server_hosts], hosts.hosts[-server_hosts:]
        hostfile.write_text("".join(f"{h.address} {n}\n" for h, n in zip(workers_on, slots)), encoding="utf-8")
        (tmp_path / "servers").write_text("".join(f"{h.address}\n" for h in servers_on), encoding="utf-8")
        env = ("--server-hostfile", str(tmp_path / "servers"), *env)
    return ["-n", str(WORKERS), "-s", str(SERVERS), "--launcher", "ssh",
            "-H", str(hostfile), "--ssh-command", hosts.ssh_command(), "--timeout", str(JOB_TIMEOUT),
            "--exit-grace", "5", "--stop-grace", "2", *ENV, *env, "--",
            sys.executable, str(script), str(BIG), str(iters), str(pace)]


def launch(hosts: SimulatedHosts, tmp_path: Path, slots: list[int], server_hosts: int = 0) -> tuple[int, str]:
    """Run the worker job on ``hosts`` through the ssh launcher; (exit code, output)."""
    return run_launch(launch_args(hosts, tmp_path, slots, server_hosts=server_hosts), tmp_path, JOB_TIMEOUT + 15)


def values(out: str) -> dict[tuple[int, str], str]:
    found = {(int(m[1]), m[2]): m[3] for m in re.finditer(r"value rank=(\d+) key=(\w+) sha256=(\w+)", out)}
    assert len(found) == WORKERS * 3, out
    return found


def channels(out: str) -> dict[int, list[str]]:
    """worker rank -> how its requests reach each server (WorkerClient.channels)."""
    return {int(m[1]): m[2].split(",") for m in re.finditer(r"channels rank=(\d+) (\S+)", out)}


def shm_dirs(out: str) -> dict[int, int]:
    return {int(m[1]): int(m[2]) for m in re.finditer(r"shm rank=(\d+) host=\S+ dirs=(\d+)", out)}


@pytest.fixture(scope="module")
def one_host_values(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str], str]:
    """The job's values with every process on one simulated host (computed once)."""
    try:
        hosts = SimulatedHosts(1)
    except Unavailable as exc:
        pytest.skip(f"simulated hosts unavailable: {exc}")
    with hosts:
        code, out = launch(hosts, tmp_path_factory.mktemp("one"), [WORKERS])
    assert code == 0, out
    assert shm_dirs(out) == {r: SERVERS for r in range(WORKERS)}, out  # every server is local
    return values(out)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("count", [2, 4])
def test_a_job_on_several_hosts_gives_the_one_host_values(count, simulated_hosts, one_host_values, tmp_path):
    hosts = simulated_hosts(count)
    before = [hosts.link_bytes(i) for i in range(count)]
    start = time.monotonic()
    code, out = launch(hosts, tmp_path, [WORKERS // count] * count)
    elapsed = time.monotonic() - start
    assert code == 0, out
    assert values(out) == one_host_values
    # placement (pskv.launch.ssh): servers on hosts 0 and 1; workers round-robin over the hosts
    worker_host = [r % count for r in range(WORKERS)]
    assert shm_dirs(out) == {r: int(worker_host[r] < SERVERS) for r in range(WORKERS)}, out
    # the server of a worker's host through its local socket, the others through data connections
    assert channels(out) == {r: ["local" if worker_host[r] == s else "tcp" for s in range(SERVERS)]
                             for r in range(WORKERS)}, out
    for i in range(count):  # every host sent its pushes over its link (the servers are not all local)
        sent = hosts.link_bytes(i)["tx"] - before[i]["tx"]
        assert sent > ITERS * BIG * 4 / SERVERS, (i, sent, out)
    print(f"{count} hosts: job {elapsed:.1f} s")


@pytest.mark.timeout(150)
def test_dedicated_server_hosts_give_the_one_host_values_and_every_worker_uses_sockets(simulated_hosts,
                                                                                       one_host_values, tmp_path):
    """``--server-hostfile``: hosts 0 and 1 run two workers each, hosts 2 and 3 one server each (BytePS's placement)."""
    hosts = simulated_hosts(4)
    before = [hosts.link_bytes(i) for i in range(4)]
    code, out = launch(hosts, tmp_path, [WORKERS // 2] * 2, server_hosts=2)
    assert code == 0, out
    assert values(out) == one_host_values
    assert shm_dirs(out) == {r: 0 for r in range(WORKERS)}, out  # no server on a worker's host: no shared memory
    assert channels(out) == {r: ["tcp"] * SERVERS for r in range(WORKERS)}, out
    assert {m[1] for m in re.finditer(r"shm rank=\d+ host=(\S+)", out)} == {"simhost0", "simhost1"}, out
    for rank in range(WORKERS):  # between hosts a bucket's messages wait for answers (4 per server at most)
        assert re.search(rf"bucket rank={rank} sum=10.0,10.0 window=4 paced=[1-9]", out), out
    moved = [{k: hosts.link_bytes(i)[k] - before[i][k] for k in ("tx", "rx")} for i in range(4)]
    pushed = WORKERS * ITERS * BIG * 4 / SERVERS  # what each server receives of the big key alone
    for i in (2, 3):  # the server hosts receive every worker's pushes and send the pulls back
        assert moved[i]["rx"] > pushed and moved[i]["tx"] > pushed, (i, moved, out)
    for i in (0, 1):  # a worker host sends its two workers' pushes of the whole key
        assert moved[i]["tx"] > 2 * ITERS * BIG * 4, (i, moved, out)


@pytest.mark.timeout(150)
def test_a_host_whose_link_goes_down_is_named_in_a_typed_error(simulated_hosts, tmp_path):
    """Host 3 (worker 3 alone) is cut off mid-job: the others' calls fail with NodeFailedError naming worker 3."""
    hosts = simulated_hosts(4)
    args = launch_args(hosts, tmp_path, [1, 1, 1, 1], iters=100_000, pace=0.02,
                       env=("--env", f"PS_HEARTBEAT_TIMEOUT={HEARTBEAT_TIMEOUT}", "--env", "PS_HEARTBEAT_INTERVAL=0.25"))
    with ProcessGroup("pskv launch") as group:
        proc = start_launch(group, args, tmp_path)
        group.expect("launch", "[worker 3] iter 5", JOB_TIMEOUT)
        cut = time.monotonic()
        hosts.set_link(3, False)
        code = proc.wait(JOB_TIMEOUT + 10)
        ended = time.monotonic()
        out = proc.output()
    assert code == 3, out  # the first worker that failed (pskv launch exits with its code)
    failed = {int(m[1]): (m[2], m[3]) for m in re.finditer(r"\[worker (\d)\] failed node='([^']*)' type=(\w+)", out)}
    survivors = {r: v for r, v in failed.items() if r != 3}
    assert survivors and set(survivors.values()) == {("worker 3", "NodeFailedError")}, out
    assert failed.get(3, ("scheduler", "NodeFailedError")) == ("scheduler", "NodeFailedError"), out  # if not stopped first
    assert "scheduler: worker 3 missed heartbeats" in out, out
    assert HEARTBEAT_TIMEOUT <= ended - cut < HEARTBEAT_TIMEOUT + 8, (ended - cut, out)


def test_enter_refuses_an_unknown_host_and_bad_tables(capsys):
    assert hosts_main(["enter", "10.0.0.1=ns0/h0", "-o", "BatchMode=yes", "10.0.0.9", "true"]) == 255
    assert "unknown host '10.0.0.9' (known: 10.0.0.1)" in capsys.readouterr().err
    assert hosts_main(["enter", "10.0.0.1=ns0"]) == 2
    assert hosts_main(["enter", "10.0.0.1=ns0/h0", "-o", "BatchMode=yes"]) == 2
    assert hosts_main(["ls"]) == 2
    assert strip_ssh_options(["-oBatchMode=yes", "-T", "-p", "22", "-l", "me", "u@h", "cmd", "x"]) == [
        "u@h", "cmd", "x"]


def test_without_the_privilege_to_make_namespaces_it_is_unavailable_and_leaves_nothing():
    """In a user namespace of its own (no capability over the machine's namespaces) making hosts fails cleanly."""
    code = ("from pskv.testing.hosts import SimulatedHosts, Unavailable\n"
            "try:\n    SimulatedHosts(2)\nexcept Unavailable as exc:\n    print('Unavailable:', exc)")
    try:
        res = subprocess.run(["unshare", "--user", sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=30)
    except FileNotFoundError:
        pytest.skip("no `unshare` command")
    if res.returncode != 0 and "unshare failed" in res.stderr:
        pytest.skip(f"user namespaces not permitted: {res.stderr.strip()}")
    assert res.returncode == 0 and res.stdout.startswith("Unavailable: `ip netns add pskvh"), res
    made = re.search(r"ip netns add (pskvh\d+x)", res.stdout)
    assert made is not None and made[1] not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


# Host 1 receives bytes on a TCP port and prints how many and how long from the first to the end; host 0 sends.
RECEIVER = "import socket, time; s = socket.create_server(('{addr}', 5001)); print('listening', flush=True); " \
           "c, _ = s.accept(); n = len(c.recv(1 << 16)); t = time.monotonic()\n" \
           "while (b := c.recv(1 << 16)): n += len(b)\nprint(n, time.monotonic() - t, flush=True)"
SENDER = "import socket; c = socket.create_connection(('{addr}', 5001), timeout=20); c.sendall(bytes({n})); c.close()"


def enter(hosts: SimulatedHosts, index: int, code: str) -> list[str]:
    """argv running ``python -c code`` on host ``index`` through the remote shell, as the launcher would."""
    import shlex

    return [*shlex.split(hosts.ssh_command()), "-o", "BatchMode=yes", hosts[index].address,
            shlex.join([sys.executable, "-c", code])]


RATE = "40mbit"


@pytest.mark.timeout(30)
def test_a_rate_limits_the_links_between_hosts(simulated_hosts):
    hosts = simulated_hosts(2, rate=RATE)
    payload = 2_000_000  # 0.4 s at 40 Mbit/s
    receiver = subprocess.Popen(enter(hosts, 1, RECEIVER.format(addr=hosts[1].address)), stdout=subprocess.PIPE,
                                text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline() == "listening\n"
        subprocess.run(enter(hosts, 0, SENDER.format(addr=hosts[1].address, n=payload)), check=True, timeout=20)
        received, elapsed_text = receiver.communicate(timeout=20)[0].split()
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    assert int(received) == payload
    elapsed = float(elapsed_text)
    assert elapsed >= payload * 8 / 40e6 * 0.8, elapsed  # tbf's burst lets a little through at once


def test_a_delay_is_netem_where_the_kernel_has_it_and_the_rate_is_tbf_everywhere(simulated_hosts):
    hosts = simulated_hosts(1, rate=RATE, delay="1ms")
    out = subprocess.run(["ip", "netns", "exec", hosts[0].netns, "tc", "qdisc", "show", "dev", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    assert "tbf" in out and "rate 40Mbit" in out, out
    if netem_available():
        assert hosts.delay == "1ms" and "netem" in out and "delay 1ms" in out, out
    else:  # no sch_netem: the delay is left out, the rate still holds
        assert hosts.delay is None and "netem" not in out, out


def test_destroy_kills_what_still_runs_inside_and_removes_every_namespace(simulated_hosts):
    hosts = simulated_hosts(2)
    with subprocess.Popen(enter(hosts, 1, "import time; print('up', flush=True); time.sleep(60)"),
                          stdout=subprocess.PIPE, text=True) as left:
        try:
            assert left.stdout is not None and left.stdout.readline() == "up\n"
            hosts.destroy()
            assert left.wait(timeout=10) == -9  # ip netns exec ... exec'd into the python that got SIGKILL
        finally:
            if left.poll() is None:
                left.kill()
    assert hosts.all_of_this_process() == []
