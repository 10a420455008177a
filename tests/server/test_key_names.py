"""A server's stall report names str keys: INIT carries their names (checked against the keys)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import pskv
from pskv.errors import ProtocolError
from pskv.partition import server_key
from pskv.protocol import ArraySpec, Command, Header
from pskv.protocol.bodies import MAX_KEY_NAME, MAX_NAMES_CHARS, InitBody
from pskv.testing import InProcessCluster


def _init(names_body: str, *keys: str | int) -> Header:
    specs = tuple(ArraySpec(server_key(k), "float32", (4,)) for k in keys)
    return Header(Command.INIT, 1, 9, specs, body=names_body)


def test_init_names_round_trip_and_must_name_the_message_s_keys():
    body = InitBody(("embedding.weight", "bias"))
    assert InitBody.parse(_init(body.encode(), "embedding.weight", "bias", 3)) == body
    assert InitBody.parse(_init("", 3)) == InitBody() and InitBody().encode() == ""
    for forged in (InitBody(("other",)), InitBody(("bias", "bias")), InitBody(("x" * (MAX_KEY_NAME + 1),))):
        with pytest.raises(ProtocolError, match="INIT body field 'names'"):
            InitBody.parse(_init(forged.encode(), "bias"))
    with pytest.raises(ProtocolError, match="names"):
        InitBody.parse(_init('{"names": [7]}', "bias"))


def test_the_names_an_init_sends_are_distinct_short_and_bounded_in_all():
    assert InitBody.of(["a", "b", "a", "x" * (MAX_KEY_NAME + 1)]).names == ("a", "b")
    many = [f"{i:0{MAX_KEY_NAME}d}" for i in range(2 * MAX_NAMES_CHARS // MAX_KEY_NAME)]
    sent = InitBody.of(many).names
    assert sent == tuple(many[: MAX_NAMES_CHARS // MAX_KEY_NAME]) and sum(map(len, sent)) <= MAX_NAMES_CHARS


class _Stalls(logging.Handler):
    """Collects stall reports; ``seen`` is set by the first."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "has waited" in message:
            self.lines.append(message)
            self.seen.set()


def test_a_stalled_round_of_a_str_key_is_reported_by_its_name():
    stalls = _Stalls()
    logger = logging.getLogger("pskv.server")
    logger.addHandler(stalls)
    try:
        with InProcessCluster(1, 2, deadline=30.0, stall_report=0.2) as cluster:
            def body(cfg):
                kv = pskv.create("dist_sync", cluster=cfg)
                try:
                    kv.init("embedding.weight", np.zeros(4, np.float32))
                    if kv.rank == 1:  # late: the round waits for this worker until the report is out
                        assert stalls.seen.wait(20), "no stall report"
                    kv.push("embedding.weight", np.ones(4, np.float32))
                    return kv.pull("embedding.weight").tolist()
                finally:
                    kv.close()
            assert cluster.run_workers(body) == [[2.0] * 4] * 2
    finally:
        logger.removeHandler(stalls)
    named = [line for line in stalls.lines if "'embedding.weight'" in line]
    assert named and f"(server key {server_key('embedding.weight')})" in named[0], stalls.lines
    assert "for worker 1 (pushed: worker 0)" in named[0]
