"""The launch configuration: what ``pskv launch`` was asked to run, validated up front.

Every check happens here, before any process starts, so a bad command line fails with
one clear message and nothing to clean up.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
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
            host list ``host1:2,host2:2`` (horovodrun's ``-H``) when no such file exists; slurm
            without it: the allocation's hosts.
        server_hostfile: ssh only: a file of dedicated server hosts (``--server-hostfile``,
            the hostfile's syntax, slots ignored): server ``i`` runs on its entry ``i mod
            len``; None: the servers run on the hostfile's hosts, with the workers.
        env: extra variables for every process (``--env``); they may not name a
            variable of the launch contract, which the launcher owns.
        timeout: seconds the whole job may take (None: no limit).
        port: the scheduler's port (``--port``): on the first host over ssh (None: 9091,
            :data:`DEFAULT_SSH_PORT`); on 127.0.0.1 locally (None: a free port the scheduler picks).
        startup_timeout: local: seconds to wait for the scheduler to publish its port; ssh:
            seconds the preflight of the hosts may take.
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
                         self.server_restarts > 0)

    def _problems(self) -> Sequence[str]:
        out = []
        if self.num_workers < 1:
            out.append(f"-n/--num-workers must be >= 1, got {self.num_workers}")
        if self.num_servers < 0:
            out.append(f"-s/--num-servers must be >= 0 (0: workers only, no scheduler), got {self.num_servers}")
        elif self.num_servers == 0 and self.address_file:
            out.append("--address-file names the scheduler's address, and -s 0 starts no scheduler")
        if not self.command or not self.command[0]:
            out.append("no worker command given (put it after --, e.g. pskv launch -n 2 -- python train.py)")
        elif "=" in self.command[0]:
            # env(1) starts every process and would take it for an assignment.
            out.append(f"the command's program {self.command[0]!r} contains '='; name it by a path without '='")
        if self.launcher not in LAUNCHERS:
            out.append(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        elif self.launcher in ("ssh", "mpi") and not self.hostfile:
            out.append(f"--launcher {self.launcher} needs a hostfile (-H FILE) or a host list (-H HOST:SLOTS,...)")
        elif self.launcher == "local" and self.hostfile:
            out.append("-H/--hostfile only applies to --launcher ssh, slurm or mpi")
        if self.server_hostfile is not None and self.launcher not in REMOTE_LAUNCHERS:
            out.append("--server-hostfile only applies to --launcher ssh, slurm or mpi")
        elif self.server_hostfile is not None and not self.server_hostfile:
            out.append("--server-hostfile needs a file name")
        if self.launcher != "ssh" and self.ssh_command != "ssh":
            out.append("--ssh-command only applies to --launcher ssh")
        if self.launcher_command and self.launcher not in ("slurm", "mpi"):
            out.append("--launcher-command only applies to --launcher slurm or mpi")
        try:
            if self.launcher_command and not shlex.split(self.launcher_command):
                out.append("--launcher-command is empty")
        except ValueError as exc:
            out.append(f"--launcher-command {self.launcher_command!r}: {exc}")
        try:
            if not shlex.split(self.ssh_command):
                out.append("--ssh-command is empty")
        except ValueError as exc:
            out.append(f"--ssh-command {self.ssh_command!r}: {exc}")
        for name in self.env:
            if not _ENV_NAME.match(name):
                out.append(f"--env: {name!r} is not a valid environment variable name")
            elif name in CONTRACT:
                out.append(f"--env: {name} is set by the launcher ({CONTRACT[name][1]})")
        if self.tee and not self.log_dir:
            out.append("--tee needs --log-dir (without it all output goes to the terminal)")
        if self.timeout is not None and not self.timeout > 0:
            out.append(f"--timeout must be > 0 seconds, got {self.timeout:g}")
        if self.port is not None and not 0 < self.port < 65536:
            out.append(f"--port must be a TCP port (1-65535), got {self.port}")
        if not self.startup_timeout > 0:
            out.append(f"--startup-timeout must be > 0 seconds, got {self.startup_timeout:g}")
        for name in ("stop_grace", "exit_grace"):
            if getattr(self, name) < 0:
                out.append(f"--{name.replace('_', '-')} must be >= 0 seconds, got {getattr(self, name):g}")
        if not self.python:
            out.append("--python must name an interpreter")
        if self.secure and self.curve_key_file:
            out.append("give --secure (a fresh key) or --curve-key FILE, not both")
        elif self.curve_key_file and (self.launcher == "local" or os.path.exists(self.curve_key_file)):
            try:  # before anything starts: every process would refuse it (over ssh: checked here if present)
                read_key_file(self.curve_key_file)
            except InvalidArgumentError as exc:
                out.append(f"--curve-key: {exc}")
        if self.server_restarts < 0:
            out.append(f"--restart-servers must be >= 0, got {self.server_restarts}")
        elif self.server_restarts and not self.checkpoint_dir:
            out.append("--restart-servers needs --checkpoint-dir (a replacement server loads the newest checkpoint)")
        elif self.server_restarts and self.launcher != "local":
            out.append("--restart-servers works with the local launcher only")
        if self.worker_restarts < 0:
            out.append(f"--restart-workers must be >= 0, got {self.worker_restarts}")
        if not self.recovery_timeout > 0:
            out.append(f"--recovery-timeout must be > 0 seconds, got {self.recovery_timeout:g}")
        if self.max_restarts < 0:
            out.append(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.secure and self.launcher != "local":
            out.append("--secure makes a key on this machine only; over ssh use --curve-key FILE (see docs/security.md)")
        return out
