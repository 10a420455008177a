"""The SLURM launcher: the job inside an allocation, each process a job step of its own.

``pskv launch --launcher slurm -n W -s S -- COMMAND`` runs where an allocation is (an
``sbatch`` script, an ``salloc`` shell). The hosts are the allocation's
(``SLURM_JOB_NODELIST``, its compressed syntax expanded by
:func:`pskv.config.expand_hostlist`), each with its tasks per node as worker slots
(``SLURM_TASKS_PER_NODE``), unless ``-H`` names hosts. Placement is the ssh launcher's
(:func:`pskv.launch.ssh.place`): the scheduler on the first host, on ``--port`` (9091);
servers one per host in turn; workers round-robin by slots. Each process is one step::

    srun --nodes=1 --ntasks=1 --nodelist=HOST --overlap --kill-on-bad-exit=1 --quiet --job-name=pskv-JOB-worker-1 env ... COMMAND

``--launcher-command`` replaces ``srun`` (and may add options: ``"srun --cpus-per-task=8"``);
``--overlap`` lets the steps share the allocation's CPUs (Slurm 20.11 or later). The same
supervision as locally: each ``srun`` runs here under :mod:`pskv.launch.guard`, whose
lifeline ends it (and srun its step) when the launcher is gone; ``srun`` exits as its
task did, so the first step to fail is named as the root cause with its code.

Two things real ``srun`` does differently from a local process, and how the job copes:

* SIGTERM to ``srun`` is not passed on: srun "forces job termination" and SIGKILLs its
  step. A job being stopped asks each step instead with ``scancel --signal=TERM JOB.STEP``
  (the step found by its name, ``pskv-JOB-ROLE-RANK``, in ``squeue --steps``), so a worker's
  SIGTERM handler runs; SIGTERM to ``srun`` is the hard stop after ``--stop-grace``.
* Other signals are: the guard's SIGUSR1 ("no worker will come") reaches the scheduler and
  servers through srun (or mpirun), possibly before they are ready for it. Their command
  starts with SIGUSR1 ignored (``sh -c "trap '' USR1; exec ..."``), as a local role's does:
  a signal before the role is ready is lost, not fatal (the guard repeats it). One that
  reaches the ``sh`` before its ``trap`` (under load) kills the role; the supervisor takes
  that for the end it asked for, since it only comes once every worker has exited 0.
* ``scancel`` of the whole job: SLURM sends SIGTERM to every step; the first to end is
  named with slurmstepd's "CANCELLED AT" line (the supervisor reads it from the step's
  output). In an ``sbatch`` script the launcher gets SIGTERM too.

:func:`run_steps` is the runner of every launcher whose processes start through a
per-host command (``srun``, ``mpirun``: :mod:`pskv.launch.mpi`).
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable, Sequence

from pskv.config import omp_num_threads_set, slurm_allocation
from pskv.errors import InvalidArgumentError, LaunchError
from pskv.launch.config import DEFAULT_SSH_PORT, LaunchConfig
from pskv.launch.console import Console
from pskv.launch.contract import (
    JobLayout,
    ProcessSpec,
    contract_env,
    env_argv,
    omp_note,
    role_argv,
)
from pskv.launch.elastic import workers_of
from pskv.launch.on_host import publish_address
from pskv.launch.ssh import Host, place, read_hostfile, ssh_layout
from pskv.launch.supervisor import Supervisor

__all__ = ["Stop", "Wrap", "allocation_hosts", "run_slurm", "run_steps", "scancel_argv", "srun_argv", "step_name",
           "step_specs", "worker_step"]

Wrap = Callable[[Host, Sequence[str]], list[str]]  # (host, the process's env argv) -> the command run here
Stop = Callable[[ProcessSpec], Sequence[str]]  # a process -> the command that asks it to stop ('': SIGTERM)

# a role's command under srun / mpirun: SIGUSR1 ignored until the role handles it (see the module doc)
_USR1_IGNORED = ("sh", "-c", "trap '' USR1; exec \"$@\"", "sh")
# the step named $1 of this allocation (any, with -H outside one) gets SIGTERM, as a local process would
_SCANCEL_TERM = ('squeue -h -s ${SLURM_JOB_ID:+-j "$SLURM_JOB_ID"} -o "%i %j" | while read -r id name; do '
                 '[ "$name" = "$1" ] && exec scancel --signal=TERM "$id"; done')
_PAIR = re.compile(r"(DMLC_ROLE|DMLC_WORKER_ID|PSKV_SERVER_RANK|PSKV_JOB_ID)=(.*)")


def step_name(argv: Sequence[str]) -> str:
    """The step's name, from its contract variables in ``argv``: ``pskv-JOB-worker-1``, ``pskv-JOB-scheduler``."""
    found = {}
    for arg in argv:
        m = _PAIR.fullmatch(arg)
        if m is not None and m.group(1) not in found:
            found[m.group(1)] = m.group(2)
    rank = found.get("DMLC_WORKER_ID", found.get("PSKV_SERVER_RANK"))
    return "-".join(["pskv", found.get("PSKV_JOB_ID", "job"), found.get("DMLC_ROLE", "process"),
                     *([rank] if rank is not None else [])])


def srun_argv(host: Host, argv: Sequence[str], srun_command: str = "") -> list[str]:
    """``srun ... --nodelist=HOST ... --job-name=NAME ARGV``: one task on ``host``, sharing the allocation's
    CPUs, named by :func:`step_name` (the stop command finds it by that name)."""
    return [*shlex.split(srun_command or "srun"), "--nodes=1", "--ntasks=1", f"--nodelist={host.name}",
            "--overlap", "--kill-on-bad-exit=1", "--quiet", f"--job-name={step_name(argv)}", *argv]


def scancel_argv(spec: ProcessSpec) -> list[str]:
    """The command that sends SIGTERM to ``spec``'s step (``scancel --signal=TERM JOB.STEP``, found by its name)."""
    return ["sh", "-c", _SCANCEL_TERM, "sh", step_name(spec.argv)]


def allocation_hosts(config: LaunchConfig) -> list[Host]:
    """The hosts of a slurm job: ``-H``'s, else the allocation's (slots: its tasks per node).

    Raises:
        InvalidArgumentError: no ``-H`` and no allocation here (``SLURM_JOB_NODELIST`` unset),
            or the allocation's variables are malformed.
    """
    if config.hostfile:
        return read_hostfile(config.hostfile)
    allocation = slurm_allocation()
    if not allocation:
        raise InvalidArgumentError("--launcher slurm runs inside an allocation (sbatch, salloc): SLURM_JOB_NODELIST "
                                   "is not set here; or name the hosts with -H")
    return [Host(name, slots) for name, slots in allocation]


def step_specs(config: LaunchConfig, hosts: Sequence[Host], server_hosts: Sequence[Host] | None,
               wrap: Wrap) -> list[ProcessSpec]:
    """The scheduler (unless ``-s 0``), servers and workers placed on ``hosts``, each run as ``wrap(host, argv)``
    (an elastic job's workers: none, :class:`~pskv.launch.elastic.ElasticWorkers` starts them)."""
    where = place(hosts, config.num_servers, config.num_workers, server_hosts)
    layout = ssh_layout(config, where.scheduler, [h.address for h, _ in where.workers])

    def spec(role: str, rank: int | None, host: Host, env: dict[str, str], command: Sequence[str]) -> ProcessSpec:
        argv = env_argv(env, config.env, command)
        return ProcessSpec(role, rank, host.address, tuple(wrap(host, [*_USR1_IGNORED, *argv])))

    specs = []
    if config.num_servers:
        specs.append(spec("scheduler", None, where.scheduler,
                          contract_env(layout, "scheduler", where.scheduler.address),
                          role_argv(config.python, "scheduler")))
    for rank, host in enumerate(where.servers):
        specs.append(spec("server", rank, host, contract_env(layout, "server", host.address, rank),
                          role_argv(config.python, "server")))
    for rank, (host, local_rank) in enumerate(() if config.elastic else where.workers):
        specs.append(worker_step(config, layout, wrap, rank, host, local_rank))
    return specs


def worker_step(config: LaunchConfig, layout: JobLayout, wrap: Wrap, rank: int, host: Host,
                local_rank: int) -> ProcessSpec:
    """Worker ``rank`` (an elastic job's: its slot) on ``host``, run as ``wrap(host, argv)``."""
    env = contract_env(layout, "worker", host.address, rank, local_rank)
    return ProcessSpec("worker", rank, host.address, tuple(wrap(host, env_argv(env, config.env, config.command))))


def run_steps(config: LaunchConfig, console: Console, hosts: Sequence[Host], wrap: Wrap, launcher: str,
              stop: Stop | None = None) -> int:
    """Run the job's processes, each through ``wrap`` (``srun``, ``mpirun``), supervised here; the exit code.

    ``stop``: the command that asks a process to stop, in place of SIGTERM to its ``srun``
    (see :meth:`pskv.launch.supervisor.Supervisor.start`).

    Raises:
        InvalidArgumentError: the server hostfile is unreadable or malformed (nothing started).
    """
    server_hosts = read_hostfile(config.server_hostfile, "server hostfile") if config.server_hostfile else None
    config, workers = workers_of(config, console.note, {h.name: h.slots for h in hosts})
    specs = step_specs(config, hosts, server_hosts, wrap)
    port = DEFAULT_SSH_PORT if config.port is None else config.port
    console.started(config.num_workers, config.num_servers,
                    f"{specs[0].host}:{port}" if config.num_servers else "no host (-s 0: workers only)", launcher)
    with contextlib.closing(workers), Supervisor(console, stop_grace=config.stop_grace, exit_grace=config.exit_grace,
                                                 timeout=config.timeout, worker_restarts=config.worker_restarts,
                                                 workers=workers) as supervisor:
        def start(spec: ProcessSpec) -> None:
            supervisor.start(spec, stop(spec) if stop is not None else ())

        try:
            if config.num_servers:
                publish_address(config, console, f"{specs[0].host}:{port}")
            note = omp_note(config.env, omp_num_threads_set())
            if note:
                console.note(note)
            for spec in specs:
                start(spec)
            layout = ssh_layout(config, hosts[0], ())
            workers.begin(lambda slot, host, local: start(worker_step(config, layout, wrap, slot, Host(host), local)),
                          supervisor.stop_worker,
                          f"tcp://{specs[0].host}:{port}", config.launch_token, config.curve_key_file)
        except LaunchError as exc:
            supervisor.abort(str(exc))
        return supervisor.run()


def run_slurm(config: LaunchConfig, console: Console) -> int:
    """Run the job as steps of the allocation this launcher runs in; returns the launcher's exit code.

    Raises:
        InvalidArgumentError: no allocation and no ``-H``, or malformed hosts (nothing started).
    """
    return run_steps(config, console, allocation_hosts(config),
                     lambda host, argv: srun_argv(host, argv, config.launcher_command), "slurm", scancel_argv)
