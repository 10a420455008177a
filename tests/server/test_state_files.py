"""A server that cannot write or read an optimizer-state file answers a pskv error naming the file.

Driven through the loopback store: the real worker layer and server core, no sockets.
"""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD
from pskv.testing.loopback import loopback_store


def test_a_bad_state_path_is_an_optimizer_state_error_naming_the_file(tmp_path):
    with loopback_store("dist_sync", num_servers=2) as kv:
        kv.init("w", np.ones(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        missing = tmp_path / "no" / "such" / "dir" / "states"
        with pytest.raises(pskv.RemoteError, match=r"OptimizerStateError: server \d cannot write .*states\.server\d"):
            kv.save_optimizer_states(str(missing))
        with pytest.raises(pskv.RemoteError, match=r"OptimizerStateError: server \d cannot read .*states\.server\d"):
            kv.load_optimizer_states(str(missing))
        kv.save_optimizer_states(str(tmp_path / "ok"))  # a good path still works
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["ok.server0", "ok.server1"]
