"""The files a server writes and reads on a worker's request: errors naming the file, and
only inside the directories fixed when the server started (``pskv.server.paths``).

Driven through the loopback store (the real worker layer and server core, no sockets),
and once through ``pskv launch`` (real processes, a relative file name as users write it).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD
from pskv.server.paths import AllowedPaths
from pskv.testing.loopback import loopback_store
from tests.fault.launched import launch_job

REFUSED = r"InvalidArgumentError: server \d: {what}: refused path '{path}'"


def test_a_bad_state_path_is_an_optimizer_state_error_naming_the_file(tmp_path):
    with loopback_store("dist_sync", num_servers=2, state_dir=str(tmp_path)) as kv:
        kv.init("w", np.ones(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        missing = tmp_path / "no" / "such" / "dir" / "states"
        with pytest.raises(pskv.RemoteError, match=r"OptimizerStateError: server \d cannot write .*states\.server\d"):
            kv.save_optimizer_states(str(missing))
        with pytest.raises(pskv.RemoteError, match=r"OptimizerStateError: server \d cannot read .*states\.server\d"):
            kv.load_optimizer_states(str(missing))
        kv.save_optimizer_states(str(tmp_path / "ok"))  # a good path still works
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["ok.server0", "ok.server1"]


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


def test_state_files_outside_the_allowed_directories_are_refused_naming_the_path(confined):
    kv, tmp = confined
    for path in _outside_paths(tmp).values():
        with pytest.raises(pskv.RemoteError, match=REFUSED.format(what="save_optimizer_states",
                                                                  path=re.escape(os.path.abspath(path) + ".server0"))):
            kv.save_optimizer_states(path)
        with pytest.raises(pskv.RemoteError, match=REFUSED.format(what="load_optimizer_states",
                                                                  path=re.escape(os.path.abspath(path) + ".server0"))):
            kv.load_optimizer_states(path)
    assert (tmp / "outside" / "secret.server0").read_bytes() == b"not yours"  # neither written nor read
    assert sorted(p.name for p in (tmp / "outside").iterdir()) == ["secret.server0"]
    # inside either directory (a link that stays inside is fine too): written and read back
    os.symlink(tmp / "ckpt", tmp / "state" / "to_ckpt")
    for path in (tmp / "state" / "a", tmp / "ckpt" / "b", tmp / "state" / "to_ckpt" / "c"):
        kv.save_optimizer_states(str(path))
        kv.load_optimizer_states(str(path))
    assert sorted(p.name for p in (tmp / "ckpt").iterdir()) == ["b.server0", "c.server0"]


def test_checkpoints_outside_the_allowed_directories_are_refused_naming_the_path(confined, caplog):
    kv, tmp = confined
    for how, path in _outside_paths(tmp).items():
        if how == "root":  # rank 0 makes the directory (on its own host) before the servers write
            continue
        with pytest.raises(pskv.RemoteError, match=REFUSED.format(what="save_checkpoint", path=re.escape(os.path.abspath(path)))):
            kv.save_checkpoint(path)
    assert not list((tmp / "outside").rglob("server-*"))
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


LAUNCHED = """
import os
import numpy as np
import pskv
from pskv.optimizer import SGD

kv = pskv.create("dist_sync")
kv.init("w", np.ones(4, np.float32))
kv.set_optimizer(SGD(learning_rate=0.5))
kv.push("w", np.ones(4, np.float32))
kv.save_optimizer_states("opt.states", dump_optimizer=True)  # relative: the job's directory
kv.load_optimizer_states("opt.states")
print("saved", kv.save_checkpoint("ckpts/first"))
for bad in ("../escaped", os.path.join(os.path.dirname(os.getcwd()), "abs-escaped")):  # relative, absolute
    try:
        kv.save_optimizer_states(bad)
    except pskv.RemoteError as exc:
        print("refused", exc)
kv.close()
"""


def test_a_relative_state_file_works_through_pskv_launch_and_escapes_are_refused(tmp_path):
    job = tmp_path / "job"
    code, out = launch_job(job, LAUNCHED, [], ["-n", "1"], deadline=90)
    assert code == 0, out
    assert sorted(p.name for p in job.glob("opt.states*")) == ["opt.states.server0", "opt.states.server1"]
    assert f"saved {job / 'ckpts' / 'first'}" in out and (job / "ckpts" / "first" / "manifest.json").exists()
    refusals = re.findall(r"refused .*InvalidArgumentError: server \d: save_optimizer_states: refused path '(\S+)'",
                          out)
    assert len(refusals) == 2, out
    assert refusals[0].startswith(str(tmp_path / "escaped")) and refusals[1].startswith(str(tmp_path / "abs-escaped")), out
    assert not list(tmp_path.glob("*escaped*")) and not any(p.name.startswith("escaped") for p in job.iterdir())
