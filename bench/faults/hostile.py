"""Hostile peers against a live job: one trial per category, and its table (issue 10).

Each trial starts the fuzz rows' job (scheduler, 1 server, 2 workers pushing and pulling
4 keys and checking every pulled value) and, once the workers train, attacks the server
from this process as a stranger on the host would (plain ZeroMQ sockets, raw Unix
sockets; no CURVE key):

* slow_reader: a peer says HELLO as worker 1, then sends 60,000 pulls of 16 copies of
  key 103 (256 KB each if answered with values; an error reply if refused) and never
  reads a reply (``PSKV_SLOW_PEER_TIMEOUT`` 2 s, ``PSKV_SEND_QUEUE_BYTES`` 64 MB);
  slow_member: the same from inside worker 1's process, with its token (a member that
  stops reading): 3000 pulls, 750 MB of replies if all were kept;
  growth_member: from inside worker 1's process, with its token: 500 more connections each
  opened with HELLO under a new send-only socket name and one without (at most 64 are kept
  per worker, the least recently used forgotten: worker 1's own, in use, stays bound),
  20,000 requests with distinct ids, 3000 pulls after push 10^9;
* many_frames: one message of 2,000,000 empty frames (4 MB on the wire);
* oversize: with ``PSKV_MAX_MESSAGE_BYTES`` = 16 MB, one 32 MB frame, then 5 messages of
  three 12 MB frames;
* forged_sender: PUSHes of key 100 claiming worker 0 — 50 from a fresh connection, then
  200 after a HELLO as worker 0 numbered just past the workers' current step;
* replay: after a HELLO as worker 0, its pushes number 1-50 of key 100 sent again (with
  other values), as a captured message replayed would be;
* unix_junk: 10 rounds of 7 malformed packets (1-3 bytes, a bad flag byte, lying frame
  lengths, a frame table past the packet) on the server's Unix socket, each on a new
  connection;
* state_growth: 500 connections (100 at a time) each saying HELLO as worker 1 under a new send-only
  socket name, 20,000 requests with distinct ids on one connection, 3000 pulls after
  push number 10^9 (they would wait forever);
* wide_push: 5 PUSHes from a stranger, each naming 200,000 arrays (a 1.4 MB header) followed by
  200,000 four-byte frames (issue 28, finding 1), at the default heartbeats; the workers' longest
  pause between step events meanwhile, and whether anyone was marked dead;
* stranger_conns: 1,000 connections to the server's data port (plain TCP), each sending 35 bytes
  (the preamble, then a frame count of 200,002), held open, then closed (issue 28, finding 2); the
  server's RSS while they are open and after;
* data_flood: 4,200 idle connections to the server's data port, opened as fast as they go and
  held 8 s (past the 5 s opening timeout), at the default heartbeats; the workers' longest
  pause meanwhile, and whether anyone was marked dead;
* chosen_paths: SAVE_STATES / SAVE_CHECKPOINT / LOAD_STATES claiming worker 0 that name
  files outside the server's directories (absolute, ``..``, ``/etc/passwd``).

Per category: the inputs tried, crashes (a server or scheduler exit other than 0, or its
network thread failing), hangs (a process not ending after the workers were told to
stop), wrong values (pulled rounds that differ from the exact sums, or files written
outside the server's directories), and the server's memory (RSS) before, after, and at
its peak (``VmHWM``).
"""

from __future__ import annotations

import glob
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import Job
from .settings import DEFAULT_HB, SIZES
from .trials import _fuzz_outcome, _max_gap, _probe, _server_address, _stop_workers, fuzz_module

CATEGORIES = ["slow_reader", "slow_member", "growth_member", "many_frames", "oversize", "forged_sender", "replay", "unix_junk", "state_growth",
              "chosen_paths", "wide_push", "stranger_conns", "data_flood"]
ENV = {  # settings of each category's job (short timeouts keep the runs short)
    "slow_reader": {"PSKV_SLOW_PEER_TIMEOUT": "2", "PSKV_SEND_QUEUE_BYTES": str(64 << 20)},
    "slow_member": {"PSKV_SLOW_PEER_TIMEOUT": "2", "PSKV_SEND_QUEUE_BYTES": str(64 << 20)},
    "oversize": {"PSKV_MAX_MESSAGE_BYTES": str(16 << 20)},
}
W0, W1 = 9, 11  # node ids of workers 0 and 1
KEY_SMALL, KEY_BIG = 100, 103


def _dealer(address: str, reads: bool = True) -> Any:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 5000
    if not reads:
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.RCVHWM, 1)
    sock.connect(address)
    return sock


def _drain(sock: Any, wait_ms: int = 0) -> dict[str, int]:
    replies = {"error": 0, "other": 0}
    while sock.poll(wait_ms):
        replies["error" if b"Error" in sock.recv_multipart()[0] else "other"] += 1
        wait_ms = min(wait_ms, 200)
    return replies


def _said_hello(sock: Any, sender: int, tx: int) -> None:
    fuzz = fuzz_module()
    sock.send_multipart(fuzz.hello(tx, sender, request=1))
    sock.poll(2000)
    if sock.poll(0):
        sock.recv_multipart()


def _memory(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in MB (empty once it has exited)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def attack_slow_reader(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    fuzz = fuzz_module()
    sock = _dealer(address, reads=False)
    try:
        _said_hello(sock, W1, 0xBAD1)
        for i in range(60_000):
            sock.send_multipart(fuzz.pull_of(KEY_BIG, SIZES[3], copies=16, sender=W1, request=100 + i))
            if i % 1000 == 999:
                time.sleep(0.02)
        time.sleep(4.0)  # past PSKV_SLOW_PEER_TIMEOUT=2
    finally:
        sock.close(0)
    return 60_000


def attack_slow_member(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    """The job's worker 1 runs the hog (its spec says so); wait for it to have sent and lingered."""
    hog = job.procs["worker 1"].wait_event("hog", 60)
    if hog is None:
        raise RuntimeError("worker 1's hog did not report")
    time.sleep(4.5)  # its linger, past PSKV_SLOW_PEER_TIMEOUT=2
    return int(hog["sent"])


def attack_growth_member(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    """The job's worker 1 runs the state growth (its spec says so); wait for its report."""
    grow = job.procs["worker 1"].wait_event("grow", 120)
    if grow is not None:
        result["replies"] = {k: grow[k] for k in ("error", "other", "bound")}
    else:  # worker 1 stopped before its connections were done (its own training failed: reported below)
        result["replies"] = "worker 1 ended before reporting"
    return 3 + 20_000 + 3000


def attack_many_frames(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    sock = _dealer(address)
    try:
        start = time.monotonic()
        sock.send_multipart([b""] * 2_000_000)
        result["send_s"] = round(time.monotonic() - start, 1)
        result["held_s"] = _probe(sock, [])  # until the server answers the next message
    finally:
        sock.close(0)
    return 1


def attack_oversize(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    big = _dealer(address)
    try:
        big.send(bytes(32 << 20))  # one frame over the limit: ZeroMQ disconnects the peer
        time.sleep(0.5)
    finally:
        big.close(0)
    sock = _dealer(address)
    try:
        frame = bytes(12 << 20)
        for _ in range(5):
            sock.send_multipart([b"oversize", frame, frame, frame])
        result["held_s"] = _probe(sock, [])
    finally:
        sock.close(0)
    return 6


def _worker_step(job: Job) -> int:
    return max([e["step"] for w in ("worker 0", "worker 1") for e in job.procs[w].events() if e["ev"] == "step"],
               default=0)


def attack_forged_sender(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    import numpy as np

    fuzz = fuzz_module()
    values = np.full(SIZES[0], -1000.0, np.float32)
    fresh = _dealer(address)
    try:
        for i in range(50):  # no HELLO: a new connection speaking for worker 0 outright
            fresh.send_multipart(fuzz.push_of(KEY_SMALL, values, 10**6 + i, sender=W0, request=500 + i))
        result["replies_fresh"] = _drain(fresh, 1000)
    finally:
        fresh.close(0)
    sock = _dealer(address)
    try:
        _said_hello(sock, W0, 0xF0F0)
        step = _worker_step(job)
        for i in range(200):  # the numbers the workers' next pushes of key 100 will have
            sock.send_multipart(fuzz.push_of(KEY_SMALL, values, step + 1 + i, sender=W0, request=1000 + i))
        result["replies_after_hello"] = _drain(sock, 1000)
    finally:
        sock.close(0)
    return 250


def attack_replay(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    import numpy as np

    fuzz = fuzz_module()
    values = np.full(SIZES[0], -1000.0, np.float32)
    sock = _dealer(address)
    try:
        _said_hello(sock, W0, 0xF1F1)
        for n in range(1, 51):  # pushes 1-50 of worker 0 landed long ago
            sock.send_multipart(fuzz.push_of(KEY_SMALL, values, n, sender=W0, request=2000 + n))
        result["replies"] = _drain(sock, 1000)
    finally:
        sock.close(0)
    return 50


def attack_unix_junk(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    paths = glob.glob(f"/dev/shm/pskv-{job.job_id}-server-*/node.sock")
    if not paths:
        raise RuntimeError("the server has no Unix socket (PSKV_SHM off?)")
    closed = sent = 0
    for _ in range(10):
        for packet in fuzz_module().UNIX_JUNK.values():
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            raw.settimeout(5)
            try:
                raw.connect(paths[0])
                raw.send(packet)
                sent += 1
                closed += raw.recv(64) == b""
            except OSError:
                pass
            finally:
                raw.close()
    result["connections_closed_by_server"] = closed
    return sent


def attack_state_growth(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    fuzz = fuzz_module()
    for batch in range(5):  # 500 connections, 100 open at a time
        socks = [_dealer(address) for _ in range(100)]
        for i, sock in enumerate(socks):
            sock.send_multipart(fuzz.hello(0x5000 + 100 * batch + i, W1, request=1))
        deadline = time.monotonic() + 10
        for sock in socks:
            sock.poll(max(0, int(1000 * (deadline - time.monotonic()))))
            sock.close(0)
    sock = _dealer(address)
    try:
        _said_hello(sock, W1, 0x6000)
        for i in range(20_000):
            sock.send_multipart(fuzz.probe_pull(10 + i, key=KEY_SMALL, sender=W1))
            if i % 500 == 499:
                _drain(sock)
        for i in range(3000):
            sock.send_multipart(fuzz.pull_of(KEY_SMALL, SIZES[0], push=10**9, sender=W1, request=50_000 + i))
        result["replies_parked"] = _drain(sock, 2000)
    finally:
        sock.close(0)
    return 23_500


def attack_chosen_paths(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    outside = tmp.parent / f"outside-{tmp.name}"
    outside.mkdir()
    messages = fuzz_module().chosen_paths(str(outside))
    sock = _dealer(address)
    try:
        _said_hello(sock, W0, 0xC0C0)
        for frames in messages.values():
            sock.send_multipart(frames)
        result["replies"] = _drain(sock, 3000)
    finally:
        sock.close(0)
    escaped = [str(p) for p in outside.rglob("*")]
    escaped += glob.glob(str(tmp.parent.parent / "pskv-chosen-states*"))
    result["files_outside"] = escaped
    return len(messages)


def attack_wide_push(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    """5 stranger PUSHes of 200,000 arrays each; the workers' longest pause while the server takes them."""
    fuzz = fuzz_module()
    code = fuzz.dtype_code("float32")
    specs = [fuzz.raw_array(k, code, [1]) for k in range(200_000)]
    sock = _dealer(address)
    try:
        start = time.monotonic()
        for i in range(5):
            sock.send_multipart([fuzz.raw_header(fuzz.Command.PUSH, 7 + i, 13, arrays=specs)] + [b"\0" * 4] * len(specs))
        result["send_s"] = round(time.monotonic() - start, 1)
        result["held_s"] = _probe(sock, [])
        time.sleep(1.0)  # a step event after the attack closes the last gap
        events = job.procs["worker 0"].events()
        result["step_gap_before_s"] = _max_gap(events, start - 3, start - 0.5)
        result["step_gap_during_s"] = _max_gap(events, start, time.monotonic() - 1.0)
    finally:
        sock.close(0)
    return 5


def _data_port(job: Job, address: str) -> tuple[str, int]:
    """The server's data port, from its log line."""
    line = job.procs["server 0"].find(lambda s: "data port" in s, 5)
    if line is None:
        raise RuntimeError("the server logged no data port")
    return address.split("//")[1].rsplit(":", 1)[0], int(line[1].split("data port ")[1].split(")")[0])


def attack_data_flood(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    """4,200 idle data-port connections held 8 s: the workers' longest pause meanwhile."""
    host, port = _data_port(job, address)
    conns = []
    start = time.monotonic()
    try:
        for _ in range(4200):
            try:
                conns.append(socket.create_connection((host, port), timeout=5.0))
            except OSError as exc:  # the backlog full: counted, the flood goes on
                result["refused"] = result.get("refused", 0) + 1
                result["refusal"] = str(exc)
        time.sleep(8.0)
        result["memory_open"] = _memory(job.procs["server 0"].pid)
    finally:
        for sock in conns:
            sock.close()
    time.sleep(1.0)
    result["step_gap_during_s"] = _max_gap(job.procs["worker 0"].events(), start, time.monotonic() - 1.0)
    return 4200


def attack_stranger_conns(job: Job, address: str, tmp: Path, result: dict[str, Any]) -> int:
    """1,000 data-port connections of 35 bytes each, held open, then closed: the server's RSS meanwhile."""
    import struct

    from pskv.transport.stream import MAGIC, tag_of

    host, port = _data_port(job, address)
    server = job.procs["server 0"].pid
    conns = []
    try:
        for i in range(1000):
            sock = socket.create_connection((host, port), timeout=5.0)
            sock.sendall(MAGIC + tag_of(f"{i:016x}", 0) + struct.pack("<I", 200_002))  # 35 bytes
            conns.append(sock)
        time.sleep(1.0)
        result["memory_open"] = _memory(server)
    finally:
        for sock in conns:
            sock.close()
    time.sleep(7.0)  # past the opening timeout (5 s): whatever the server held for them is let go
    result["memory_closed"] = _memory(server)
    return len(conns)


ATTACKS: dict[str, Callable[[Job, str, Path, dict[str, Any]], int]] = {
    name: globals()[f"attack_{name}"] for name in CATEGORIES}
WATCH = ("dropped it", "discarded", "closed a local connection", "refused", "would pass the bound",
         "reactor thread failed", "Traceback", "marked dead")


def trial_hostile(tmp: Path, category: str) -> dict[str, Any]:
    """One category's attack on the live server of a training job; what it cost and what the job saw."""
    stop_file = tmp / "hostile-done"
    spec: dict[str, Any] = {"mode": "train", "pace": 0.02, "stop_file": str(stop_file)}
    if category == "slow_member":
        spec["hog"] = {"pulls": 3000, "copies": 16, "linger": 4.0}
    if category == "growth_member":
        spec["grow"] = {"connections": 500, "ids": 20_000, "parked": 3000}
    job = Job(tmp, 1, 2, spec,
              {**DEFAULT_HB, "PSKV_REQUEST_TIMEOUT": "30", **ENV.get(category, {})})
    result: dict[str, Any] = {"category": category}
    try:
        job.wait_ready(["worker 0", "worker 1"])
        address = _server_address(job)
        server = job.procs["server 0"].pid
        result["memory_before"] = _memory(server)
        start = time.monotonic()
        result["inputs"] = ATTACKS[category](job, address, tmp, result)
        result["attack_s"] = round(time.monotonic() - start, 1)
        probe = _dealer(address)
        try:
            result["answers_after_s"] = _probe(probe, [])
        finally:
            probe.close(0)
        result["memory_after"] = _memory(server)
        result["scheduler_memory"] = _memory(job.procs["scheduler"].pid)
        _stop_workers(job, stop_file, result)
        _fuzz_outcome(job, result)
        slog = job.procs["server 0"].text() + job.procs["scheduler"].text()
        result["logged"] = {w: sum(w in s for s in slog) for w in WATCH}
    finally:
        job.reap()
    return result


def _crashes(r: dict[str, Any]) -> int:
    codes = r.get("exit_codes", {})
    bad = sum(1 for n in ("server 0", "scheduler") if codes.get(n) not in (0, None))
    return bad + int(r.get("logged", {}).get("reactor thread failed", 0) > 0)


def hostile_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per category that ran: inputs, crashes, hangs, wrong values, memory."""
    rows = []
    for category in CATEGORIES:
        rs = [r for r in results if r.get("label", "").startswith(f"hostile_{category}#")]
        if not rs:
            continue
        ok = [r for r in rs if r["ok"]]
        wrong = sum(r["mismatches"] for r in ok) + sum(len(r.get("files_outside", [])) for r in ok)
        worker_errors = [r[w]["error"] for r in ok for w in ("worker 0", "worker 1") if r[w]["error"]]
        mem = [(r["memory_before"].get("VmRSS"), r["memory_after"].get("VmRSS"), r["memory_after"].get("VmHWM"))
               for r in ok]
        rows.append({
            "category": category, "runs": len(rs), "failed_runs": [r.get("failure") for r in rs if not r["ok"]],
            "inputs": sum(r["inputs"] for r in ok), "crashes": sum(_crashes(r) for r in ok),
            "hangs": sum(len(r["hang"]) for r in ok), "wrong_values": wrong,
            "rounds_checked": sum(r["rounds_checked"] for r in ok),
            "worker_errors": [f"{e['type']}: {e['msg'][:120]}" for e in worker_errors],
            "server_rss_mb": mem, "answers_after_s": [r.get("answers_after_s") for r in ok],
            "logged": {k: sum(r["logged"][k] for r in ok) for k in WATCH},
            "details": {k: r[k] for r in ok[:1] for k in ("held_s", "send_s", "replies", "replies_fresh",
                                                          "replies_after_hello", "replies_parked",
                                                          "connections_closed_by_server", "files_outside",
                                                          "step_gap_before_s", "step_gap_during_s",
                                                          "memory_open", "memory_closed")
                        if k in r},
        })
    return rows


def _fmt_mem(mem: list[tuple[Any, Any, Any]]) -> str:
    return "; ".join(f"{b} -> {a} (peak {p})" for b, a, p in mem) or "?"


def hostile_markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| category | inputs tried | crashes | hangs | wrong values | server RSS MB: before -> after (peak) | "
            "server answers after (s) | what the server logged |\n|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        logged = ", ".join(f"{n}x '{k}'" for k, n in r["logged"].items() if n)
        errors = f"; worker errors: {r['worker_errors'][0]}" if r["worker_errors"] else ""
        failed = f"; {len(r['failed_runs'])} runs failed: {r['failed_runs'][0][:100]}" if r["failed_runs"] else ""
        body += (f"| {r['category']} | {r['inputs']} | {r['crashes']} | {r['hangs']} | {r['wrong_values']} "
                 f"({r['rounds_checked']} rounds checked) | {_fmt_mem(r['server_rss_mb'])} | "
                 f"{', '.join(str(s) for s in r['answers_after_s'])} | {logged or '-'}{errors}{failed} |\n")
    return head + body
