"""The local launcher: the whole job on this machine, on the loopback interface only.

Order: the scheduler starts with ``DMLC_PS_ROOT_PORT=0 --port-file F``, binds a free
port on 127.0.0.1 and writes it to ``F``; once the port is there (a readiness
handshake, never a sleep), the servers and then the workers start with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import tempfile

from pskv.atomic import write_text_atomic
from pskv.config import omp_num_threads_set
from pskv.errors import LaunchError
from pskv.launch.config import LaunchConfig
from pskv.launch.console import Console
from pskv.launch.contract import JobLayout, ProcessSpec, contract_env, env_argv, omp_note, role_argv, with_workers
from pskv.launch.elastic import workers_of
from pskv.launch.supervisor import Supervisor
from pskv.transport.security import generate_keys, write_key_file

__all__ = ["LOOPBACK", "free_port", "publish_address", "run_local", "local_specs", "scheduler_spec", "worker_spec"]

LOOPBACK = "127.0.0.1"


def scheduler_spec(config: LaunchConfig, port_file: str) -> ProcessSpec:
    """The local scheduler, on ``--port`` or told to pick a free port; it publishes it in ``port_file``."""
    layout = config.layout(LOOPBACK, config.port or 0)
    env = contract_env(layout, "scheduler", LOOPBACK)
    return ProcessSpec("scheduler", None, LOOPBACK,
                       tuple(env_argv(env, config.env, role_argv(config.python, "scheduler", port_file))))


def local_specs(config: LaunchConfig, port: int) -> list[ProcessSpec]:
    """Servers, then workers (rank = local rank), for a scheduler on ``127.0.0.1:port``.

    The workers' ``MASTER_PORT`` (torch.distributed's) is a free port of 127.0.0.1 other than ``port``.
    """
    layout = with_workers(config.layout(LOOPBACK, port), [LOOPBACK] * config.num_workers, free_port(avoid=port))
    specs = []
    for rank in range(config.num_servers):
        env = contract_env(layout, "server", LOOPBACK, rank=rank)
        specs.append(ProcessSpec("server", rank, LOOPBACK, tuple(env_argv(env, config.env,
                                                                           role_argv(config.python, "server")))))
    for rank in range(0 if config.elastic else config.num_workers):  # an elastic job's start one by one
        specs.append(worker_spec(config, layout, rank))
    return specs


def worker_spec(config: LaunchConfig, layout: JobLayout, rank: int) -> ProcessSpec:
    """Worker ``rank`` (an elastic job's: its slot) on this machine; its local rank is its rank."""
    env = contract_env(layout, "worker", LOOPBACK, rank=rank, local_rank=rank)
    return ProcessSpec("worker", rank, LOOPBACK, tuple(env_argv(env, config.env, config.command)))


def free_port(avoid: int = 0) -> int:
    """A TCP port of 127.0.0.1 free now (the kernel's pick), other than ``avoid``.

    Raises:
        LaunchError: no port can be bound.
    """
    for _ in range(8):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((LOOPBACK, 0))
                port = int(s.getsockname()[1])
        except OSError as exc:
            raise LaunchError(f"cannot find a free port on {LOOPBACK} for MASTER_PORT: {exc}") from None
        if port != avoid:
            return port
    raise LaunchError(f"cannot find a free port on {LOOPBACK} other than {avoid} for MASTER_PORT")


def publish_address(config: LaunchConfig, console: Console, address: str, fresh_key: bool = False) -> None:
    """Say where the scheduler listens (``pskv top`` attaches there, with the job's key file if it has one), and
    write it to ``--address-file``. ``fresh_key``: the key file is ``--secure``'s (mode 0600, removed at the end).

    Raises:
        LaunchError: the address file cannot be written (names it).
    """
    if config.address_file:
        try:
            write_text_atomic(config.address_file, address + "\n")
        except OSError as exc:
            raise LaunchError(f"--address-file {config.address_file}: cannot write it: {exc.strerror or exc}") from None
    key = f" --curve-key {config.curve_key_file}" if config.curve_key_file else ""
    kept = "; --secure's key, readable by you only, removed when the job ends" if key and fresh_key else ""
    console.note(f"scheduler at {address} (watch the job: pskv top --scheduler {address}{key}{kept})")


def run_local(config: LaunchConfig, console: Console) -> int:
    """Run the job on this machine; returns the launcher's exit code (see :mod:`pskv.launch.supervisor`)."""
    config, workers = workers_of(config, console.note)
    with tempfile.TemporaryDirectory(prefix="pskv-launch-") as tmp, contextlib.closing(workers), \
            Supervisor(console, stop_grace=config.stop_grace, exit_grace=config.exit_grace,
                       timeout=config.timeout, worker_restarts=config.worker_restarts,
                       server_restarts=config.server_restarts, checkpoint_dir=config.checkpoint_dir,
                       workers=workers) as supervisor:
        fresh_key = config.secure
        if config.secure:  # a fresh cluster key, private to this job (the directory is mode 0700)
            key_file = write_key_file(os.path.join(tmp, "cluster.key"), generate_keys())
            config = dataclasses.replace(config, curve_key_file=str(key_file), secure=False)
        try:
            console.started(config.num_workers, config.num_servers,
                            "no host (-s 0: workers only)" if not config.num_servers
                            else f"{LOOPBACK}:{config.port}" if config.port else f"{LOOPBACK} (a free port)", "local")
            port: int | None = 0  # -s 0: workers only, no scheduler
            if config.num_servers:
                supervisor.start(scheduler_spec(config, os.path.join(tmp, "scheduler.port")))
                port = supervisor.wait_for_port(os.path.join(tmp, "scheduler.port"), config.startup_timeout)
                if port is not None:
                    publish_address(config, console, f"{LOOPBACK}:{port}", fresh_key)
            if port is not None:
                note = omp_note(config.env, omp_num_threads_set(), config.num_workers, len(os.sched_getaffinity(0)))
                if note:
                    console.note(note)
                for spec in local_specs(config, port):
                    supervisor.start(spec)
                workers.begin(lambda slot, _, __: supervisor.start(worker_spec(config, config.layout(LOOPBACK, port), slot)),
                              supervisor.stop_worker,
                              f"tcp://{LOOPBACK}:{port}", config.launch_token, config.curve_key_file)
        except LaunchError as exc:
            supervisor.abort(str(exc))
        return supervisor.run()
