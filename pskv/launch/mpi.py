"""The MPI launcher: each process of the job through ``mpirun`` on its host.

``pskv launch --launcher mpi -H host1:2,host2:2 -n W -s S -- COMMAND`` places the job as
the ssh launcher does (:func:`pskv.launch.ssh.place`) and starts each process as::

    mpirun -np 1 -host HOST env ... COMMAND

one ``mpirun`` per process, so each is supervised on its own: the first to fail is named
as the root cause with its code (``mpirun`` exits as its process did), and a stopped
launcher stops every ``mpirun`` through :mod:`pskv.launch.guard` (``mpirun`` passes
SIGTERM on to its process, see below). ``-np`` and ``-host`` are the options Open MPI, MPICH and
Intel MPI share; ``--launcher-command`` replaces ``mpirun`` and may add options
(``"mpirun --allow-run-as-root"``, ``"mpiexec"``). The ranks are pskv's (``DMLC_WORKER_ID``,
torchrun's ``RANK``), not MPI's: each ``mpirun`` is an MPI job of one process.

Each ``mpirun`` runs with two variables of its own (:func:`mpirun_env`):

* ``SLURM_OVERLAP=1``: inside a SLURM allocation, Open MPI (and MPICH's hydra) start their
  daemons with ``srun``; without ``--overlap`` each waits for CPUs the other steps hold,
  and a job of more processes than CPUs hangs until ``--timeout``, silently;
* ``OMPI_MCA_odls_base_sigkill_timeout`` = half of ``--stop-grace`` (whole seconds, at least 1): Open MPI answers
  SIGTERM by SIGTERM to its process that timeout later and SIGKILL another timeout on
  (1 s each by default: too soon for a worker's handler).

A job being stopped sends SIGTERM to each ``mpirun`` alone (``pkill -TERM -P GUARD``), not
to its process group: inside an allocation that group holds the ``srun`` of ``mpirun``'s
daemons, which would SIGKILL them at once. SIGTERM to the group is the hard stop.

The roles' commands start with SIGUSR1 ignored, as under srun (:mod:`pskv.launch.slurm`).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence

from pskv.launch.config import LaunchConfig
from pskv.launch.console import Console
from pskv.launch.slurm import run_steps
from pskv.launch.ssh import Host, read_hostfile

__all__ = ["mpirun_argv", "mpirun_env", "run_mpi"]

_MPIRUN_TERM = ("pkill", "-TERM", "-P", "{pid}")  # the guard's child, mpirun, alone (see the module doc)
_MCA_INT_MAX = 2**31 - 1  # an MCA integer parameter is a C int


def mpirun_argv(host: Host, argv: Sequence[str], mpirun_command: str = "") -> list[str]:
    """``mpirun -np 1 -host HOST ARGV``: one process on ``host``."""
    return [*shlex.split(mpirun_command or "mpirun"), "-np", "1", "-host", host.name, *argv]


def mpirun_env(stop_grace: float) -> list[str]:
    """``env NAME=VALUE...`` before ``mpirun``: its daemons' steps ``--overlap``; SIGTERM, then SIGKILL, to its
    process within ``stop_grace`` seconds (``inf``: as late as Open MPI can count, as the supervisor never kills)."""
    half = stop_grace / 2 if stop_grace < math.inf else math.inf  # nan too: the supervisor's deadline never comes
    return ["env", "SLURM_OVERLAP=1", f"OMPI_MCA_odls_base_sigkill_timeout={max(1, int(min(half, _MCA_INT_MAX)))}"]


def run_mpi(config: LaunchConfig, console: Console) -> int:
    """Run the job on ``-H``'s hosts through ``mpirun``; returns the launcher's exit code.

    Raises:
        InvalidArgumentError: the hosts are unreadable or malformed (nothing started).
    """
    assert config.hostfile is not None  # LaunchConfig checks it
    return run_steps(config, console, read_hostfile(config.hostfile),
                     lambda host, argv: [*mpirun_env(config.stop_grace), *mpirun_argv(host, argv, config.launcher_command)],
                     "mpi", lambda spec: _MPIRUN_TERM)
