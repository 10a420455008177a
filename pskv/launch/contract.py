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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CONTRACT", "ROLE_ORDER", "ProcessSpec", "JobLayout", "contract_env", "env_argv", "role_argv"]

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
    "PSKV_JOB_ID": ("servers (ClusterConfig.job_id)", "a random id of this job: names its shared-memory files so the launcher can remove them"),
    "PYTHONUNBUFFERED": ("Python", "1, so output reaches the launcher line by line (an --env pair may override it)"),
}

# Role-specific variables: unset (`env -u`) in the processes they do not belong to.
_ROLE_ONLY = ("DMLC_WORKER_ID", "PSKV_LOCAL_RANK", "PSKV_SERVER_RANK")
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
    if role == "server" and rank is not None:
        env["PSKV_SERVER_RANK"] = str(rank)
    if role == "worker":
        if rank is None or local_rank is None:
            raise ValueError("a worker needs a rank and a local rank")
        env["DMLC_WORKER_ID"] = str(rank)
        env["PSKV_LOCAL_RANK"] = str(local_rank)
    return env


def env_argv(contract: Mapping[str, str], extra: Mapping[str, str], command: Sequence[str]) -> list[str]:
    """``env [-u NAME]... NAME=VALUE... COMMAND...``: ``command`` with this environment.

    Args:
        contract: the process's contract variables (from :func:`contract_env`).
        extra: the ``--env`` pairs; they override ``PYTHONUNBUFFERED`` but (validated
            by :class:`~pskv.launch.config.LaunchConfig`) no other contract variable.
        command: the program and its arguments.
    """
    argv = ["env"]
    for name in _ROLE_ONLY:
        if name not in contract:
            argv += ["-u", name]
    merged = {**contract, **extra}
    argv += [f"{name}={value}" for name, value in merged.items()]
    return argv + list(command)


def role_argv(python: str, role: str, port_file: str | None = None) -> list[str]:
    """The command of a pskv role: ``PYTHON -m pskv ROLE [--port-file FILE]``."""
    argv = [python, "-m", "pskv", role]
    return argv + ["--port-file", port_file] if port_file else argv
