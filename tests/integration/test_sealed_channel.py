"""A keyed job's data connections are sealed (:mod:`pskv.transport.sealed`): captured, changed and replayed.

Every job here runs without shared memory (``PSKV_SHM=0``), so its arrays travel on the
TCP data connections as between hosts. In-process jobs send those connections through a
:class:`~tests.transport.tap.Tap` (a man in the middle that records them and may flip a
byte); the launched one goes through ``pskv launch --secure``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from pskv.optimizer import SGD
from pskv.testing import InProcessCluster
from pskv.transport.security import generate_keys, write_key_file
from pskv.transport.stream import StreamConnection
from tests.integration.test_data_channel import WORKER
from tests.transport.tap import Tap

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")

DEADLINE = 60.0
REPO = Path(__file__).resolve().parents[2]
PATTERN = b"pskv-known-array"  # 16 bytes; pushed as 65,536 copies of it
ARRAY = np.frombuffer(PATTERN * 65_536, np.float32)  # 1 MiB


@pytest.fixture
def taps() -> Iterator[dict[int, Tap]]:
    """The Taps a test made (by server port), closed after it."""
    made: dict[int, Tap] = {}
    yield made
    for tap in made.values():
        tap.close()


def through_taps(monkeypatch: pytest.MonkeyPatch, taps: dict[int, Tap], **tap: int) -> dict[int, Tap]:
    """Send every data connection of this process through a Tap (one per server port), made as they come."""
    connect = StreamConnection.connect.__func__  # type: ignore[attr-defined]

    def tapped(cls, host, port, *args, **kwargs):
        if port not in taps:
            taps[port] = Tap(host, port, **tap)
        return connect(cls, "127.0.0.1", taps[port].port, *args, **kwargs)
    monkeypatch.setattr(StreamConnection, "connect", classmethod(tapped))
    return taps


@pytest.fixture
def key(tmp_path: Path) -> str:
    return str(write_key_file(tmp_path / "cluster.key", generate_keys()))


def replay(port: int, data: bytes) -> bytes:
    """Send a captured client stream on a new connection to ``port``; what came back before the server closed it
    (a close with the replay still unread may arrive as a reset: what came until then)."""
    back = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(1 << 16):
                back += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
    return back


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "plain"])
def test_a_capture_of_the_data_connections_holds_the_array_only_without_a_key(monkeypatch, caplog, taps, key, keyed):
    """Keyed: the pushed array is nowhere in the capture, and the captured worker stream replayed on a new
    connection is refused at its first record: nothing applied, the refusal logged naming the peer."""
    through_taps(monkeypatch, taps)

    def body(kv):
        kv.init("w", np.zeros(ARRAY.size, np.float32))
        kv.push("w", ARRAY)
        first = kv.pull("w")
        if keyed:
            (tap,) = taps.values()
            answer = replay(tap.target[1], bytes(tap.flows[0].up))  # HELLO, INIT, PUSH, PULL as captured
            assert len(answer) <= 32  # at most the server's key-exchange answer: no reply, then it closed
        return kv._worker.client.channels(), first.tobytes() == ARRAY.tobytes(), kv.pull("w").tobytes() == ARRAY.tobytes()

    settings = {"curve_key_file": key} if keyed else {}
    with caplog.at_level(logging.WARNING, logger="pskv.transport"), \
            InProcessCluster(1, 1, deadline=DEADLINE, shm=0, **settings) as cluster:
        assert cluster.run_stores(body) == [(["tcp"], True, True)]
    (tap,) = taps.values()
    captured = tap.captured()
    assert len(captured) > 2 * ARRAY.nbytes
    assert (PATTERN in captured) is not keyed
    if keyed:
        assert any("data connection from 127.0.0.1:" in r.getMessage()
                   and "record 0 from the peer failed authentication" in r.getMessage() for r in caplog.records)


def test_a_changed_byte_on_a_keyed_data_connection_drops_it_and_nothing_of_it_is_applied(monkeypatch, caplog, taps,
                                                                                         key):
    """A byte of the worker's first data connection is flipped in the middle of its first megabyte (its INIT or
    PUSH): the server refuses that record, drops the connection and logs it naming the peer; the worker opens it
    again and sends its unanswered requests again. SGD with learning rate 1 subtracts each round's push once: a
    push applied changed, twice or not at all changes the value."""
    through_taps(monkeypatch, taps, flip_at=600_000)
    rounds = 4

    def body(kv):
        kv.set_optimizer(SGD(learning_rate=1.0))
        kv.init("w", np.zeros(ARRAY.size, np.float32))
        for _ in range(rounds):
            kv.push("w", np.ones(ARRAY.size, np.float32))
            kv.pull("w")
        w = kv.pull("w")
        return kv._worker.client.channels(), float(w.min()), float(w.max())

    with caplog.at_level(logging.WARNING), \
            InProcessCluster(1, 1, deadline=DEADLINE, shm=0, curve_key_file=key) as cluster:
        assert cluster.run_stores(body) == [(["tcp"], -float(rounds), -float(rounds))]
    (tap,) = taps.values()
    assert len(tap.flows) >= 3  # lanes 0 and 1, then lane 0 (and 1) again
    messages = [r.getMessage() for r in caplog.records]
    assert any("data connection from 127.0.0.1:" in m and "failed authentication" in m for m in messages), messages
    assert any("data connection to server 0 lost; opening it again" in m for m in messages), messages


@pytest.mark.timeout(120)
def test_a_launched_secure_job_without_shared_memory_seals_data_connections(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--secure", "--stop-grace", "2",
            "--timeout", "90", "--env", "PSKV_SHM=0", "--", sys.executable, str(script)]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        assert f"rank={rank} channels=tcp,tcp value=3.0,3.0" in out, out
    assert "failed authentication" not in out and "refused" not in out, out
