"""What the slurm and mpi launchers and the SLURM rank variables do, without a cluster (fast).

The same behaviour on the real programs: tests/integration/test_real_slurm.py.
"""

from __future__ import annotations

import io
import sys
import time

import pytest

from pskv.config import RankEnv, rank_env
from pskv.launch import LaunchConfig
from pskv.launch.console import Console
from pskv.launch.contract import ProcessSpec
from pskv.launch.mpi import mpirun_env
from pskv.launch.slurm import scancel_argv, srun_argv, step_name, step_specs
from pskv.launch.ssh import Host
from pskv.launch.supervisor import Supervisor

STEP = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "1(x2)"}


def test_a_steps_own_tasks_per_node_win_over_the_allocations_inherited_count():
    assert rank_env(STEP).local_world_size == 2  # without the step's variables: the allocation's
    step = {**STEP, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_ID": "1"}
    assert (rank_env(step).local_rank, rank_env(step).local_world_size) == (0, 1)
    with pytest.raises(ValueError, match="SLURM_STEP_TASKS_PER_NODE='x'"):
        rank_env({**step, "SLURM_STEP_TASKS_PER_NODE": "x"})


def test_srun_with_pmi2_gives_slurms_local_rank_and_master_not_pmis_nothing():
    """srun --mpi=pmi2 sets PMI_RANK / PMI_SIZE too, without Hydra's MPI_LOCALRANKID: they were taken for
    an MPICH job's (local rank 0 of 1 on every node, no master: the horovod store could not meet)."""
    step = {**STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "PMI_RANK": "3", "PMI_SIZE": "4",
            "PMI_FD": "7", "PMI_JOBID": "4242.0"}
    assert rank_env(step) == RankEnv("slurm", 3, 4, 1, 2, "n1", 19242)
    hydra = {**step, "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}  # mpirun (Hydra) in an allocation: its own
    assert rank_env(hydra) == RankEnv("pmi", 3, 4, 0, 1)
    assert rank_env({**step, "PMI_RANK": "0"}).source == "pmi"  # PMI's rank is not srun's: PMI's wins, as before


def test_a_step_id_that_is_no_number_moves_no_port():
    for step_id in ("\u00b2", "9" * 5000):  # '²'.isdigit(), int() of 4300 digits: were ValueErrors
        assert rank_env({**STEP, "SLURM_STEP_ID": step_id}).master_port == 19242


def test_each_step_meets_at_its_own_first_node_and_port():
    assert (rank_env(STEP).master_addr, rank_env(STEP).master_port) == ("n1", 19242)  # no step id: as before
    ports = set()
    for step_id, nodes, first in (("0", "n2", "n2"), ("1", "n[1-2]", "n1"), ("2", "n2", "n2")):
        ranks = rank_env({**STEP, "SLURM_STEP_ID": step_id, "SLURM_STEP_NODELIST": nodes})
        assert ranks.master_addr == first
        ports.add(ranks.master_port)
    assert len(ports) == 3 and all(15000 <= p < 25000 for p in ports)
    assert rank_env({**STEP, "SLURM_STEP_ID": "0"}).master_port == 19242


def test_each_step_is_named_and_stopped_by_scancel_and_the_roles_ignore_sigusr1_until_ready():
    config = LaunchConfig(2, 1, ("python", "t.py"), launcher="slurm", job_id="abc")
    specs = step_specs(config, [Host("n1", 2)], None, srun_argv)
    assert [step_name(s.argv) for s in specs] == ["pskv-abc-scheduler", "pskv-abc-server-0", "pskv-abc-worker-0",
                                                  "pskv-abc-worker-1"]
    assert "--job-name=pskv-abc-worker-1" in specs[3].argv
    for spec in specs[:2]:  # scheduler, server: through sh with SIGUSR1 ignored
        start = spec.argv.index("--job-name=" + step_name(spec.argv)) + 1
        assert spec.argv[start:start + 4] == ("sh", "-c", "trap '' USR1; exec \"$@\"", "sh")
    assert "trap '' USR1; exec \"$@\"" not in specs[2].argv  # a worker gets no SIGUSR1
    stop = scancel_argv(specs[3])
    assert stop[:2] == ["sh", "-c"] and "scancel --signal=TERM" in stop[2] and stop[-1] == "pskv-abc-worker-1"
    assert mpirun_env(5) == ["env", "SLURM_OVERLAP=1", "OMPI_MCA_odls_base_sigkill_timeout=2"]


@pytest.mark.timeout(30)
def test_mpiruns_kill_timeout_is_half_the_stop_grace_in_whole_seconds_and_never_a_traceback():
    timeouts = [mpirun_env(grace)[2] for grace in (5, 0, 3.9, float("inf"), float("nan"), 1e300)]
    assert timeouts == [f"OMPI_MCA_odls_base_sigkill_timeout={n}" for n in (2, 1, 1, *[2**31 - 1] * 3)]


def test_a_stop_command_replaces_sigterm_and_sigterm_then_sigkill_are_the_hard_stop(tmp_path):
    asked = tmp_path / "asked"
    ignores_term = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "print('ready', flush=True)\ntime.sleep(60)")
    out, err = io.BytesIO(), io.StringIO()
    with Supervisor(Console(out, err), stop_grace=0.5) as supervisor:
        supervisor.start(ProcessSpec("worker", 0, "n1", (sys.executable, "-c", ignores_term)),
                         ("sh", "-c", f"echo {{pid}} > {asked}"))
        supervisor.start(ProcessSpec("worker", 1, "n1", (sys.executable, "-c",
                                                         "import time, sys; time.sleep(1.0); sys.exit(3)")))
        began = time.monotonic()
        code = supervisor.run()
    assert code == 3
    assert asked.read_text().strip().isdigit()  # the stop command ran, with the guard's pid
    assert time.monotonic() - began < 20
    assert err.getvalue().splitlines()[-1] == "pskv launch: stopped worker 0", err.getvalue()


@pytest.mark.timeout(30)
def test_a_role_killed_by_the_no_worker_signal_after_every_worker_exited_0_ended_as_asked():
    # under srun the roles' SIGUSR1 may reach a role's sh before its trap: the role dies of it, as asked to end
    dies_of_usr1 = "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_DFL)\ntime.sleep(20)"
    out, err = io.BytesIO(), io.StringIO()
    with Supervisor(Console(out, err), stop_grace=0.5) as supervisor:
        supervisor.start(ProcessSpec("scheduler", None, "n1", (sys.executable, "-c", dies_of_usr1)))
        supervisor.start(ProcessSpec("worker", 0, "n1", (sys.executable, "-c", "import time; time.sleep(0.5)")))
        code = supervisor.run()
    assert code == 0, err.getvalue()
    assert "pskv launch: scheduler on n1 ended by the launcher's word that no worker will come" in err.getvalue()
    assert "stopping" not in err.getvalue()
