"""shm_dir (pskv/worker/shared.py): a server's announced shared-memory directory is checked before any map."""

from __future__ import annotations

import os

import pytest

import pskv
from pskv.transport import shm
from pskv.transport.shm import ShmDirectory, host_id, job_prefix
from pskv.worker.shared import SharedParts, shm_dir


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_ROOT", str(tmp_path))
    return tmp_path


def test_a_servers_own_directory_passes(root):
    made = ShmDirectory(f"{job_prefix('j1')}server-")
    assert shm_dir(0, made.path, "j1") == made.path and shm_dir(0, made.path) == made.path
    parts = SharedParts([{"dir": made.path, "host": host_id()}, {"dir": "/etc", "host": "elsewhere"}], True)
    assert parts._dirs == {0: made.path}  # another host's is never opened here, so not checked


@pytest.mark.parametrize("where", ["/etc", "{root}/../pskv-j1-server-x", "{root}/pskv-j1-server-x/deeper",
                                   "{root}/pskv-j2-server-x", "{root}/other", "{root}/link", ""])
def test_any_other_path_is_refused_naming_the_server(root, where):
    os.symlink("/etc", root / "link")
    with pytest.raises(pskv.ProtocolError, match=r"^server 1 announced shared memory at .*: not a directory"):
        shm_dir(1, where.format(root=root), "j1")
    with pytest.raises(pskv.ProtocolError, match="^server 0 announced"):
        SharedParts([{"dir": where.format(root=root), "host": host_id()}], True, job_id="j1")


def test_a_link_in_the_root_to_elsewhere_is_refused_even_when_named_well(root, tmp_path_factory):
    os.symlink(tmp_path_factory.mktemp("elsewhere"), root / "pskv-j1-server-x")
    with pytest.raises(pskv.ProtocolError):
        shm_dir(0, str(root / "pskv-j1-server-x"), "j1")
