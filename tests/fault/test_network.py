"""Network faults between real processes in two network namespaces joined by a veth pair.

Each test makes its own namespaces (``netns.VethPair``: 10.213.7.1/30 in *core*,
10.213.7.2 in *edge*, names unique to this process) and always deletes them; every
process is started with ``ip netns exec`` and reaped. Where namespaces, veth pairs or a
qdisc are not permitted (no root, no CAP_NET_ADMIN, a kernel without ``sch_netem``) the
test is skipped with the reason.

Two placements, so that both ways a node can be cut off are covered:

* ``server-cut``: server 0 alone in edge; scheduler and both workers in core. A lasting
  partition: the scheduler stops hearing the server and every worker learns from its
  heartbeat replies that ``server 0`` is dead.
* ``workers-cut``: scheduler and server 0 in core; both workers in edge. A lasting
  partition: each worker stops hearing the scheduler and must give up on its own,
  naming the scheduler.

Faults: the edge end of the link taken down and brought back (shorter than the
heartbeat timeout: TCP's retransmissions — the bounded resend — carry every message
across, no node is declared dead); taken down for good (the typed error within a
bound derived from ``PS_HEARTBEAT_TIMEOUT``, then every process exits); a ``tbf`` rate
limit (or ``netem`` delay, where the kernel has it): correct, just slower; packet loss
(``netem loss`` where available; here a ``tbf`` whose queue is so short that bursts are
tail-dropped, checked through the qdisc's drop counter): correct.

Correctness is exact: the servers run ``SGD(learning_rate=1)``, so a key's value after
round ``i`` is minus the sum of every push of rounds 1..i, and each worker checks every
pulled value — a push lost, or counted twice, changes it.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest

from pskv.testing.hosts import netem_available
from tests.fault.netns import NetJob, Unavailable, VethPair, probe_qdisc

HEARTBEAT_INTERVAL = 0.25
HEARTBEAT_TIMEOUT = 4.0
FLAP_SECONDS = 1.0  # well under the heartbeat timeout, even with TCP's retransmission backoff after it
REQUEST_TIMEOUT = 30.0  # a lost reply would end in OperationTimeoutError, not a hang
# Detection: silent for HEARTBEAT_TIMEOUT, then the liveness check (every interval / 2) and
# the survivors' next heartbeat replies (every interval); the rest is slack for a loaded machine.
DETECTION_BOUND = HEARTBEAT_TIMEOUT + 2 * HEARTBEAT_INTERVAL + 3.0

ENV = {
    "PS_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
    "PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "PSKV_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT),
    "PSKV_STARTUP_TIMEOUT": "30",
}

PLACEMENTS = {
    "server-cut": {"server 0": "edge", "worker 0": "core", "worker 1": "core"},
    "workers-cut": {"server 0": "core", "worker 0": "edge", "worker 1": "edge"},
}
WORKERS = ("worker 0", "worker 1")

# The workers' program. Parameters come from NET_* variables. Each iteration pushes
# (rank + 1) * i to both keys — blocking push + pull, pushpull, or a quiet non-blocking
# push + pull in turn — and checks the pulled values exactly.
WORKER = r"""
import os, sys, time
import numpy as np
import pskv
from pskv.optimizer import SGD

iters = int(os.environ["NET_ITERS"])
pace = float(os.environ["NET_PACE"])
size = int(os.environ["NET_SIZE"])
kv = pskv.create("dist_sync")
rank, n = kv.rank, kv.num_workers
keys = ["small", "big"]
kv.init(keys, [np.zeros(4, np.float32), np.zeros(size, np.float32)])
kv.set_optimizer(SGD(learning_rate=1.0))  # w -= the round's sum: every push shows in the value
print("ready", flush=True)
start = time.monotonic()
stall = 0.0
try:
    for i in range(1, iters + 1):
        t = time.monotonic()
        vals = [np.full(4, (rank + 1) * i, np.float32), np.full(size, (rank + 1) * i, np.float32)]
        if i % 3 == 0:
            kv.push(keys, vals)
            out = kv.pull(keys)
        elif i % 3 == 1:
            kv.pushpull(keys, vals)
            out = vals
        else:
            kv.push(keys, vals, block=False)
            out = kv.pull(keys)
        want = -(n * (n + 1) // 2) * i * (i + 1) // 2
        for k, o in zip(keys, out):
            if not (o == want).all():
                print(f"WRONG key {k} after round {i}: {o[:4]} != {want}", flush=True)
                sys.exit(2)
        stall = max(stall, time.monotonic() - t)
        print(f"iter {i} at={time.monotonic():.3f}", flush=True)
        if pace:
            time.sleep(pace)
except (pskv.NodeFailedError, pskv.OperationTimeoutError) as exc:
    node = getattr(exc, "node", None)
    print(f"failed at={time.monotonic():.3f} node={node!r} type={type(exc).__name__} error={exc}", flush=True)
    kv.close()
    print("closed", flush=True)
    sys.exit(3)
print(f"done iters={iters} elapsed={time.monotonic() - start:.3f} max_stall={stall:.3f} value={want}", flush=True)
kv.close()
"""


@pytest.fixture
def start_job(net, tmp_path):
    """Starts a NetJob in ``net``; every job it started is reaped (before ``net`` goes)."""
    jobs: list[NetJob] = []

    def start(placement: str, **params: object) -> NetJob:
        env = {**ENV, **{f"NET_{k.upper()}": str(v) for k, v in params.items()}}
        job = NetJob(net, tmp_path, WORKER, PLACEMENTS[placement], env)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.close(grace=0)


def iteration(line: str) -> int:
    return int(line.split()[1])


def field(line: str, name: str) -> str:
    m = re.search(rf"{name}=(\S+)", line)
    assert m, f"no {name}= in {line!r}"
    return m.group(1)


def finish(job: NetJob, iters: int, timeout: float) -> dict[str, str]:
    """Wait for both workers' ``done`` lines and every process's exit 0; returns the done lines."""
    done = {w: job.expect(w, "done", timeout) for w in WORKERS}
    want = -3 * iters * (iters + 1) // 2
    for line in done.values():
        assert int(field(line, "value")) == want, line
    codes = job.wait_all(20)
    assert all(code == 0 for code in codes.values()), f"{codes}\n{job.describe()}"
    return done


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_link_down_briefly_then_up_loses_nothing(net, start_job, placement):
    """The link goes down for 1 s mid-loop: rounds wait, then go on; every value exact, nobody declared dead."""
    iters, down_at = 100, 15
    job = start_job(placement, iters=iters, pace=0.02, size=16384)
    for w in WORKERS:
        job.expect(w, f"iter {down_at} ", 40)
    net.set_link(False)
    went_down = time.monotonic()
    time.sleep(FLAP_SECONDS)  # the outage itself
    net.set_link(True)
    came_up = time.monotonic()
    assert not any(p.poll() is not None for p in job.procs), job.describe()
    done = finish(job, iters, 40)
    # training went on after the link came back: iterations were still to do then
    after = [line for w in WORKERS for line in job[w].text() if line.startswith("iter ")
             and float(field(line, "at")) > came_up]
    assert len(after) >= 2, f"the link flap did not happen in the middle of the loop:\n{job.describe()}"
    stalls = [float(field(line, "max_stall")) for line in done.values()]
    assert max(stalls) >= FLAP_SECONDS * 0.5, f"no round waited for the link: {stalls}"
    assert max(stalls) < HEARTBEAT_TIMEOUT, f"a round waited longer than the heartbeat timeout: {stalls}"
    for p in job.procs:
        assert not any("dead" in line for line in p.text()), f"{p.name} saw a death:\n{job.describe()}"
    print(f"{placement}: link down {came_up - went_down:.2f} s, longest round {max(stalls):.2f} s")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement,named", [("server-cut", "server 0"), ("workers-cut", "scheduler")])
def test_lasting_partition_ends_in_node_failed_error(net, start_job, placement, named):
    """The link stays down: each worker's blocked call raises NodeFailedError naming the lost node in
    about one heartbeat timeout, and every process (on both sides) exits by itself."""
    job = start_job(placement, iters=100000, pace=0.02, size=1024)
    for w in WORKERS:
        job.expect(w, "iter 5 ", 40)
    net.set_link(False)
    went_down = time.monotonic()
    detected = {}
    for w in WORKERS:
        line = job.expect(w, "failed at=", DETECTION_BOUND + 5)
        assert f"node={named!r} type=NodeFailedError" in line, line
        detected[w] = float(field(line, "at")) - went_down
    for seconds in detected.values():
        # not at once (about one heartbeat timeout; a loaded machine may delay heartbeats) ...
        assert seconds > HEARTBEAT_TIMEOUT / 2, detected
        # ... and within one timeout plus the time the news takes to travel
        assert seconds < DETECTION_BOUND, detected
    codes = job.wait_all(20)  # nothing hangs: every process ends by itself
    assert all(codes[w] == 3 for w in WORKERS), f"{codes}\n{job.describe()}"
    assert codes["scheduler"] == 0, f"{codes}\n{job.describe()}"
    if placement == "server-cut":  # the cut-off server lost the scheduler: it fails loudly
        assert codes["server 0"] != 0, codes
        assert any("scheduler failed" in line for line in job["server 0"].text()), job.describe()
    else:  # the scheduler declared the workers dead, which ends the job for the server
        assert codes["server 0"] == 0, f"{codes}\n{job.describe()}"
    print(f"{placement}: {named} reported dead {max(detected.values()):.2f} s after the link went down "
          f"(heartbeat timeout {HEARTBEAT_TIMEOUT} s)")


def shape(net: VethPair, kind: str, spec: list[str]) -> None:
    """Put qdisc ``spec`` on both ends; skip the test where this kernel lacks it (``netem`` is often missing)."""
    if spec[0] == "netem" and not netem_available():
        pytest.skip(f"{kind}: this kernel has no sch_netem (the tbf kinds run)")
    try:
        net.add_qdisc(spec)
    except Unavailable as exc:
        pytest.skip(f"{kind} is not available here: {exc}")


RATE_BYTES = 1 << 20  # 8 Mbit/s each way

SHAPING = {
    # a rate limit with a queue long enough for everything in flight: delay, no loss
    "tbf-rate": ["tbf", "rate", f"{RATE_BYTES * 8}bit", "burst", "16kb", "latency", "5s"],
    "netem-delay": ["netem", "delay", "20ms", "5ms"],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(SHAPING))
def test_delay_gives_correct_results_just_slower(net, start_job, kind):
    """Shaped both ways: every value exact, no drops, and no faster than the shaping allows."""
    shape(net, kind, SHAPING[kind])
    iters, size = 20, 16384  # 64 KiB per push and per pull
    before = net.link_bytes()
    job = start_job("workers-cut", iters=iters, pace=0, size=size)
    done = finish(job, iters, 45)
    elapsed = max(float(field(line, "elapsed")) for line in done.values())
    sent = net.link_bytes()
    payload = 2 * iters * size * 4  # both workers' pushes one way; as much comes back in pulls
    assert sent["edge"] - before["edge"] >= payload and sent["core"] - before["core"] >= payload, (before, sent)
    if kind == "tbf-rate":
        floor = 0.8 * payload / RATE_BYTES  # the rate limit alone takes this long
    else:  # at least one round trip per iteration, of 2 x (20 ms - 5 ms jitter)
        floor = iters * 0.03
    assert elapsed >= floor, f"{elapsed:.2f} s is faster than the shaping allows ({floor:.2f} s)"
    stats = net.qdisc_stats()
    assert stats["edge"].get("drops", 0) == 0 and stats["core"].get("drops", 0) == 0, stats
    print(f"{kind}: {iters} iterations in {elapsed:.2f} s (the shaping allows no less than {floor:.2f} s)")


LOSS = {
    "netem-loss": ["netem", "loss", "3%"],
    # a 40 KiB queue in front of a 64 Mbit/s link: TCP's bursts overflow it and are
    # tail-dropped (here about a quarter of all packets), TCP retransmits them
    "tbf-taildrop": ["tbf", "rate", "64mbit", "burst", "32kb", "limit", "40kb"],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(LOSS))
def test_packet_loss_gives_correct_results(net, start_job, kind):
    """Packets dropped both ways (checked through the qdisc's counter): every value still exact."""
    shape(net, kind, LOSS[kind])
    iters = 20
    job = start_job("workers-cut", iters=iters, pace=0, size=16384)
    done = finish(job, iters, 45)
    stats = net.qdisc_stats()
    drops = stats["edge"].get("drops", 0) + stats["core"].get("drops", 0)
    packets = stats["edge"].get("packets", 0) + stats["core"].get("packets", 0)
    assert drops > 0, f"no packet was dropped, so no loss was tested: {stats}"
    elapsed = max(float(field(line, "elapsed")) for line in done.values())
    print(f"{kind}: {iters} iterations in {elapsed:.2f} s with {drops} of {drops + packets} packets dropped")


@pytest.mark.timeout(60)
def test_connections_reset_in_the_middle_recover(net, start_job):
    """Every TCP connection of the workers reset mid-loop (the link stays up): training goes on.

    ZeroMQ reconnects under the same routing identities; each worker sends every request
    still unanswered again (messages in the dead connections are lost), and the server
    answers repeats without applying them twice — every pulled value is checked exactly.
    """
    iters = 150
    job = start_job("workers-cut", iters=iters, pace=0.02, size=1024)
    for w in WORKERS:
        job.expect(w, "iter 15 ", 40)
    try:
        killed = net.reset_connections("edge")  # every TCP connection of both workers, the link stays up
    except Unavailable as exc:
        pytest.skip(f"cannot reset connections here: {exc}")
    assert killed, "no connection was reset"
    finish(job, iters, 30)
    for w in WORKERS:  # the resend after the reconnect did happen
        assert any("sending" in line and "unanswered request(s) again" in line for line in job[w].text()), \
            job.describe()


def test_probe_reports_an_unknown_qdisc_as_unavailable(net):
    """The skip path itself: a qdisc no kernel has raises Unavailable (and leaves nothing behind)."""
    if shutil.which("tc") is None:
        pytest.skip("the `tc` command (iproute2) is not installed")
    with pytest.raises(Unavailable, match="no-such-qdisc"):
        probe_qdisc(["no-such-qdisc"])
    assert set(net.all_of_this_process()) == set(net.ns.values())  # the probe's pair is gone
