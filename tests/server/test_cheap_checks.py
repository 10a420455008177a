"""Cheap checks first (issue 28): a server checks who sent a message before it reads the message's arrays.

A stranger's PUSH naming 200,000 arrays used to be checked spec by spec (seconds) before
its sender was refused; now its sender is refused after the header's fixed fields, and a
long header is read only up to its specs. The server's workers are served on as before.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

import pskv.protocol.codec as codec
import pskv.protocol.compact as compact
from pskv.config import ClusterConfig
from pskv.errors import ProtocolError
from pskv.protocol import PROTOCOL_VERSION, ArraySpec, Command, Header, decode, encode
from pskv.protocol.bodies import ErrorReply, Hello, node_token
from pskv.server.core import ServerCore

W0 = 9  # node id of worker 0
STRANGER = 13  # node id of worker 2: no worker of a 2-worker job
SECRET = "5e" * 32  # the job's secret (the scheduler's, in a job)
MANY = 200_000  # arrays a hostile header names (the default limit)


@pytest.fixture
def spec_checks(monkeypatch):
    """Counts the specs the codec checks one by one (of msgpack and of compact headers)."""
    calls = [0]

    def counting(check):
        def counted(*args, **kwargs):
            calls[0] += 1
            return check(*args, **kwargs)
        return counted

    monkeypatch.setattr(codec, "_spec", counting(codec._spec))
    monkeypatch.setattr(compact, "_spec", counting(compact._spec))
    return calls


def _core(sent: list) -> ServerCore:
    return ServerCore(ClusterConfig(num_servers=1, num_workers=2), lambda peer, frames: sent.append((peer, frames)),
                      lambda: 8, lambda: "server 0", lambda: 0, lambda: SECRET)


def _request(command: Command, request: int, arrays=(), data=(), body: str = "", sender: int = W0) -> list:
    return [bytes(f) for f in encode(Header(command, request, sender, tuple(arrays), body=body), list(data))]


def _push_of(sender: int, specs: list, request: int = 7) -> list:
    """A PUSH from ``sender`` with raw ``specs`` (checked or not) and a four-byte frame for each."""
    head = msgpack.packb([PROTOCOL_VERSION, int(Command.PUSH), request, sender, 0, "", specs, 0], use_bin_type=True)
    return [head] + [b"\0" * 4] * len(specs)


def _refusal(sent: list) -> str:
    """The text of the one ERROR reply sent."""
    assert len(sent) == 1, sent
    header = decode(sent.pop()[1])[0]
    assert header.command is Command.ERROR
    return ErrorReply.parse(header).message


def _serves_its_worker(core: ServerCore, sent: list) -> None:
    """Worker 0 opens, initializes, pushes and pulls a key as if nothing had come before."""
    core.handle(b"w0", _request(Command.HELLO, 1, body=Hello("", node_token(SECRET, W0)).encode()))
    spec = ArraySpec(5, "float32", (4,))
    core.handle(b"w0", _request(Command.INIT, 2, [spec], [np.zeros(4, np.float32)]))
    sent.clear()
    core.handle(b"w0", _request(Command.PULL, 3, [spec]))
    header, buffers = decode(sent[-1][1])
    assert header.command is Command.REPLY and header.request == 3
    np.testing.assert_array_equal(np.frombuffer(buffers[0], np.float32), np.zeros(4, np.float32))


def test_a_strangers_push_of_200000_arrays_is_refused_before_its_specs_are_read(spec_checks):
    sent: list = []
    core = _core(sent)
    core.handle(b"stranger", _push_of(STRANGER, [[k, 2, [1], 0, 0] for k in range(MANY)]))
    assert _refusal(sent) == f"sender {STRANGER} is not a worker of this job"
    assert spec_checks[0] == 0  # not one spec was checked
    _serves_its_worker(core, sent)
    assert spec_checks[0] > 0


def test_an_unbound_connection_is_refused_before_its_specs_are_read(spec_checks):
    sent: list = []
    core = _core(sent)
    bad = [["not a spec"]] * 100  # a short header: read whole, its specs not checked
    core.handle(b"unbound", _push_of(W0, bad))
    assert "the connection is not bound to a worker" in _refusal(sent)
    core.handle(b"stranger", _push_of(STRANGER, bad))
    assert _refusal(sent) == f"sender {STRANGER} is not a worker of this job"
    assert spec_checks[0] == 0
    _serves_its_worker(core, sent)


def test_a_long_header_is_read_only_up_to_its_specs_before_its_sender_is_checked():
    sent: list = []
    core = _core(sent)
    fields = b"".join(msgpack.packb(f) for f in (PROTOCOL_VERSION, int(Command.PUSH), 7, STRANGER, 0, ""))
    head = b"\x98" + fields + b"\xc1" * (codec.PEEK_BYTES + 1)  # an 8-field list; then no msgpack at all
    core.handle(b"stranger", [head, b"\0" * 4])
    assert _refusal(sent) == f"sender {STRANGER} is not a worker of this job"  # the specs were never unpacked
    core.handle(b"unbound", [head.replace(msgpack.packb(STRANGER), msgpack.packb(W0), 1), b"\0" * 4])
    assert "the connection is not bound to a worker" in _refusal(sent)
    _serves_its_worker(core, sent)


def test_a_workers_long_header_is_read_whole_once_its_sender_passed():
    sent: list = []
    core = _core(sent)
    core.handle(b"w0", _request(Command.HELLO, 1, body=Hello("", node_token(SECRET, W0)).encode()))
    specs = [ArraySpec(k, "float32", (1,)) for k in range(10_000)]
    frames = _request(Command.INIT, 2, specs, [np.full(1, k, np.float32) for k in range(10_000)])
    assert len(frames[0]) > codec.PEEK_BYTES
    sent.clear()
    core.handle(b"w0", frames)
    assert decode(sent.pop()[1])[0].command is Command.REPLY
    core.handle(b"w0", _request(Command.PULL, 3, specs))
    header, buffers = decode(sent.pop()[1])
    assert header.command is Command.REPLY and len(buffers) == 10_000
    assert np.frombuffer(buffers[9_999], np.float32)[0] == 9_999
    core.handle(b"w0", frames[:1] + frames[2:])  # a frame short: malformed, dropped as before
    assert not sent


def test_decode_in_two_halves_is_decode():
    spec = ArraySpec(5, "float32", (4,))
    frames = _request(Command.PUSH, 3, [spec], [np.ones(4, np.float32)])
    head, specs = codec.decode_head(frames)
    assert head.arrays == () and head.command is Command.PUSH and head.sender == W0
    whole, buffers = codec.decode_arrays(head, specs, frames)
    assert whole == decode(frames)[0] and bytes(buffers[0]) == bytes(decode(frames)[1][0])
    sync = _request(Command.SYNC, 4)
    assert codec.decode_arrays(*codec.decode_head(sync), sync) == decode(sync)  # no specs
    bad = _push_of(W0, [["not a spec"]])
    head, specs = codec.decode_head(bad)  # the fixed fields pass; the specs are for later
    with pytest.raises(ProtocolError, match="array 0: spec is not"):
        codec.decode_arrays(head, specs, bad)
