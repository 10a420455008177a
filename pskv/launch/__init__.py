"""``pskv launch``: start a whole job (scheduler, servers, workers) and supervise it.

::

    pskv launch -n 2 -s 1 -- python train.py          # everything on this machine
    pskv launch -n 8 -s 4 --launcher ssh -H hosts -- python train.py

Modules, bottom up:

* :mod:`~pskv.launch.contract` — the environment each process gets (the launch contract);
* :mod:`~pskv.launch.config` — :class:`LaunchConfig`, the validated request;
* :mod:`~pskv.launch.console` — the terminal and the log files (``--log-dir``, ``--tee``);
* :mod:`~pskv.launch.supervisor` — starting, output streaming, root cause, stopping;
* :mod:`~pskv.launch.on_host` / :mod:`~pskv.launch.ssh` — where the processes run.

The user guide is ``docs/launch.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import uuid
from collections.abc import Sequence

from pskv.checkpoints import restart_checkpoint
from pskv.config import log_level_from_env
from pskv.errors import CheckpointError, InvalidArgumentError, LaunchError
from pskv.launch.config import DEFAULT_SSH_PORT, LAUNCHERS, LaunchConfig, parse_env_pairs
from pskv.launch.console import Console
from pskv.launch.contract import CONTRACT
from pskv.launch.mpi import run_mpi
from pskv.launch.on_host import run_local
from pskv.launch.slurm import run_slurm
from pskv.launch.ssh import run_ssh
from pskv.launch.supervisor import EXIT_FAILURE
from pskv.transport.shm import remove_job_files

__all__ = ["CONTRACT", "DESCRIPTION", "LaunchConfig", "add_arguments", "config_from_args", "launch", "main", "run_args"]

USAGE_ERROR = 2  # as argparse
DESCRIPTION = "Start a pskv job (scheduler, servers, workers) and supervise it; see docs/launch.md."


def launch(config: LaunchConfig, console: Console | None = None) -> int:
    """Run the job ``config`` describes until it ends; returns the launcher's exit code.

    Args:
        config: the job.
        console: where output and messages go (default: this process's stdout / stderr).

    Raises:
        InvalidArgumentError: the hostfile is unreadable or malformed (nothing was started).
    """
    if console is None:
        console = Console(sys.stdout.buffer, sys.stderr, log_dir=config.log_dir, tee=config.tee)
    attempt = config
    while True:
        try:
            code = _RUNNERS[attempt.launcher](attempt, console)
        finally:
            # servers killed hard (SIGKILL, a crash) cannot remove their shared-memory files
            remove_job_files(attempt.job_id)
        restarts = attempt.restart_count
        if code == 0 or console.stop_requested or restarts >= config.max_restarts:
            if code != 0 and restarts and not console.stop_requested:
                console.note(f"giving up after {restarts} restart(s) (--max-restarts {config.max_restarts})")
            return code
        try:  # a damaged checkpoint is skipped with a note; if every one is, the job stops here
            found = restart_checkpoint(config.checkpoint_dir, console.note) if config.checkpoint_dir else None
        except CheckpointError as exc:
            console.note(f"giving up: {exc}")
            return code
        console.note(f"restarting the job ({restarts + 1} of at most {config.max_restarts}) "
                     + (f"from checkpoint {found}" if found else "from the beginning (no complete checkpoint)"))
        attempt = dataclasses.replace(config, job_id=uuid.uuid4().hex[:12], restart_count=restarts + 1,
                                      resume_from=str(found) if found else "")


_RUNNERS = {"local": run_local, "ssh": run_ssh, "slurm": run_slurm, "mpi": run_mpi}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``pskv launch`` options and the command to ``parser`` (in the order ``--help`` shows)."""
    _add_placement(parser)
    _add_timing(parser)
    _add_output_and_recovery(parser)
    _add_elastic(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker command, after --")


def _add_placement(parser: argparse.ArgumentParser) -> None:
    """The job's shape and where its processes run: -n, -s, --launcher, the hosts, --env."""
    parser.add_argument("-n", "--num-workers", type=_workers, required=True, metavar="W|MIN:MAX",
                        help="number of workers; MIN:MAX: an elastic job, workers join and leave while it runs "
                             "(docs/elastic.md)")
    parser.add_argument("-s", "--num-servers", type=int, default=None, metavar="S",
                        help="number of servers (default: W, as MXNet's launcher; with -n MIN:MAX: MAX); 0: workers only, "
                             "no scheduler (a job of all-reduce stores, e.g. horovod)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="local: everything on this machine, on 127.0.0.1 (default); ssh: on the hosts of -H; "
                             "slurm: inside an allocation, each process a job step (srun) on its hosts; mpi: each "
                             "process through mpirun on the hosts of -H")
    parser.add_argument("-H", "--hostfile", default=None, metavar="FILE|LIST",
                        help="ssh, slurm, mpi: the hosts: a file, one 'HOST [SLOTS]' per line, or a list "
                             "HOST:SLOTS,HOST:SLOTS as horovodrun's -H (a value with ':' or ',' that names no "
                             "existing file; any other value is a file: -H node1 reads the file node1); slurm: "
                             "default the allocation's")
    parser.add_argument("--server-hostfile", default=None, metavar="FILE",
                        help="ssh, slurm, mpi: dedicated server hosts (same syntax as -H, slots ignored); server i runs on "
                             "entry i mod len (default: servers share the -H hosts with the workers)")
    parser.add_argument("--ssh-command", default="ssh", metavar="CMD",
                        help="ssh only: the remote-shell program (and options) run as 'CMD -o BatchMode=yes HOST "
                             "COMMAND' (default: ssh)")
    parser.add_argument("--launcher-command", default="", metavar="CMD",
                        help="slurm / mpi: the srun / mpirun program and its options (e.g. 'srun --cpus-per-task=8'; "
                             "default: srun / mpirun)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set a variable in every process (repeatable)")


def _workers(text: str) -> tuple[int, int, int]:
    """``-n W`` or ``-n MIN:MAX``: (workers to start, MIN, MAX); MIN and MAX 0 when not elastic."""
    low, sep, high = text.partition(":")
    try:
        if not sep:
            return int(text), 0, 0
        return int(high), int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected W or MIN:MAX (numbers), got {text!r}") from None


def _add_elastic(parser: argparse.ArgumentParser) -> None:
    """An elastic job's options (``-n MIN:MAX``)."""
    parser.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                        help="elastic jobs: a command printing the hosts' 'HOST:SLOTS' lines, run every "
                             "--discovery-interval seconds (horovodrun's); default: the slots of -H (ssh, slurm), the "
                             "allocation's (slurm without -H), or this machine with MAX slots (local)")
    parser.add_argument("--discovery-interval", type=float, default=1.0, metavar="SECONDS",
                        help="elastic jobs: how often the discovery script runs (default 1)")
    parser.add_argument("--elastic-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="elastic jobs: how long the job may have fewer than MIN workers before it fails "
                             "(default 600)")
    parser.add_argument("--respawn-cooldown", type=float, default=10.0, metavar="SECONDS",
                        help="elastic jobs: how long a departed worker's place on its host stays unused before a new "
                             "worker (with a fresh slot number) takes it (default 10)")
    parser.add_argument("--drain-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="elastic jobs: how long a drained worker may take to leave (at its next commit) before "
                             "it is stopped (default 60)")


def _add_timing(parser: argparse.ArgumentParser) -> None:
    """The scheduler's port, the time limits and the interpreter of the roles."""
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop the job after this long (exit 124), counted from the start of its processes (ssh: after "
                             "the preflight; elastic: after the first discovery); a --max-restarts restart "
                             "gets it anew")
    parser.add_argument("--port", type=int, default=None,
                        help=f"the scheduler's port: ssh, slurm, mpi: on the first host (default {DEFAULT_SSH_PORT}); "
                             "local: on 127.0.0.1 (default: a free one)")
    parser.add_argument("--startup-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="local: how long the scheduler may take to get ready; ssh: how long the preflight "
                             "of the hosts may take; not used by slurm or mpi (default 60)")
    parser.add_argument("--stop-grace", type=float, default=5.0, metavar="SECONDS",
                        help="between SIGTERM and SIGKILL when stopping the job (default 5)")
    parser.add_argument("--exit-grace", type=float, default=30.0, metavar="SECONDS",
                        help="how long servers and scheduler may take to exit after the last worker (default 30)")
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="interpreter for the server and scheduler roles (default: this one)")


def _add_output_and_recovery(parser: argparse.ArgumentParser) -> None:
    """Logs, security, checkpoints and restarts, the address file and the timeline."""
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="write each process's output to DIR/<role>-<rank>.log (scheduler.log, server-0.log, "
                             "worker-1.log); the terminal then shows only the launcher's lines (see --tee)")
    parser.add_argument("--tee", action="store_true",
                        help="with --log-dir: show the processes' output on the terminal too")
    parser.add_argument("--curve-key", default=None, metavar="FILE",
                        help="authenticate and encrypt all traffic with this CURVE cluster key (pskv keygen); "
                             "over ssh the file must exist at the same path on every host")
    parser.add_argument("--secure", action="store_true",
                        help="local only: authenticate and encrypt with a fresh CURVE key made for this job")
    parser.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                        help="where kv.save_checkpoint() writes ckpt-<n> directories (PSKV_CHECKPOINT_DIR); "
                             "a restart resumes from the latest complete one")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="after a failure, start the whole job again, at most N times, from the latest "
                             "checkpoint in --checkpoint-dir; not once every worker exited 0 (default 0: no "
                             "restarts)")
    parser.add_argument("--restart-workers", type=int, default=0, metavar="N",
                        help="start a failed worker again alone, at most N times in all; it rejoins the running "
                             "job (kv.is_recovery) while the others wait for it (default 0)")
    parser.add_argument("--restart-servers", type=int, default=0, metavar="N",
                        help="local: start a failed server again alone, at most N times in all; it loads the newest "
                             "checkpoint in --checkpoint-dir and the workers send it their pushes since (default 0)")
    parser.add_argument("--recovery-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="with --restart-workers / --restart-servers: how long the others wait for a dead node's "
                             "replacement (default 60)")
    parser.add_argument("--address-file", default=None, metavar="FILE",
                        help="write the scheduler's HOST:PORT to FILE (local: once it listens; ssh, slurm, mpi: at the "
                             "start), "
                             "for pskv top --port-file FILE")
    parser.add_argument("--timeline", default=None, metavar="DIR",
                        help="every worker and server writes its timeline to DIR/<role>-<rank>.json (Chrome "
                             "trace-event JSON for chrome://tracing or ui.perfetto.dev; sets PSKV_TIMELINE)")


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The :class:`LaunchConfig` of parsed ``pskv launch`` arguments.

    Raises:
        InvalidArgumentError: a bad ``--env`` pair or an invalid combination of options.
    """
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.timeline:  # an --env pair: it reaches the processes over ssh too
        args.env = [*args.env, f"PSKV_TIMELINE={os.path.abspath(args.timeline)}"]
    workers, low, high = args.num_workers
    return LaunchConfig(
        num_workers=workers,
        num_servers=workers if args.num_servers is None else args.num_servers,
        command=tuple(command),
        launcher=args.launcher,
        hostfile=args.hostfile,
        server_hostfile=args.server_hostfile,
        ssh_command=args.ssh_command,
        launcher_command=args.launcher_command,
        log_dir=os.path.abspath(args.log_dir) if args.log_dir else "",
        tee=args.tee,
        env=_with_log_level(parse_env_pairs(args.env)),
        timeout=args.timeout,
        port=args.port,
        startup_timeout=args.startup_timeout,
        stop_grace=args.stop_grace,
        exit_grace=args.exit_grace,
        python=args.python,
        curve_key_file=os.path.abspath(args.curve_key) if args.curve_key else "",
        secure=args.secure,
        checkpoint_dir=os.path.abspath(args.checkpoint_dir) if args.checkpoint_dir else "",
        max_restarts=args.max_restarts,
        worker_restarts=args.restart_workers,
        server_restarts=args.restart_servers,
        recovery_timeout=args.recovery_timeout,
        address_file=os.path.abspath(args.address_file) if args.address_file else "",
        min_workers=low, max_workers=high, host_discovery_script=args.host_discovery_script or "",
        discovery_interval=args.discovery_interval, elastic_timeout=args.elastic_timeout,
        respawn_cooldown=args.respawn_cooldown, drain_timeout=args.drain_timeout,
    )


def _with_log_level(env: dict[str, str]) -> dict[str, str]:
    """The ``--env`` pairs plus this shell's ``PSKV_LOG_LEVEL`` (a remote login has not got it), both checked.

    Raises:
        InvalidArgumentError: a bad level (naming the variable).
    """
    if "PSKV_LOG_LEVEL" in env:
        log_level_from_env({"PSKV_LOG_LEVEL": env["PSKV_LOG_LEVEL"]})
    elif level := log_level_from_env():
        env["PSKV_LOG_LEVEL"] = level
    return env


def run_args(args: argparse.Namespace) -> int:
    """Validate parsed arguments and run the job; a usage error prints one line and returns 2."""
    try:
        return launch(config_from_args(args))
    except InvalidArgumentError as exc:
        print(f"pskv launch: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except LaunchError as exc:  # e.g. the ssh preflight failed: nothing was started
        print(f"pskv launch: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pskv.launch``: the same as ``pskv launch``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m pskv.launch", description=DESCRIPTION)
    add_arguments(parser)
    return run_args(parser.parse_args(argv))
