"""The launch configuration: what ``pskv launch`` was asked to run, validated up front.

Every check happens here, before any process starts, so a bad command line fails with
one clear message and nothing to clean up.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pskv.errors import InvalidArgumentError
from pskv.launch.contract import CONTRACT, JobLayout
from pskv.transport.security import read_key_file

__all__ = ["LAUNCHERS", "REMOTE_LAUNCHERS", "DEFAULT_SSH_PORT", "LaunchConfig", "parse_env_pairs"]

LAUNCHERS = ("local", "ssh", "slurm", "mpi")
REMOTE_LAUNCHERS = ("ssh", "slurm", "mpi")  # the launchers that place processes on hosts
DEFAULT_SSH_PORT = 9091  # the scheduler port of ssh jobs (ps-lite examples use 9091 too)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``['K=V', ...]`` (the ``--env`` flags) as a dict; a later pair wins.

    Raises:
        InvalidArgumentError: a pair has no ``=``, or its name is not a valid variable name.
    """
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidArgumentError(f"--env {pair!r}: expected NAME=VALUE")
        if not _ENV_NAME.match(name):
            raise InvalidArgumentError(f"--env {pair!r}: {name!r} is not a valid environment variable name")
        env[name] = value
    return env


@dataclass(frozen=True)
class LaunchConfig:
    """One ``pskv launch`` job.

    Attributes:
        num_workers: worker processes (each runs ``command``).
        num_servers: server processes; 0: none and no scheduler (workers only, for a job that uses
            only an all-reduce store such as ``horovod``).
        command: the worker command line (program and arguments).
        launcher: ``'local'`` (every process on this machine, loopback only), ``'ssh'``,
            ``'slurm'`` (each process a job step, ``srun``) or ``'mpi'`` (each through ``mpirun``).
        hostfile: ssh, slurm, mpi: the file listing the hosts (``host [slots]`` per line), or a
            host list ``host1:2,host2:2`` (horovodrun's ``-H``) when no such file exists and the value has a
            ``:`` or ``,`` (a value with neither is always a file); slurm
            without it: the allocation's hosts.
        server_hostfile: ssh, slurm, mpi: a file of dedicated server hosts (``--server-hostfile``,
            the hostfile's syntax, slots ignored): server ``i`` runs on its entry ``i mod
            len``; None: the servers run on the hostfile's hosts, with the workers.
        env: extra variables for every process (``--env``); they may not name a
            variable of the launch contract, which the launcher owns.
        timeout: seconds each run of the job may take (None: no limit), counted from the start of its
            processes: over ssh after the preflight, for an elastic job after its first discovery;
            a restart (``max_restarts``) gets it anew.
        port: the scheduler's port (``--port``): on the first host with ssh, slurm, mpi (None: 9091,
            :data:`DEFAULT_SSH_PORT`); on 127.0.0.1 locally (None: a free port the scheduler picks).
        startup_timeout: local: seconds to wait for the scheduler to publish its port; ssh:
            seconds the preflight of the hosts may take; slurm, mpi: not used.
        stop_grace: seconds between the stop signal (SIGTERM) and SIGKILL.
        exit_grace: seconds servers and scheduler may take to exit after the last worker.
        python: the interpreter that runs the server and scheduler roles.
        cwd: ssh only: the directory remote processes start in (default: this one).
        ssh_command: ssh only: the remote-shell program and its options (``--ssh-command``,
            split as a shell would), called as ``SSH_COMMAND -o BatchMode=yes HOST COMMAND``.
        launcher_command: slurm / mpi only: the ``srun`` / ``mpirun`` program and its options
            (``--launcher-command``, split as a shell would); empty: ``srun`` / ``mpirun``.
        log_dir: ``--log-dir``: one file per process there (``worker-1.log``; a restart
            appends); the terminal gets only the launcher's lines unless ``tee``. Empty: none.
        tee: ``--tee``: with ``log_dir``, the processes' output also goes to the terminal.
        curve_key_file: a CURVE cluster key file every process uses (``--curve-key``;
            over ssh it must exist at the same path on every host).
        secure: local only: make a fresh cluster key for this job (``--secure``).
        checkpoint_dir: ``--checkpoint-dir``: where ``kv.save_checkpoint()`` writes and
            where a restart looks for the latest complete checkpoint (a shared file
            system across hosts).
        max_restarts: ``--max-restarts``: after a failure, start the whole job again (at
            most this many times), resuming from the latest checkpoint if there is one.
        worker_restarts: ``--restart-workers``: a failed worker is started again alone (at
            most this many times in all) and rejoins the running job; every process
            then gets ``PSKV_RECOVERY_TIMEOUT``.
        server_restarts: ``--restart-servers``: a failed server is started again alone (at
            most this many times in all), loads the newest checkpoint and rejoins; every
            process then gets ``PSKV_SERVER_RECOVERY=1`` (workers keep their pushes since
            the newest checkpoint; no shared memory). Local launcher only.
        recovery_timeout: ``--recovery-timeout``: seconds a dead worker's or server's rank
            stays open for its replacement.
        resume_from: the checkpoint this run resumes from (set for restarts).
        restart_count: how many times the job has been restarted (set for restarts).
        address_file: ``--address-file``: where the launcher writes the scheduler's
            ``HOST:PORT`` (local: once it listens; ssh: at the start) for ``pskv top
            --port-file``; empty: nowhere.
        min_workers, max_workers: an elastic job's bounds (``-n MIN:MAX``; :mod:`pskv.launch.elastic`):
            workers join and leave at commits; ``max_workers`` 0: not elastic. ``num_workers`` is
            then the number started first.
        host_discovery_script: ``--host-discovery-script``: prints ``HOST:SLOTS`` lines, run every
            ``discovery_interval`` seconds; empty: the hosts' slots (``hostfile``'s or the allocation's), or
            locally this machine with ``max_workers`` slots.
        elastic_timeout: ``--elastic-timeout``: seconds an elastic job may stay below ``min_workers``.
        respawn_cooldown: ``--respawn-cooldown``: seconds a departed worker's place on its host stays
            unused before a new worker (a fresh slot number) may take it.
        drain_timeout: ``--drain-timeout``: seconds a drained worker may take to leave (its next commit) before
            it is stopped (a departure).

    Raises:
        InvalidArgumentError: any field is out of range or inconsistent with the others.
    """

    num_workers: int
    num_servers: int
    command: tuple[str, ...]
    launcher: str = "local"
    hostfile: str | None = None
    server_hostfile: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    port: int | None = None
    startup_timeout: float = 60.0
    stop_grace: float = 5.0
    exit_grace: float = 30.0
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)
    ssh_command: str = "ssh"
    launcher_command: str = ""
    log_dir: str = ""
    tee: bool = False
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    curve_key_file: str = ""
    secure: bool = False
    checkpoint_dir: str = ""
    max_restarts: int = 0
    worker_restarts: int = 0
    server_restarts: int = 0
    recovery_timeout: float = 60.0
    resume_from: str = ""
    restart_count: int = 0
    address_file: str = ""
    min_workers: int = 0
    max_workers: int = 0
    host_discovery_script: str = ""
    discovery_interval: float = 1.0
    elastic_timeout: float = 600.0
    respawn_cooldown: float = 10.0
    drain_timeout: float = 60.0
    launch_token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @property
    def elastic(self) -> bool:
        """An elastic job (``-n MIN:MAX``)."""
        return self.max_workers > 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))
        problems = list(self._problems())
        if problems:
            raise InvalidArgumentError("; ".join(problems))

    def layout(self, root_uri: str, root_port: int) -> JobLayout:
        """What every process of this job is told about it, for a scheduler at ``root_uri:root_port``."""
        return JobLayout(root_uri, root_port, self.num_servers, self.num_workers, self.job_id, self.curve_key_file,
                         self.checkpoint_dir, self.resume_from, self.restart_count,
                         self.recovery_timeout if self.worker_restarts > 0 or self.server_restarts > 0 else 0.0,
                         self.server_restarts > 0, min_workers=self.min_workers, max_workers=self.max_workers,
                         elastic_timeout=self.elastic_timeout, launch_token=self.launch_token if self.elastic else "")

    def _problems(self) -> Sequence[str]:
        """Every problem of this configuration, in the order of :data:`_CHECKS`."""
        return [problem for check in _CHECKS for problem in check(self)]


# -- the checks ------------------------------------------------------------------------
# One row per rule: a (condition, message) pair made a check by _rule, or a function for the
# rules that loop or catch; rows of one former if/elif chain exclude each other by condition.
# The order is the order of the messages.
_Check = Callable[[LaunchConfig], Iterable[str]]


def _rule(failed: Callable[[LaunchConfig], object], message: Callable[[LaunchConfig], str]) -> _Check:
    """A check that gives ``message(config)`` when ``failed(config)`` is true."""
    return lambda config: [message(config)] if failed(config) else []


def _split_problems(config: LaunchConfig) -> Iterator[str]:
    """``--launcher-command`` and ``--ssh-command`` split as a shell would, and not empty."""
    for flag, text, used in (("--launcher-command", config.launcher_command, bool(config.launcher_command)),
                             ("--ssh-command", config.ssh_command, True)):
        try:
            if used and not shlex.split(text):
                yield f"{flag} is empty"
        except ValueError as exc:
            yield f"{flag} {text!r}: {exc}"


def _env_problems(config: LaunchConfig) -> Iterator[str]:
    """``--env`` names: valid, and none the launcher sets itself."""
    for name in config.env:
        if not _ENV_NAME.match(name):
            yield f"--env: {name!r} is not a valid environment variable name"
        elif name in CONTRACT:
            yield f"--env: {name} is set by the launcher ({CONTRACT[name][1]})"


def _grace_problems(config: LaunchConfig) -> Iterator[str]:
    """``--stop-grace`` and ``--exit-grace`` not negative, and finite (``inf`` or ``nan`` would never end a stop)."""
    for name in ("stop_grace", "exit_grace"):
        if not 0 <= getattr(config, name) < float("inf"):
            yield f"--{name.replace('_', '-')} must be >= 0 seconds (finite), got {getattr(config, name):g}"


def _key_problems(config: LaunchConfig) -> Iterator[str]:
    """``--secure`` or ``--curve-key``, and the key readable before anything starts: every process
    would refuse it (over ssh: checked here if present)."""
    if config.secure and config.curve_key_file:
        yield "give --secure (a fresh key) or --curve-key FILE, not both"
    elif config.curve_key_file and (config.launcher == "local" or os.path.exists(config.curve_key_file)):
        try:
            read_key_file(config.curve_key_file)
        except InvalidArgumentError as exc:
            yield f"--curve-key: {exc}"


def _elastic_problems(config: LaunchConfig) -> Iterator[str]:
    """``-n MIN:MAX``: 1 <= MIN <= W <= MAX, and none of what an elastic job cannot do."""
    if not config.elastic:
        if config.host_discovery_script:
            yield "--host-discovery-script needs an elastic job (-n MIN:MAX)"
        return
    if not 1 <= config.min_workers <= config.num_workers <= config.max_workers:
        yield (f"-n MIN:MAX needs 1 <= MIN <= MAX, and MIN to MAX workers to start; got MIN {config.min_workers}, "
               f"MAX {config.max_workers}, {config.num_workers} to start")
    for flag, used in (("--restart-workers", config.worker_restarts), ("--restart-servers", config.server_restarts),
                       ("--max-restarts", config.max_restarts), ("-s 0", config.num_servers == 0)):
        if used:
            yield f"{flag} does not go with an elastic job (-n MIN:MAX): its servers keep the model as workers come and go"
    if config.launcher == "mpi":
        yield "an elastic job (-n MIN:MAX) runs with --launcher local, ssh or slurm, not mpi (mpirun's ranks are fixed)"
    for flag, value in (("--discovery-interval", config.discovery_interval), ("--elastic-timeout", config.elastic_timeout),
                        ("--drain-timeout", config.drain_timeout)):
        if not value > 0:
            yield f"{flag} must be > 0 seconds, got {value:g}"
    if config.respawn_cooldown < 0:
        yield f"--respawn-cooldown must be >= 0 seconds, got {config.respawn_cooldown:g}"


_CHECKS: tuple[_Check, ...] = (
    _rule(lambda c: c.num_workers < 1, lambda c: f"-n/--num-workers must be >= 1, got {c.num_workers}"),
    _rule(lambda c: c.num_servers < 0,
          lambda c: f"-s/--num-servers must be >= 0 (0: workers only, no scheduler), got {c.num_servers}"),
    _rule(lambda c: c.num_servers == 0 and c.address_file,
          lambda c: "--address-file names the scheduler's address, and -s 0 starts no scheduler"),
    _rule(lambda c: not c.command or not c.command[0],
          lambda c: "no worker command given (put it after --, e.g. pskv launch -n 2 -- python train.py)"),
    # env(1) starts every process and would take it for an assignment.
    _rule(lambda c: c.command and "=" in c.command[0],
          lambda c: f"the command's program {c.command[0]!r} contains '='; name it by a path without '='"),
    _rule(lambda c: c.launcher not in LAUNCHERS,
          lambda c: f"--launcher must be one of {', '.join(LAUNCHERS)}, got {c.launcher!r}"),
    _rule(lambda c: c.launcher in ("ssh", "mpi") and not c.hostfile,
          lambda c: f"--launcher {c.launcher} needs a hostfile (-H FILE) or a host list (-H HOST:SLOTS,...)"),
    _rule(lambda c: c.launcher == "local" and c.hostfile,
          lambda c: "-H/--hostfile only applies to --launcher ssh, slurm or mpi"),
    _rule(lambda c: c.server_hostfile is not None and c.launcher not in REMOTE_LAUNCHERS,
          lambda c: "--server-hostfile only applies to --launcher ssh, slurm or mpi"),
    _rule(lambda c: c.server_hostfile == "" and c.launcher in REMOTE_LAUNCHERS,
          lambda c: "--server-hostfile needs a file name"),
    _rule(lambda c: c.launcher != "ssh" and c.ssh_command != "ssh",
          lambda c: "--ssh-command only applies to --launcher ssh"),
    _rule(lambda c: c.launcher_command and c.launcher not in ("slurm", "mpi"),
          lambda c: "--launcher-command only applies to --launcher slurm or mpi"),
    _split_problems,
    _env_problems,
    _rule(lambda c: c.tee and not c.log_dir,
          lambda c: "--tee needs --log-dir (without it all output goes to the terminal)"),
    _rule(lambda c: c.timeout is not None and not c.timeout > 0,
          lambda c: f"--timeout must be > 0 seconds, got {c.timeout:g}"),
    _rule(lambda c: c.port is not None and not 0 < c.port < 65536,
          lambda c: f"--port must be a TCP port (1-65535), got {c.port}"),
    _rule(lambda c: not c.startup_timeout > 0,
          lambda c: f"--startup-timeout must be > 0 seconds, got {c.startup_timeout:g}"),
    _grace_problems,
    _rule(lambda c: not c.python, lambda c: "--python must name an interpreter"),
    _key_problems,
    _rule(lambda c: c.server_restarts < 0, lambda c: f"--restart-servers must be >= 0, got {c.server_restarts}"),
    _rule(lambda c: c.server_restarts > 0 and not c.checkpoint_dir,
          lambda c: "--restart-servers needs --checkpoint-dir (a replacement server loads the newest checkpoint)"),
    _rule(lambda c: c.server_restarts > 0 and c.checkpoint_dir and c.launcher != "local",
          lambda c: "--restart-servers works with the local launcher only"),
    _rule(lambda c: c.worker_restarts < 0, lambda c: f"--restart-workers must be >= 0, got {c.worker_restarts}"),
    _rule(lambda c: not c.recovery_timeout > 0,
          lambda c: f"--recovery-timeout must be > 0 seconds, got {c.recovery_timeout:g}"),
    _rule(lambda c: c.max_restarts < 0, lambda c: f"--max-restarts must be >= 0, got {c.max_restarts}"),
    _rule(lambda c: c.secure and c.launcher != "local",
          lambda c: "--secure makes a key on this machine only; over ssh use --curve-key FILE (see docs/security.md)"),
    _elastic_problems,
)
