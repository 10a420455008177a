"""Statements of README.md and docs/ that were once false (issue 27), each checked against the code.

Each test names the sentence it keeps true; docs/claims.md lists them with the other guarantees.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pskv
from pskv.cluster.scheduler import _ranks
from pskv.config import ClusterConfig
from pskv.kvstore.byteps import BytePSStore
from pskv.kvstore.dist import DistStore
from pskv.kvstore.horovod import AllreduceStore
from pskv.launch import add_arguments
from pskv.launch.config import REMOTE_LAUNCHERS, LaunchConfig
from pskv.launch.on_host import local_specs
from pskv.testing import InProcessCluster

ROOT = Path(__file__).resolve().parents[2]


def read(doc: str) -> str:
    """A document with its lines joined (sentences wrap)."""
    return " ".join((ROOT / doc).read_text(encoding="utf-8").split())


@pytest.mark.parametrize("store", [pskv.create("local"), pskv.create("device"), DistStore, BytePSStore, AllreduceStore],
                         ids=["local", "device", "dist", "byteps", "horovod"])
def test_is_capable_raises_on_unknown_names_for_every_store(store):
    """README: "`is_capable` knows ... anything else raises `ValueError`" — for every store, the summing ones too."""
    with pytest.raises(pskv.InvalidArgumentError, match="Unknown capability: 'teleport'") as raised:
        store.is_capable("teleport")
    assert isinstance(raised.value, ValueError)
    assert all(isinstance(store.is_capable(c), bool) for c in pskv.KVStoreBase.CAPABILITIES)


def test_the_summation_only_stores_refuse_compression_and_say_so():
    """README: compression works on "every store but the summation-only `byteps`, `horovod` and `nccl`"."""
    assert "Every store but the summation-only `byteps`, `horovod` and `nccl`" in read("README.md")
    assert not BytePSStore.is_capable("gradient_compression") and not AllreduceStore.is_capable("gradient_compression")

    def refuse(cfg):
        with pskv.create("byteps", cluster=cfg) as kv:
            with pytest.raises(pskv.NotSupportedError, match="set_gradient_compression"):
                kv.set_gradient_compression({"type": "2bit"})
            return kv.is_capable("gradient_compression")

    with InProcessCluster(1, 1, deadline=30.0) as cluster:  # horovod / nccl refuse it too:
        assert cluster.run_workers(refuse) == [False]  # tests/integration/test_horovod_root_rank.py


def test_the_readme_lists_every_runtime_dependency():
    """README's "Runtime dependencies" sentence names every package of pyproject.toml's dependencies."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = pyproject.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    names = {m.lower() for m in re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, flags=re.M)}
    sentence = read("README.md").split("Runtime dependencies", 1)[1].split("PyTorch is optional", 1)[0]
    listed = set(re.findall(r"`([\w-]+)`(?!')", sentence))  # not "`fit`'s progress bar"
    assert names == listed, f"pyproject.toml: {sorted(names)}; README: {sorted(listed)}"


def test_server_hostfile_has_one_scope_in_the_help_the_docs_and_the_code():
    """--server-hostfile applies to ssh, slurm and mpi: the code's rule, --help and docs/launch.md say the same."""
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["server_hostfile"].startswith("ssh, slurm, mpi:")
    assert REMOTE_LAUNCHERS == ("ssh", "slurm", "mpi")
    for launcher in REMOTE_LAUNCHERS:  # accepted by every remote launcher, refused by the local one
        LaunchConfig(num_workers=1, num_servers=1, command=("p",), launcher=launcher, hostfile="h",
                     server_hostfile="s")
    with pytest.raises(pskv.InvalidArgumentError, match="only applies to --launcher ssh, slurm or mpi"):
        LaunchConfig(num_workers=1, num_servers=1, command=("p",), server_hostfile="s")
    launch = read("docs/launch.md")
    assert "| `--server-hostfile FILE` | — | ssh, slurm, mpi:" in launch
    assert "`--server-hostfile` without `--launcher ssh`" not in launch


def test_server_labels_are_ranks():
    """docs/launch.md: server numbers in prefixes are ranks — the launcher asks for rank i for server i, and the
    scheduler gives the ranks asked for whatever the order of registration."""
    config = LaunchConfig(num_workers=2, num_servers=3, command=("python", "train.py"))
    servers = [s for s in local_specs(config, 9091) if s.role == "server"]
    assert [s.rank for s in servers] == [0, 1, 2]
    assert all(f"PSKV_SERVER_RANK={s.rank}" in s.argv for s in servers)
    assert _ranks([2, 0, 1]) == [2, 0, 1]  # registered as server 2, then 0, then 1: each keeps its rank
    assert "may differ" not in read("docs/launch.md")


def test_launch_md_names_restart_servers_for_a_single_server():
    """docs/launch.md once said a single server does not rejoin a running job; --restart-servers does."""
    launch = read("docs/launch.md")
    assert "does not rejoin a running job" not in launch
    assert "to replace a single dead server inside the running job use `--restart-servers N`" in launch


def test_the_readme_quotes_the_measured_detection_time_not_a_bound():
    """README: NodeFailedError after PS_HEARTBEAT_TIMEOUT, with the measured time (10.4 s), not "within 10 s"."""
    readme = read("README.md")
    assert "within `PS_HEARTBEAT_TIMEOUT`" not in readme
    assert "measured 10.4 s after a `SIGKILL` with the defaults" in readme
    assert "10.4 s" in read("docs/reliability.md")
    assert ClusterConfig().heartbeat_timeout == 10.0  # "10 s by default"


def test_every_cuda_statement_points_at_the_untested_note():
    """README and docs/: a sentence naming CUDA as working says it is untested, and how to run the CUDA tests."""
    readme = read("README.md")
    assert "### CUDA and NCCL: untested" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python -m pytest -n 0 -rs -m cuda tests/" in readme
    assert "(CPU or CUDA)" not in readme and "(CPU and CUDA;" not in readme
    for doc in ("docs/optimizers.md", "docs/training.md", "docs/semantics.md"):
        text = read(doc)
        assert "(CPU or CUDA)" not in text, doc
        assert "claims.md#cuda-and-nccl-untested" in text, doc
    assert "## CUDA and NCCL: untested" in (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")

