"""The files of the servers' state: optimizer-state files land where the user says, written and read by
the worker that calls (``pskv.kvstore.state_files``); a server never writes or reads a path a peer chose
(SAVE_STATES / LOAD_STATES name none, a checkpoint directory must lie in the directories fixed when the
server started, ``pskv.server.paths``).

Driven through the loopback store (the real worker layer and server core, no sockets); through
``pskv launch`` with real processes in ``tests/integration/test_state_paths.py``.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD
from pskv.optimizer import states as state_format
from pskv.protocol import Command
from pskv.server.paths import AllowedPaths
from pskv.testing.loopback import loopback_store

REFUSED = r"InvalidArgumentError: server \d: {what}: refused path '{path}'"


def test_a_bad_state_path_is_an_optimizer_state_error_naming_the_file(tmp_path):
    with loopback_store("dist_sync", num_servers=2) as kv:
        kv.init("w", np.ones(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        missing = tmp_path / "no" / "such" / "dir" / "states"
        with pytest.raises(pskv.OptimizerStateError, match=r"save_optimizer_states: cannot write .*states\.server0"):
            kv.save_optimizer_states(str(missing))
        with pytest.raises(pskv.OptimizerStateError, match=r"load_optimizer_states: cannot read .*states\.server0"):
            kv.load_optimizer_states(str(missing))
        (tmp_path / "junk.server0").write_bytes(b"not a state file")
        (tmp_path / "junk.server1").write_bytes(b"not a state file")
        with pytest.raises(pskv.OptimizerStateError, match=r"junk\.server0: not a pskv optimizer state file"):
            kv.load_optimizer_states(str(tmp_path / "junk"))
        kv.save_optimizer_states(str(tmp_path / "ok"))  # a good path still works
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ok")) == ["ok.server0", "ok.server1"]


def test_state_files_go_wherever_the_worker_says_and_are_the_local_store_s_format(tmp_path):
    """No PSKV_STATE_DIR: the servers' directory is one place, the files another (absolute, outside it)."""
    (tmp_path / "server").mkdir()
    (tmp_path / "elsewhere").mkdir()
    with loopback_store("dist_sync", num_servers=2, state_dir=str(tmp_path / "server")) as kv:
        kv.init(list(range(4)), [np.zeros(3, np.float32)] * 4)
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        kv.push(list(range(4)), [np.ones(3, np.float32)] * 4)
        path = str(tmp_path / "elsewhere" / "opt.states")
        kv.save_optimizer_states(path, dump_optimizer=True)
        kv.push(list(range(4)), [np.ones(3, np.float32)] * 4)
        kv.load_optimizer_states(path)
        kv.push(list(range(4)), [np.ones(3, np.float32)] * 4)  # momentum from the file: -0.1 (not -0.19)
        np.testing.assert_allclose(kv.pull(0), -0.1 - 0.19 - 0.19, rtol=1e-6)  # (-0.561 without the load)
    assert not list((tmp_path / "server").iterdir())
    docs = [state_format.load(tmp_path / "elsewhere" / f"opt.states.server{r}") for r in (0, 1)]
    assert sorted(k.key for d in docs for k in d.keys) == list(range(4))  # each key on one server
    assert all(d.optimizer is not None and d.optimizer["name"] == "sgd" for d in docs)
    local = pskv.create("local")  # the same format: the local store reads a server's file
    local.load_optimizer_states(str(tmp_path / "elsewhere" / "opt.states.server0"))


def test_a_state_that_does_not_fit_the_shard_is_refused_by_the_server(tmp_path):
    with loopback_store("dist_sync", num_servers=1) as kv, loopback_store("dist_sync", num_servers=1) as other:
        kv.init(5, np.zeros(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        kv.push(5, np.ones(4, np.float32))
        kv.save_optimizer_states(str(tmp_path / "four"))
        other.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        with pytest.raises(pskv.RemoteError, match="the state has key 5, which this server does not hold"):
            other.load_optimizer_states(str(tmp_path / "four"))  # before init
        other.init(5, np.zeros(3, np.float32))
        with pytest.raises(pskv.RemoteError, match=r"state 'momentum' of key 5 has shape \(4,\), the key's slice "
                                                   r"on this server \(3,\)"):
            other.load_optimizer_states(str(tmp_path / "four"))


def test_servers_refuse_state_requests_that_name_a_path_and_write_nothing(tmp_path):
    """A peer's SAVE_STATES / LOAD_STATES naming a file (as they once did) is a protocol error on the server."""
    (tmp_path / "state").mkdir()
    with loopback_store("dist_sync", num_servers=1, state_dir=str(tmp_path / "state")) as kv:
        kv.init("w", np.ones(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        for command, path in ((Command.SAVE_STATES, str(tmp_path / "chosen")), (Command.SAVE_STATES, "inside"),
                              (Command.LOAD_STATES, "/etc/passwd")):
            body = json.dumps({"path": path, "num_update": 0, "keys": []})
            pending = kv._worker.client.request(0, command, body=body, what="hostile")
            with pytest.raises(pskv.RemoteError, match=f"ProtocolError: {command.name} names no file"):
                pending.wait(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"] and not list((tmp_path / "state").iterdir())


@pytest.fixture
def confined(tmp_path):
    """A loopback store whose servers may use ``tmp/state`` and ``tmp/ckpt``; ``tmp/outside`` holds a file."""
    for d in ("state", "ckpt", "outside"):
        (tmp_path / d).mkdir()
    (tmp_path / "outside" / "secret.server0").write_bytes(b"not yours")
    with loopback_store("dist_sync", num_servers=1, state_dir=str(tmp_path / "state"),
                        checkpoint_dir=str(tmp_path / "ckpt")) as kv:
        kv.init("w", np.ones(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        yield kv, tmp_path


def _outside_paths(tmp):
    os.symlink(tmp / "outside", tmp / "state" / "link")  # a link inside that points outside
    return {
        "dotdot": str(tmp / "state" / ".." / "outside" / "secret"),
        "absolute": str(tmp / "outside" / "secret"),
        "symlink": str(tmp / "state" / "link" / "secret"),
        "root": "/etc/passwd",
    }


def test_checkpoints_outside_the_allowed_directories_are_refused_naming_the_path(confined, caplog):
    kv, tmp = confined
    for how, path in _outside_paths(tmp).items():
        if how == "root":  # rank 0 makes the directory (on its own host) before the servers write
            continue
        with pytest.raises(pskv.RemoteError, match=REFUSED.format(what="save_checkpoint", path=re.escape(os.path.abspath(path)))):
            kv.save_checkpoint(path)
    assert not list((tmp / "outside").rglob("server-*"))
    assert (tmp / "outside" / "secret.server0").read_bytes() == b"not yours"
    refusals = [r.getMessage() for r in caplog.records if r.name == "pskv.server" and "refused path" in r.getMessage()]
    assert len(refusals) == 3 and all(r.startswith("server 0: save_checkpoint: refused path") for r in refusals)
    saved = kv.save_checkpoint()  # under PSKV_CHECKPOINT_DIR
    assert os.path.dirname(saved) == str(tmp / "ckpt") and os.path.exists(os.path.join(saved, "manifest.json"))
    kv.save_checkpoint(str(tmp / "state" / "mine"))
    assert (tmp / "state" / "mine" / "manifest.json").exists()


def test_a_peer_s_relative_path_resolves_against_the_state_directory(tmp_path):
    paths = AllowedPaths([str(tmp_path / "s"), "", str(tmp_path / "c")])
    assert paths.roots == (str(tmp_path / "s"), str(tmp_path / "c"))
    assert paths.check("x/y", "t") == str(tmp_path / "s" / "x" / "y")
    assert paths.check(str(tmp_path / "c"), "t") == str(tmp_path / "c")
    for bad in ("../c2", "../c/../..", "../sx", str(tmp_path / "sx"), "x\0y", "/"):
        with pytest.raises(pskv.InvalidArgumentError, match="t: refused path"):
            paths.check(bad, "t")
    with pytest.raises(pskv.InvalidArgumentError):
        AllowedPaths(["", ""])
