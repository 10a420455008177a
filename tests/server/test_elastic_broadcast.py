"""A broadcast after an elastic job's commit writes a key in place: the commit keeps its copy (issue 24, step 4).

Without an updater a sync round *replaces* a part's value array, so a commit's snapshot holds a reference to
the array the part still uses; a broadcast (INIT with OVERWRITE) writes that array in place. It goes through
the shard observer's ``applied`` like every in-place write, so the commit's copy on write runs first, and a
departure's rollback puts the committed value back.
"""

from __future__ import annotations

import numpy as np

from pskv.protocol import Command, Flag, Header, encode
from pskv.protocol.bodies import Commit, View
from tests.server.test_elastic_wiring import SPEC, W0, Server, _values


def test_a_departure_after_a_broadcast_puts_the_committed_value_back():
    server = Server()
    server.start()
    server.push_round(1, *_values(1))
    committed = server.value(W0, 1)
    server.ok(server.send(W0, Command.COMMIT, body=Commit(1, 1).encode()))
    server.request += 1
    header = Header(Command.INIT, server.request, W0, (SPEC,), flags=Flag.OVERWRITE, epoch=server.epoch)
    server.core.handle(bytes([W0]), [bytes(f) for f in encode(header, [np.full(4, 7, np.float32)])])
    server.ok(server.request)
    np.testing.assert_array_equal(server.value(W0, 1), np.full(4, 7, np.float32))  # broadcast in place
    server.view(View(2, (0, 1), 1, "failure"))  # a departure: back to commit 1
    np.testing.assert_array_equal(server.value(W0, 0), committed)
