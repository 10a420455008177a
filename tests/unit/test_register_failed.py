"""REGISTER with ``failed`` (a node that could not start, issue 28 finding 5): it round-trips, and its
reason is bounded and typed like a collective's failure (no pickle, no unbounded text)."""

from __future__ import annotations

import pytest

from pskv.errors import CheckpointError, ProtocolError
from pskv.protocol import Command, Header
from pskv.protocol import bodies as b


def test_a_failed_registration_round_trips_with_the_error_class_and_message() -> None:
    body = b.Register("server", "", 0, failed=b.Failure.of(CheckpointError("/ck/manifest.json is not JSON")))
    parsed = b.Register.parse(Header(Command.REGISTER, 1, 0, body=body.encode()))
    assert parsed == body
    assert parsed.failed == b.Failure("CheckpointError", "/ck/manifest.json is not JSON")
    assert b.Register.parse(Header(Command.REGISTER, 1, 0, body=b.Register("worker", "").encode())).failed is None


@pytest.mark.parametrize(("failed", "match"), [
    ('"boom"', "a failure must be"),
    ('{"type": "E", "message": 3}', "a failure must be"),
    ('{"type": "E", "message": "' + "x" * (b.MAX_TEXT + 1) + '"}', "longer than"),
])
def test_a_malformed_failure_is_a_protocol_error(failed: str, match: str) -> None:
    header = Header(Command.REGISTER, 1, 0, body='{"role": "server", "rank": 0, "failed": ' + failed + "}")
    with pytest.raises(ProtocolError, match=match):
        b.Register.parse(header)
