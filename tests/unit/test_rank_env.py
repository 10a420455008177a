"""``pskv.config.rank_env``: the rank variables of pskv launch, torchrun, Open MPI, PMI and SLURM."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

import pskv
from pskv.config import LAUNCHER_ENV_VARS, RANK_ENV_VARS, RankEnv, expand_hostlist, expand_tasks_per_node, rank_env

REPO = Path(__file__).resolve().parents[2]

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2),3",
         "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_JOB_ID": "4242"}


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"DMLC_NUM_WORKER": "2"}, None),  # an MXJob pod: ranks by arrival, nothing to map
    ({"DMLC_WORKER_ID": "1", "DMLC_NUM_WORKER": "2", "PSKV_LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000"},
     RankEnv("pskv", 1, 2, 1, 2, "127.0.0.1", 4000)),
    ({"DMLC_WORKER_ID": "0", "DMLC_NUM_WORKER": "3"}, RankEnv("pskv", 0, 3, 0, 1)),
    (TORCHRUN, RankEnv("torchrun", 3, 4, 1, 2, "10.0.0.1", 29500)),
    ({"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},  # a PyTorchJob pod
     RankEnv("torchrun", 2, 3, 0, 1, "job-master-0", 23456)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, RankEnv("mpi", 2, 4, 0, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, RankEnv("pmi", 1, 2, 1, 2)),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, RankEnv("pmi", 0, 1, 0, 1)),
    (SLURM, RankEnv("slurm", 5, 6, 1, 3, "gpu07", 15000 + 4242)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
      "SLURM_NODELIST": "a,b", "MASTER_ADDR": "b", "MASTER_PORT": "1234"}, RankEnv("slurm", 3, 4, 1, 2, "b", 1234)),
    # the order: pskv launch's variables, then torchrun's, Open MPI's, PMI's, SLURM's
    ({**SLURM, "PMI_RANK": "0", "PMI_SIZE": "1"}, RankEnv("pmi", 0, 1, 0, 1)),
    ({**SLURM, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "1"},
     RankEnv("mpi", 1, 2, 0, 1)),
    ({**SLURM, **TORCHRUN, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     RankEnv("torchrun", 3, 4, 1, 2, "10.0.0.1", 29500)),
])
def test_each_source_maps_to_a_rank_env(env, expected):
    assert rank_env(env) == expected


@pytest.mark.parametrize("env, match", [
    ({"DMLC_WORKER_ID": "1"}, "DMLC_WORKER_ID='1' is set but DMLC_NUM_WORKER is not"),
    ({"RANK": "0"}, "RANK='0' is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE='2' is set but RANK is not"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2' must be < WORLD_SIZE='2'"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' must be >= 0"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not a valid int"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "LOCAL_RANK='0' is set but LOCAL_WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK='2' must be < LOCAL_WORLD_SIZE='2'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3"},
     "LOCAL_WORLD_SIZE='3' is more than the job's 2"),
    ({**TORCHRUN, "MASTER_ADDR": ""}, "MASTER_PORT='29500' is set but MASTER_ADDR is not"),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
    ({"DMLC_WORKER_ID": "1", "DMLC_NUM_WORKER": "2", "RANK": "0", "WORLD_SIZE": "2"},
     "RANK='0' contradicts DMLC_WORKER_ID='1'"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE='4' is set but OMPI_COMM_WORLD_RANK is not"),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "PMI_RANK='4' must be < PMI_SIZE='4'"),
    ({"SLURM_PROCID": "0"}, "SLURM_PROCID='0' is set but SLURM_NTASKS is not"),
    ({**SLURM, "SLURM_NODEID": "3"}, "SLURM_NODEID='3' has no entry in SLURM_TASKS_PER_NODE='2\\(x2\\),3'"),
    ({**SLURM, "SLURM_LOCALID": "3"},
     "SLURM_LOCALID='3' must be < 3, this node's tasks: entry 2 of SLURM_TASKS_PER_NODE='2\\(x2\\),3'$"),
    # the limit used is the one named: the step's 2 tasks, not the allocation's 8 per node
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "8", "SLURM_LOCALID": "3"},
     "SLURM_LOCALID='3' must be < 2, SLURM_NTASKS='2' \\(fewer than SLURM_NTASKS_PER_NODE='8'\\)$"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_LOCALID": "2"},
     "SLURM_LOCALID='2' must be < SLURM_NTASKS_PER_NODE='2'$"),
    ({**SLURM, "SLURM_TASKS_PER_NODE": "2(x)"}, "SLURM_TASKS_PER_NODE='2\\(x\\)': '2\\(x\\)' is not 'N' or 'N\\(xM\\)'"),
    ({**SLURM, "SLURM_JOB_NODELIST": "gpu[07-09"}, "SLURM_JOB_NODELIST='gpu\\[07-09': '\\[' without '\\]'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
     "SLURM_LOCALID='0' is set but neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is"),
])
def test_partial_contradictory_and_out_of_range_values_name_the_variable(env, match):
    with pytest.raises(pskv.InvalidArgumentError, match=match):
        rank_env(env)


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a[8-11]", ["a8", "a9", "a10", "a11"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("x-1,[3-4]y", ["x-1", "3y", "4y"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, match", [
    ("a[1-2", "'\\[' without '\\]'"), ("a]1", "'\\]' without '\\['"), ("a[[1]]", "nested"),
    ("a,,b", "an empty host name"), ("a[3-1]", "runs backwards"), ("a[x]", "'x' is not a number"),
    ("a[0-99999]", "more than 65536 hosts"),
    ("a[1-\u00b2]", "'1-\u00b2' is not a number"),  # str.isdigit() takes '²', int() does not: was a ValueError
    ("a[\u0663]", "is not a number"),  # an Arabic-Indic 3 is no node number
    ("a[1-" + "9" * 5000 + "]", "is not a number"),  # int() refuses 4300 digits: was a ValueError
])
def test_malformed_host_lists_are_refused(text, match):
    with pytest.raises(pskv.InvalidArgumentError, match="SLURM_JOB_NODELIST=.*" + match):
        expand_hostlist(text)


def test_a_host_list_too_long_is_refused_before_its_hosts_are_built():
    """Two bracket groups multiply: the count is checked before the product (a[1-65536]b[1-65536] built
    4 billion names first)."""
    tracemalloc.start()
    try:
        with pytest.raises(pskv.InvalidArgumentError, match="more than 65536 hosts"):
            expand_hostlist("a[1-1000]b[1-1000]")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 << 20, peak


def test_tasks_per_node_expand():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    for bad in ("0", "2(x0)", "a", "2(x1000000)", "\u0663", "2(x\u0663)", "2(x3", "", "9" * 5000):
        with pytest.raises(pskv.InvalidArgumentError, match="SLURM_TASKS_PER_NODE"):
            expand_tasks_per_node(bad)


def test_every_rank_variable_is_documented():
    text = (REPO / "docs" / "env.md").read_text(encoding="utf-8")
    for var in [*RANK_ENV_VARS, *LAUNCHER_ENV_VARS]:
        assert f"`{var}`" in text, var


POD = {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "DMLC_NUM_SERVER": "1"}


def test_a_worker_without_dmlc_takes_rank_size_and_scheduler_from_the_cluster_manager():
    from pskv.config import ClusterConfig

    c = ClusterConfig.from_env(POD)  # a PyTorchJob pod: the scheduler beside torch.distributed's master port
    assert (c.rank, c.num_workers, c.local_rank, c.root_uri, c.root_port) == (2, 3, 0, "job-master-0", 23457)
    c.require_cluster()
    server = ClusterConfig.from_env({**POD, "DMLC_ROLE": "server"})
    assert (server.rank, server.num_workers, server.root_uri, server.root_port) == (-1, 3, "job-master-0", 23457)
    slurm = ClusterConfig.from_env({**SLURM, "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "2"})
    assert (slurm.rank, slurm.num_workers, slurm.local_rank, slurm.root_uri, slurm.root_port) == (5, 6, 1, "gpu07", 9091)
    mpi = ClusterConfig.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                                  "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000"})
    assert (mpi.rank, mpi.num_workers, mpi.root_uri, mpi.root_port) == (1, 2, "10.0.0.1", 9000)
    # set variables win: DMLC_*, PSKV_LOCAL_RANK, and arguments in code
    mine = ClusterConfig.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "DMLC_WORKER_ID": "0",
                                   "DMLC_NUM_WORKER": "2", "DMLC_PS_ROOT_PORT": "9", "MASTER_ADDR": "m"})
    assert (mine.rank, mine.root_uri, mine.root_port) == (0, "m", 9)
    assert ClusterConfig.from_env({**POD, "PSKV_LOCAL_RANK": "1"}).local_rank == 1
    assert ClusterConfig.from_env(POD, root_port=7).root_port == 7
    # pskv launch's own variables: nothing to fill in; an MXJob pod (no manager): ranks by arrival
    mxjob = {"DMLC_PS_ROOT_URI": "s", "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2"}
    assert ClusterConfig.from_env(mxjob).rank == -1


def test_a_cluster_manager_that_contradicts_dmlc_is_refused():
    from pskv.config import ClusterConfig

    with pytest.raises(pskv.InvalidArgumentError, match="DMLC_NUM_WORKER='4' contradicts the torchrun job's 3"):
        ClusterConfig.from_env({**POD, "DMLC_NUM_WORKER": "4"})
    with pytest.raises(pskv.InvalidArgumentError, match="RANK='3' must be < WORLD_SIZE='3'"):
        ClusterConfig.from_env({**POD, "RANK": "3"})
