"""Security end to end, through ``pskv launch``: CURVE on every socket, key files, captured traffic.

Each job is one worker and one server (``PSKV_SHM=0``: everything over TCP, so CURVE
carries all of it). The worker script plays the attacker too: from its own ZeroMQ
context it opens sockets as a stranger would — plain TCP, a key pair of its own that
knows the cluster's public key, another cluster's key — and sends well-formed
``REGISTER`` / ``HELLO`` / ``PUSH`` messages to the scheduler's and the server's ports.

* with a key, none of them gets a reply, every refusal is logged by the node, and the
  value the real worker pushed is unchanged at the end of the job;
* without a key, the same stranger at the server's port alone is refused (it has no
  worker's token) — and with worker 0's token, which travels in plaintext (the control:
  shows the test can fail), its forged push changes the value;
* a missing or world-readable key file stops ``pskv launch`` and a role before anything
  binds, with an error naming the file;
* in a network namespace the test makes, the captured bytes of a keyed job hold no
  plaintext of a known array (the unkeyed job's do), and the captured client streams
  replayed to the scheduler's and server's ports fail the handshake: nothing applied.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

import pskv
from pskv.config import ClusterConfig
from pskv.testing.jobs import ProcessGroup, child_env, run_launch, start_launch
from pskv.transport.security import generate_keys, write_key_file
from pskv.worker.client import WorkerClient
from tests.fault.launched import finals, launch_job
from tests.fault.netns import NetJob, Unavailable, VethPair
from tests.fault.test_network import ENV, PLACEMENTS, WORKERS, finish
from tests.fault.test_network import WORKER as NET_WORKER
from tests.fault.test_worker_recovery import WORKER as RECOVERY_WORKER

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="Linux processes and namespaces"),
              pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")]

JOB_DEADLINE = 60.0  # seconds a launched job may take
PATTERN = b"pskv-known-array"  # 16 bytes; the pushed array is 8 copies of it (32 float32)

WORKER = r'''
import json, os, sys, time
import numpy as np
import zmq
import pskv
from pskv.optimizer import SGD
from pskv.protocol import ArraySpec, Command, Header, Role, decode, encode, node_id
from pskv.protocol.bodies import Hello, OptimizerConfig, Register
from pskv.transport.security import generate_keys, read_key_file

mode, go_file = sys.argv[1], sys.argv[2]
WAIT_MS = 500  # loopback replies take milliseconds
HANDSHAKE_MS = 15000  # a handshake's outcome (succeeded or refused) on a loaded machine
pattern = np.frombuffer(b"pskv-known-array" * 8, np.float32).copy()
kv = pskv.create("dist_sync")
kv.init(0, np.zeros(pattern.size, np.float32))
kv.push(0, pattern)
before = kv.pull(0)
scheduler = "tcp://%s:%s" % (os.environ["DMLC_PS_ROOT_URI"], os.environ["DMLC_PS_ROOT_PORT"])
server = kv._worker.client.info.servers[0]
print("addresses " + json.dumps({"scheduler": scheduler, "server": server}), flush=True)

W0 = node_id(Role.WORKER, 0)
TOKEN = kv._worker.client.info.token  # worker 0's proof from the scheduler: plaintext on the wire without a key
print("token " + TOKEN, flush=True)
REGISTER = encode(Header(Command.REGISTER, 1, 0, body=Register("worker", "", 0).encode()))
HELLO = encode(Header(Command.HELLO, 2, W0, body=Hello("00000000deadbeef").encode()))  # no token
SNIFFED = encode(Header(Command.HELLO, 2, W0, body=Hello("00000000feedbeef", TOKEN).encode()))  # the token, learnt
READ = encode(Header(Command.PULL, 4, W0, (ArraySpec(0, "float32", (pattern.size,)),)))
FORGED = encode(Header(Command.PUSH, 3, W0, (ArraySpec(0, "float32", (pattern.size,)),)),
                [np.full(pattern.size, 1000.0, np.float32)])
CONTROL = encode(Header(Command.SET_OPTIMIZER, 5, W0, body=OptimizerConfig(SGD(learning_rate=0.5).to_config()).encode()))


def probe(address, messages, keys=None, server_key=None):
    """Send ``messages`` from a fresh DEALER (CURVE client with ``keys`` if given): the replies' bytes."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = WAIT_MS  # refused peers leave no connection to queue on: a send would block
    if keys is not None:
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = keys.secret, keys.public, server_key
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    sock.connect(address)
    # the handshake's outcome first (a loaded machine may take longer than WAIT_MS): closing
    # before it would leave the peer a connection that merely ended, not one it refused
    monitor.poll(HANDSHAKE_MS)
    replies = []
    for frames in messages:
        try:
            sock.send_multipart(frames, copy=True)
        except zmq.Again:  # no connection to queue on: the peer refused it
            break
        if sock.poll(WAIT_MS):
            replies.append(sock.recv_multipart())
    sock.disable_monitor()
    monitor.close(0)
    sock.close(0)
    ctx.term()
    return replies


result = {}
if mode == "attack":
    result["plain_scheduler"] = len(probe(scheduler, [REGISTER]))
    replies = probe(server, [HELLO, READ, FORGED, CONTROL])
    result["plain_server"] = len(replies)
    result["plain_server_accepted"] = [decode(r)[0].command.name for r in replies]
    result["read_the_values"] = any(pattern.tobytes() in b"".join(r) for r in replies)
    sniffed = probe(server, [SNIFFED, READ, FORGED, CONTROL])  # a stranger that read worker 0's token
    result["sniffed_accepted"] = [decode(r)[0].command.name for r in sniffed]
    key_file = os.environ.get("PSKV_CURVE_KEY_FILE")
    if key_file:
        cluster_public = read_key_file(key_file).public
        intruder = generate_keys()  # its own pair; knows the cluster's public key, not its secret
        print("intruder " + intruder.public.decode(), flush=True)
        result["intruder_scheduler"] = len(probe(scheduler, [REGISTER], intruder, cluster_public))
        result["intruder_server"] = len(probe(server, [HELLO, READ, FORGED, CONTROL], intruder, cluster_public))
        other = generate_keys()  # another cluster's key altogether
        result["other_cluster_server"] = len(probe(server, [HELLO, READ, FORGED, CONTROL], other, other.public))
else:  # "wait": the test captures and replays, then creates go_file
    print("waiting", flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(go_file) and time.monotonic() < deadline:
        time.sleep(0.05)
after = kv.pull(0)
result["before"] = before.tolist()
result["after"] = after.tolist()
print("result " + json.dumps(result), flush=True)
kv.close()
'''


# -- helpers ------------------------------------------------------------------------------
@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_key_file(tmp_path / "cluster.key", generate_keys())


def launch_args(worker_script: Path, mode: str, go_file: Path, *options: str) -> list[str]:
    """``pskv launch`` arguments of the one-worker, one-server job (the job ends itself after JOB_DEADLINE)."""
    return ["-n", "1", "-s", "1", "--env", "PSKV_SHM=0", "--timeout", str(JOB_DEADLINE), *options, "--",
            sys.executable, str(worker_script), mode, str(go_file)]


def run_job(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run the job to its end; returns (exit code, merged output)."""
    return run_launch(args, cwd, JOB_DEADLINE + 15)


def line_value(out: str, prefix: str) -> str:
    """The rest of the worker's output line that starts with ``prefix`` (after the launcher's tag)."""
    for line in out.splitlines():
        _, _, rest = line.partition("] ")
        if rest.startswith(prefix + " "):
            return rest[len(prefix) + 1:]
    raise AssertionError(f"no {prefix!r} line in:\n{out}")


def pattern_array() -> list[float]:
    return np.frombuffer(PATTERN * 8, np.float32).tolist()


# -- a process without the key ------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("option", ["--curve-key", "--secure"])
def test_with_a_key_a_stranger_gets_no_reply_changes_nothing_and_is_logged(tmp_path, worker_script, key_file, option):
    options = ["--curve-key", str(key_file)] if option == "--curve-key" else ["--secure"]
    code, out = run_job(launch_args(worker_script, "attack", tmp_path / "go", *options), tmp_path)
    assert code == 0, out
    result = json.loads(line_value(out, "result"))
    # no reply to REGISTER, HELLO or PUSH: plain TCP, a key pair of its own, another cluster's key
    assert {k: v for k, v in result.items() if k not in ("before", "after")} == {
        "plain_scheduler": 0, "plain_server": 0, "plain_server_accepted": [], "read_the_values": False,
        "sniffed_accepted": [], "intruder_scheduler": 0,
        "intruder_server": 0, "other_cluster_server": 0}, out
    assert result["before"] == result["after"] == pattern_array(), out  # the forged push was not applied
    intruder = line_value(out, "intruder")
    # pskv's records: "[server 0] 2026-11-24 09:12:03.123 ERROR [server 0] pskv.security: ..." (pskv.logs)
    assert f"ERROR [scheduler] pskv.security: scheduler refused a peer presenting CURVE public key {intruder}" in out
    assert f"ERROR [server 0] pskv.security: server refused a peer presenting CURVE public key {intruder}" in out
    # the plain peer, logged by the scheduler and the server: as a mechanism mismatch, or (when the
    # peer saw the mismatch first and dropped the connection before a loaded node read its
    # greeting) as a connection that ended during the handshake
    plain = ("a peer without CURVE (plain TCP) was refused", "a peer's connection ended during the CURVE handshake")
    for node in ("scheduler", "server 0"):
        assert any(line.startswith(f"[{node}] ") and f" ERROR [{node}] pskv.security: " in line
                   and any(why in line for why in plain)
                   for line in out.splitlines()), out
    assert "a peer whose CURVE keys are not the cluster key's was refused" in out


@pytest.mark.timeout(90)
def test_without_a_key_a_stranger_cannot_speak_for_a_worker_unless_it_learnt_its_token(tmp_path, worker_script):
    # what docs/security.md says a peer can do without a key (and proof the test above can fail)
    code, out = run_job(launch_args(worker_script, "attack", tmp_path / "go"), tmp_path)
    assert code == 0, out
    result = json.loads(line_value(out, "result"))
    assert result["plain_scheduler"] == 1  # answered (the cluster is complete: an ERROR, but an answer)
    # at the server's port alone, without worker 0's token: HELLO, PULL, PUSH and SET_OPTIMIZER all refused
    assert result["plain_server_accepted"] == ["ERROR"] * 4, out
    assert not result["read_the_values"]
    # logged (the connection's later refusals are counted into its next line: one per 10 s)
    assert "HELLO from connection b" in out and "claims worker 0 (node id 9): refused, its token is missing" in out
    # with the token (plaintext on the wire without a key: a peer reading the traffic learns it), all accepted
    assert result["sniffed_accepted"] == ["REPLY"] * 4, out
    assert result["before"] == pattern_array()
    assert result["after"] != result["before"], out  # the forged push was applied


# -- key files ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("problem", ["missing", "world-readable", "malformed"])
def test_a_bad_key_file_stops_the_launcher_before_anything_starts(tmp_path, worker_script, key_file, problem):
    if problem == "missing":
        key_file.unlink()
    elif problem == "world-readable":
        key_file.chmod(0o644)
    else:
        key_file.write_text("public = short\nsecret = short\n")
    code, out = run_job(launch_args(worker_script, "attack", tmp_path / "go", "--curve-key", str(key_file)), tmp_path)
    assert code == 2, out
    assert out.startswith(f"pskv launch: error: --curve-key: CURVE key file {key_file}") or \
        out.startswith(f"pskv launch: error: --curve-key: cannot read CURVE key file {key_file}"), out
    assert "[scheduler]" not in out and "[worker" not in out  # nothing was started


@pytest.mark.timeout(60)
def test_a_role_with_a_shared_key_file_exits_naming_it_before_binding(tmp_path, key_file):
    key_file.chmod(0o640)
    port_file = tmp_path / "port"
    env = child_env({"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "0",
                     "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "PSKV_CURVE_KEY_FILE": str(key_file)})
    res = subprocess.run([sys.executable, "-m", "pskv", "scheduler", "--port-file", str(port_file)], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2, res.stderr
    assert f"pskv scheduler: error: CURVE key file {key_file} is accessible by other users (mode 640)" in res.stderr
    assert not port_file.exists()  # it never bound a port


def test_a_worker_with_a_missing_key_file_raises_naming_it(tmp_path):
    cluster = ClusterConfig(num_servers=1, num_workers=1, role="worker", root_uri="127.0.0.1", root_port=1,
                            curve_key_file=str(tmp_path / "absent.key"))
    with pytest.raises(pskv.InvalidArgumentError, match=f"cannot read CURVE key file {tmp_path / 'absent.key'}"):
        WorkerClient(cluster)


def test_the_local_socket_directory_is_private_to_the_user():
    # Unix-socket connections between nodes of one host bypass CURVE: only this user may reach them
    from pskv.server.node import ServerNode
    from pskv.transport.unix import local_path

    ctx = zmq.Context()
    cluster = ClusterConfig(num_servers=1, num_workers=1, role="server", root_uri="127.0.0.1", root_port=1,
                            job_id=uuid.uuid4().hex[:12])
    node = ServerNode(cluster, ctx)
    try:
        directory = node._shm_dir.path if node._shm_dir is not None else ""
        assert directory and os.stat(directory).st_mode & 0o777 == 0o700
        assert os.path.exists(local_path(directory))
        assert node._shm_dir is not None
        node._shm_dir.create(0, 0, "value", np.dtype(np.float32), 4)
        assert os.stat(node._shm_dir.file(0, 0, "value")).st_mode & 0o777 == 0o600
    finally:
        node.stop()
        ctx.term()


# -- captured traffic (network namespace) ---------------------------------------------------
CAPTURE = r'''
import socket, struct, sys
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
sock.bind(("lo", 0))
with open(sys.argv[1], "wb", buffering=0) as out:
    print("capturing", flush=True)
    while True:
        frame, address = sock.recvfrom(1 << 18)
        if address[2] == socket.PACKET_HOST:  # each loopback packet is seen twice: keep the incoming copy
            out.write(struct.pack("=I", len(frame)) + frame)
'''

REPLAY = r'''
import json, socket, sys
for port, payload in json.loads(open(sys.argv[1]).read()):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(bytes.fromhex(payload))
        sock.settimeout(1.0)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
print("replayed", flush=True)
'''


class Namespace:
    """A network namespace with only loopback, made and removed by the test.

    Raises:
        pytest.skip.Exception: not root, no ``ip``, or namespaces not permitted.
    """

    def __init__(self) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.skip("needs root and iproute2 for a network namespace")
        self.name = f"pskvsec{os.getpid()}x{uuid.uuid4().hex[:6]}"
        res = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True, timeout=15, check=False)
        if res.returncode != 0:
            pytest.skip(f"cannot make a network namespace: {res.stderr.strip()}")
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, timeout=15)

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def destroy(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=15, check=False)


@pytest.fixture
def netns() -> Iterator[Namespace]:
    ns = Namespace()
    yield ns
    ns.destroy()


def tcp_streams(capture: bytes) -> dict[tuple[int, int], bytes]:
    """Payload bytes per TCP direction ``(source port, destination port)`` of a loopback capture."""
    segments: dict[tuple[int, int], dict[int, bytes]] = {}
    at = 0
    while at + 4 <= len(capture):
        (n,) = struct.unpack_from("=I", capture, at)
        frame = capture[at + 4:at + 4 + n]
        at += 4 + n
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != socket.IPPROTO_TCP:
            continue
        ip = frame[14:]
        total, tcp = struct.unpack_from("!H", ip, 2)[0], ip[(ip[0] & 0x0F) * 4:]
        src, dst, seq = struct.unpack_from("!HHI", tcp)
        payload = tcp[(tcp[12] >> 4) * 4:total - (ip[0] & 0x0F) * 4]
        if payload:
            segments.setdefault((src, dst), {})[seq] = payload  # a retransmission overwrites its copy
    return {k: b"".join(v[s] for s in sorted(v)) for k, v in segments.items()}


def captured_streams(capture_file: Path, listening: set[int], want: int = 3, limit: float = 20.0) -> list[tuple[int, str]]:
    """The captured TCP streams to the ``listening`` ports once ``want`` of them are in the file (the capture
    process writes what it reads; on a loaded machine it may still be behind the job), or those there at ``limit``."""
    deadline = time.monotonic() + limit
    while True:
        streams = [(dst, data.hex()) for (_, dst), data in tcp_streams(capture_file.read_bytes()).items()
                   if dst in listening]
        if len(streams) >= want or time.monotonic() > deadline:
            return streams
        time.sleep(0.1)


def captured_job(ns: Namespace, tmp_path: Path, worker_script: Path, options: list[str],
                 replay: bool) -> tuple[int, str, bytes]:
    """Run a job inside ``ns`` while capturing its loopback; optionally replay its client streams.

    Returns (exit code, launcher output, the capture).
    """
    capture_file, go_file = tmp_path / "capture.bin", tmp_path / "go"
    (tmp_path / "capture.py").write_text(CAPTURE)
    with ProcessGroup("captured job") as group:
        group.start("capture", ns.argv([sys.executable, str(tmp_path / "capture.py"), str(capture_file)]), child_env())
        group.expect("capture", "capturing", 30)
        job = start_launch(group, launch_args(worker_script, "wait", go_file, *options), tmp_path, enter=ns.argv([]))
        group.expect("launch", "] waiting", JOB_DEADLINE)
        if replay:
            ports = json.loads(line_value(job.output(), "addresses"))
            listening = {int(ports["scheduler"].rsplit(":", 1)[1]), int(ports["server"].rsplit(":", 1)[1])}
            streams = captured_streams(capture_file, listening)
            assert len(streams) >= 3, streams  # to the scheduler, and the worker's two sockets to the server
            (tmp_path / "streams.json").write_text(json.dumps(streams))
            (tmp_path / "replay.py").write_text(REPLAY)
            subprocess.run(ns.argv([sys.executable, str(tmp_path / "replay.py"), str(tmp_path / "streams.json")]),
                           check=True, timeout=60, capture_output=True)
        go_file.touch()
        code = job.wait(JOB_DEADLINE)
        assert code is not None, group.describe()
        return code, job.output(), capture_file.read_bytes()


@pytest.mark.timeout(120)
def test_captured_traffic_holds_no_plaintext_and_a_replay_is_refused(netns, tmp_path, worker_script, key_file):
    code, out, capture = captured_job(netns, tmp_path, worker_script, ["--curve-key", str(key_file)], replay=True)
    assert code == 0, out
    assert len(capture) > 10_000, len(capture)  # the job's traffic was captured
    assert PATTERN not in capture and line_value(out, "token").encode() not in capture
    result = json.loads(line_value(out, "result"))
    assert result["before"] == result["after"] == pattern_array(), out  # the replayed push was not applied
    # every replayed stream failed its handshake: the replayed HELLO is answered with a fresh cookie,
    # and the old INITIATE cannot be decrypted with it
    for node in ("ERROR [server 0] pskv.security: server", "ERROR [scheduler] pskv.security: scheduler"):
        assert any(node in line and "a replayed or corrupted handshake" in line for line in out.splitlines()), out


@pytest.mark.timeout(120)
def test_captured_traffic_without_a_key_holds_the_array_in_plaintext(netns, tmp_path, worker_script):
    code, out, capture = captured_job(netns, tmp_path, worker_script, [], replay=True)
    assert code == 0, out
    assert PATTERN * 8 in capture  # the pushed array, byte for byte: what the keyed job hides
    assert line_value(out, "token").encode() in capture  # and the worker's token: a sniffer can speak for it
    # replayed under the worker's own routing identities, its requests are repeats: not applied again
    result = json.loads(line_value(out, "result"))
    assert result["before"] == result["after"] == pattern_array(), out


# -- reconnects under CURVE -------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_connections_reset_under_curve_reconnect_and_keep_their_bindings(tmp_path, key_file):
    """Every TCP connection of the workers is reset mid-loop in a keyed job: ZeroMQ reconnects
    with a new CURVE handshake under the same routing identities, the servers' sender
    bindings still hold, and every pulled value is exact (the worker program checks them)."""
    try:
        net = VethPair()
    except Unavailable as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")
    job = None
    try:
        iters = 100
        env = {**ENV, "NET_ITERS": str(iters), "NET_PACE": "0.02", "NET_SIZE": "1024",
               "PSKV_CURVE_KEY_FILE": str(key_file)}
        job = NetJob(net, tmp_path, NET_WORKER, PLACEMENTS["workers-cut"], env)
        for w in WORKERS:
            job.expect(w, "iter 15 ", 40)
        try:
            killed = net.reset_connections("edge")
        except Unavailable as exc:
            pytest.skip(f"cannot reset connections here: {exc}")
        assert killed, "no connection was reset"
        finish(job, iters, 40)
        for w in WORKERS:
            assert any("unanswered request(s) again" in line for line in job[w].text()), job.describe()
        assert not any("refused" in line for p in job.procs for line in p.text()), job.describe()
    finally:
        if job is not None:
            job.close(grace=0)
        net.destroy()


@pytest.mark.timeout(200)
def test_a_replacement_worker_rejoins_a_keyed_job_and_ends_as_without_the_crash(tmp_path):
    """--restart-workers in a --secure job over TCP: the replacement opens new CURVE connections
    with HELLO and REJOIN (its worker id was bound to the dead process's connections) and the
    job ends with the values of a crash-free keyed run, bit for bit."""
    options = ["--secure", "--env", "PSKV_SHM=0"]
    code, clean = launch_job(tmp_path / "clean", RECOVERY_WORKER, ["-1", "after"], options, deadline=90.0)
    assert code == 0, clean
    code, out = launch_job(tmp_path / "crash", RECOVERY_WORKER, ["6", "after"],
                           [*options, "--restart-workers", "1", "--recovery-timeout", "30"], deadline=90.0)
    assert code == 0, out
    assert "[worker 1] rejoined at step 7" in out, out
    assert "refused" not in out, out
    assert finals(out) == finals(clean) and len(finals(clean)) == 2, out
