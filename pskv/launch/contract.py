"""The launch contract: the environment ``pskv launch`` gives each process it starts.

One table, :data:`CONTRACT`, lists every variable the launcher sets, who reads it and
what it means; ``docs/launch.md`` mirrors it (a test keeps the two in step). The
values themselves are read on the other side by :class:`pskv.config.ClusterConfig`.

Every process is started as ``env [-u NAME]... NAME=VALUE... PROGRAM ARGS...``: it
inherits the launcher's environment (locally; over ssh, the remote login's), gets the
``--env`` pairs and the contract on top, and loses contract variables that do not
apply to its role (a stray ``DMLC_WORKER_ID`` in the launcher's shell must not reach a
server). This way the launcher never reads ``os.environ`` itself (``pskv.config`` is
its only reader) and local and ssh processes are started the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CONTRACT", "ROLE_ORDER", "ProcessSpec", "JobLayout", "contract_env", "env_argv", "omp_note", "port_beside",
           "role_argv", "with_workers"]

# variable -> (who reads it, meaning). docs/launch.md mirrors this table.
CONTRACT: dict[str, tuple[str, str]] = {
    "DMLC_ROLE": ("every process (ClusterConfig.role)", "scheduler, server or worker"),
    "DMLC_PS_ROOT_URI": ("every process", "the scheduler's host (127.0.0.1 locally; the first host over ssh)"),
    "DMLC_PS_ROOT_PORT": ("every process", "the scheduler's port (0 for a local scheduler, which picks a free one)"),
    "DMLC_NUM_SERVER": ("every process", "number of servers (-s)"),
    "DMLC_NUM_WORKER": ("every process", "number of workers (-n)"),
    "DMLC_NODE_HOST": ("every process", "the address the process binds and advertises: its host"),
    "DMLC_WORKER_ID": ("workers (the rank)", "the worker's rank, 0..n-1"),
    "PSKV_LOCAL_RANK": ("workers (ClusterConfig.local_rank)", "the worker's index among the workers on its host"),
    "PSKV_SERVER_RANK": ("servers (ClusterConfig.server_rank)", "the server's rank, 0..s-1, so output labels and ranks agree"),
    "PSKV_CURVE_KEY_FILE": ("every process (ClusterConfig.curve_key_file)", "the CURVE cluster key file (--curve-key / --secure); absent: plain TCP"),
    "PSKV_CHECKPOINT_DIR": ("every process (ClusterConfig.checkpoint_dir)", "--checkpoint-dir: where kv.save_checkpoint() writes ckpt-<n> and where a restart looks for the latest"),
    "PSKV_RESUME_FROM": ("every process (ClusterConfig.resume_from)", "after a restart (--max-restarts): the latest complete checkpoint under --checkpoint-dir, if any"),
    "PSKV_RESTART_COUNT": ("every process (ClusterConfig.restart_count)", "after a restart: how many times the job was restarted (1, 2, ...)"),
    "PSKV_RECOVERY_TIMEOUT": ("every process (ClusterConfig.recovery_timeout)", "with --restart-workers: seconds a dead worker's rank stays open for its replacement (--recovery-timeout)"),
    "PSKV_SERVER_RECOVERY": ("every process (ClusterConfig.server_recovery)", "with --restart-servers: 1 (a dead server may be replaced; workers keep their pushes since the newest checkpoint)"),
    "PSKV_MIN_WORKERS": ("every process (ClusterConfig.min_workers)", "an elastic job's (-n MIN:MAX) MIN: below it for PSKV_ELASTIC_TIMEOUT the job fails"),
    "PSKV_MAX_WORKERS": ("every process (ClusterConfig.max_workers)", "an elastic job's MAX; DMLC_WORKER_ID is then the worker's slot (never reused) and DMLC_NUM_WORKER the workers started first"),
    "PSKV_ELASTIC_TIMEOUT": ("every process (ClusterConfig.elastic_timeout)", "an elastic job's seconds below MIN before it fails (--elastic-timeout)"),
    "PSKV_LAUNCH_TOKEN": ("the scheduler (ClusterConfig.launch_token)", "an elastic job's token, which the launcher's reports of worker exits carry (ROSTER)"),
    "PSKV_JOB_ID": ("servers (ClusterConfig.job_id)", "a random id of this job: names its shared-memory files so the launcher can remove them"),
    "PYTHONUNBUFFERED": ("Python", "1, so output reaches the launcher line by line (the launcher's: an --env pair naming it is refused)"),
    # torchrun's variables, so torch.distributed (and pskv.config.rank_env) work in a launched worker
    "RANK": ("workers (torch.distributed, rank_env)", "the worker's rank, as DMLC_WORKER_ID"),
    "WORLD_SIZE": ("workers (torch.distributed, rank_env)", "the number of workers, as DMLC_NUM_WORKER"),
    "LOCAL_RANK": ("workers (torch.distributed, rank_env)", "the worker's index on its host, as PSKV_LOCAL_RANK"),
    "LOCAL_WORLD_SIZE": ("workers (rank_env)", "the number of workers on the worker's host"),
    "MASTER_ADDR": ("workers (torch.distributed, rank_env)", "worker 0's host"),
    "MASTER_PORT": ("workers (torch.distributed, rank_env)", "locally a free port on 127.0.0.1; over ssh, srun and mpirun the scheduler's port + 1 (- 1 for 65535); never the scheduler's"),
}

# Role-specific variables: unset (`env -u`) in the processes they do not belong to.
_ROLE_ONLY = ("DMLC_WORKER_ID", "PSKV_LOCAL_RANK", "PSKV_SERVER_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PSKV_LAUNCH_TOKEN")
# Before a worker's command: OMP_NUM_THREADS = max(1, CPUs of its host // workers there) unless already set
# (torchrun's rule), computed where the worker runs (nproc counts the CPUs it may use).
_OMP_SHARE = ('[ -n "${OMP_NUM_THREADS-}" ] || { n=$(( $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN) '
              '/ ${LOCAL_WORLD_SIZE:-1} )); [ "$n" -ge 1 ] || n=1; OMP_NUM_THREADS=$n; export OMP_NUM_THREADS; }; '
              'exec "$@"')
ROLE_ORDER = ("scheduler", "server", "worker")


@dataclass(frozen=True)
class JobLayout:
    """What every process of one job is told about the job as a whole."""

    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    job_id: str = ""
    curve_key_file: str = ""
    checkpoint_dir: str = ""
    resume_from: str = ""
    restart_count: int = 0
    recovery_timeout: float = 0.0
    server_recovery: bool = False
    master_addr: str = ""  # the workers' MASTER_ADDR (see with_workers); "": no torchrun variables
    master_port: int = 0
    workers_on: tuple[tuple[str, int], ...] = ()  # (host, workers there): the workers' LOCAL_WORLD_SIZE
    min_workers: int = 0  # an elastic job's bounds (-n MIN:MAX); max_workers 0: not elastic
    max_workers: int = 0
    elastic_timeout: float = 600.0
    launch_token: str = ""  # an elastic job's: the scheduler's alone


def with_workers(layout: JobLayout, worker_hosts: Sequence[str], master_port: int) -> JobLayout:
    """``layout`` with the workers' torchrun variables: MASTER_ADDR worker 0's host, ``master_port``,
    and each host's count of workers (``worker_hosts[rank]`` is worker ``rank``'s host)."""
    counts: dict[str, int] = {}
    for host in worker_hosts:
        counts[host] = counts.get(host, 0) + 1
    return dataclasses.replace(layout, master_addr=worker_hosts[0] if worker_hosts else "", master_port=master_port,
                               workers_on=tuple(counts.items()))


def omp_note(extra: Mapping[str, str], set_here: bool, workers_here: int = 0, cpus_here: int = 0) -> str | None:
    """The launcher's one line about the workers' ``OMP_NUM_THREADS`` (None when the user set it).

    Args:
        extra: the ``--env`` pairs.
        set_here: ``OMP_NUM_THREADS`` is set in the launcher's environment
            (:func:`pskv.config.omp_num_threads_set`; local workers inherit it).
        workers_here: a job whose workers all run on this machine: their number (else 0).
        cpus_here: with ``workers_here``, the CPUs this process may use.
    """
    if "OMP_NUM_THREADS" in extra or set_here:
        return None
    choose = "set OMP_NUM_THREADS (or --env OMP_NUM_THREADS=N) to choose"
    if workers_here and cpus_here:
        return (f"each worker gets OMP_NUM_THREADS={max(1, cpus_here // workers_here)} ({cpus_here} CPUs // "
                f"{workers_here} worker{'s' if workers_here > 1 else ''} on this host), as torchrun does; {choose}")
    return (f"each worker gets OMP_NUM_THREADS = max(1, CPUs of its host // workers there) where it is not set, "
            f"as torchrun does; {choose}")


def port_beside(port: int) -> int:
    """A port next to ``port`` (+1, or -1 for 65535): the MASTER_PORT of a job whose scheduler is on ``port``
    where the launcher cannot look for a free one (another host)."""
    return port + 1 if port < 65535 else port - 1


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start.

    Attributes:
        role: ``'scheduler'``, ``'server'`` or ``'worker'``.
        rank: the server or worker rank (None for the scheduler).
        host: where it runs (reported in messages; ssh's target).
        argv: the local command that starts it.
    """

    role: str
    rank: int | None
    host: str
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        """``'worker 1'``, ``'server 0'`` or ``'scheduler'``."""
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    @property
    def is_worker(self) -> bool:
        """True for workers (their exit codes decide the job's)."""
        return self.role == "worker"


def contract_env(layout: JobLayout, role: str, host: str, rank: int | None = None,
                 local_rank: int | None = None) -> dict[str, str]:
    """The contract variables of one process.

    Args:
        layout: the job's scheduler address and sizes.
        role: ``'scheduler'``, ``'server'`` or ``'worker'``.
        host: the process's host (its ``DMLC_NODE_HOST``).
        rank: workers and servers: the rank.
        local_rank: workers: the index among the workers on ``host``.

    Raises:
        ValueError: a worker without rank and local rank, or an unknown role.
    """
    if role not in ROLE_ORDER:
        raise ValueError(f"unknown role {role!r}")
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": layout.root_uri,
        "DMLC_PS_ROOT_PORT": str(layout.root_port),
        "DMLC_NUM_SERVER": str(layout.num_servers),
        "DMLC_NUM_WORKER": str(layout.num_workers),
        "DMLC_NODE_HOST": host,
        "PYTHONUNBUFFERED": "1",
    }
    if layout.job_id:
        env["PSKV_JOB_ID"] = layout.job_id
    if layout.curve_key_file:
        env["PSKV_CURVE_KEY_FILE"] = layout.curve_key_file
    if layout.checkpoint_dir:
        env["PSKV_CHECKPOINT_DIR"] = layout.checkpoint_dir
    if layout.resume_from:
        env["PSKV_RESUME_FROM"] = layout.resume_from
    if layout.restart_count:
        env["PSKV_RESTART_COUNT"] = str(layout.restart_count)
    if layout.recovery_timeout > 0:
        env["PSKV_RECOVERY_TIMEOUT"] = f"{layout.recovery_timeout:g}"
    if layout.server_recovery:
        env["PSKV_SERVER_RECOVERY"] = "1"
    env.update(_elastic_env(layout, role))
    if role == "server" and rank is not None:
        env["PSKV_SERVER_RANK"] = str(rank)
    if role == "worker":
        if rank is None or local_rank is None:
            raise ValueError("a worker needs a rank and a local rank")
        env["DMLC_WORKER_ID"] = str(rank)
        env["PSKV_LOCAL_RANK"] = str(local_rank)
        if layout.master_addr:
            env.update(RANK=str(rank), WORLD_SIZE=str(layout.num_workers), LOCAL_RANK=str(local_rank),
                       LOCAL_WORLD_SIZE=str(dict(layout.workers_on).get(host, 1)), MASTER_ADDR=layout.master_addr,
                       MASTER_PORT=str(layout.master_port))
    return env


def _elastic_env(layout: JobLayout, role: str) -> dict[str, str]:
    """An elastic job's variables: the bounds for every process, the launch token for the scheduler."""
    if not layout.max_workers:
        return {}
    env = {"PSKV_MIN_WORKERS": str(layout.min_workers), "PSKV_MAX_WORKERS": str(layout.max_workers),
           "PSKV_ELASTIC_TIMEOUT": f"{layout.elastic_timeout:g}"}
    if role == "scheduler":
        env["PSKV_LAUNCH_TOKEN"] = layout.launch_token
    return env


def env_argv(contract: Mapping[str, str], extra: Mapping[str, str], command: Sequence[str]) -> list[str]:
    """``env [-u NAME]... NAME=VALUE... COMMAND...``: ``command`` with this environment.

    Args:
        contract: the process's contract variables (from :func:`contract_env`).
        extra: the ``--env`` pairs; none names a contract variable (validated by
            :class:`~pskv.launch.config.LaunchConfig`).
        command: the program and its arguments.

    A worker with the torchrun variables (``LOCAL_WORLD_SIZE``) runs its command through
    ``sh -c``, which sets ``OMP_NUM_THREADS`` to max(1, CPUs // workers on its host) unless
    it is already set (in the process's environment or an ``--env`` pair), as torchrun does.
    """
    argv = ["env"]
    for name in _ROLE_ONLY:
        if name not in contract:
            argv += ["-u", name]
    merged = {**contract, **extra}
    argv += [f"{name}={value}" for name, value in merged.items()]
    if contract.get("DMLC_ROLE") == "worker" and "LOCAL_WORLD_SIZE" in contract:
        argv += ["sh", "-c", _OMP_SHARE, "sh"]  # OMP_NUM_THREADS where the worker runs, unless set
    return argv + list(command)


def role_argv(python: str, role: str, port_file: str | None = None) -> list[str]:
    """The command of a pskv role: ``PYTHON -m pskv ROLE [--port-file FILE]``."""
    argv = [python, "-m", "pskv", role]
    return argv + ["--port-file", port_file] if port_file else argv
