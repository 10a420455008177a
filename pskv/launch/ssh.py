"""The ssh launcher: each process runs on a host of a hostfile, through ``ssh``.

Hostfile: one host per line, ``HOST [SLOTS]`` (``HOST slots=N`` works too); ``#``
starts a comment; blank lines are ignored; SLOTS (default 1) is how many workers the
host takes per round. Placement:

* the scheduler runs on the first host, on ``--port`` (default 9091): over ssh the
  launcher cannot learn a port the scheduler picked, so it picks it;
* server ``i`` runs on host entry ``i mod H`` (file order) of the hostfile — co-located
  with the workers, one per host when there are as many servers as hosts — or, given a
  server hostfile (``--server-hostfile``, same syntax, slots ignored), on its entry
  ``i mod len`` instead: dedicated server hosts, as BytePS places them;
* workers fill the hosts round-robin by slots: round ``r`` visits, in file order,
  every host with more than ``r`` slots; worker ``i`` takes the ``i``-th place of that
  order, starting over when there are more workers than slots;
* a worker's local rank counts the workers before it on the same host.

Each process is ``ssh -o BatchMode=yes HOST 'cd CWD && PYTHON -S -c GUARD ... -- env ...
COMMAND'`` (``--ssh-command`` replaces ``ssh``: e.g. :mod:`pskv.testing.hosts`); everything starts at once, and servers and workers wait for the scheduler
through their own registration timeout (``PSKV_STARTUP_TIMEOUT``). GUARD is the text of
:mod:`pskv.launch.guard`: ssh forwards the launcher's lifeline (the client's stdin), so
when the ssh client ends — the launcher stopped it (Ctrl-C), or died — the remote
process group ends too, instead of running on until its next write fails.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pskv.errors import InvalidArgumentError, LaunchError
from pskv.launch.config import DEFAULT_SSH_PORT, LaunchConfig
from pskv.launch.contract import ProcessSpec, contract_env, env_argv, role_argv
from pskv.launch.supervisor import Console, Supervisor, guard_argv

__all__ = ["Host", "Placement", "parse_hostfile", "read_hostfile", "place", "ssh_argv", "ssh_specs", "run_ssh"]


@dataclass(frozen=True)
class Host:
    """One hostfile entry: ``name`` as ssh takes it (``[user@]host``) and its worker slots."""

    name: str
    slots: int = 1

    @property
    def address(self) -> str:
        """The host without ``user@``: its ``DMLC_NODE_HOST``."""
        return self.name.rsplit("@", 1)[-1]


@dataclass(frozen=True)
class Placement:
    """Where every process of a job runs.

    Attributes:
        scheduler: the scheduler's host.
        servers: server rank -> host.
        workers: worker rank -> (host, local rank).
    """

    scheduler: Host
    servers: tuple[Host, ...]
    workers: tuple[tuple[Host, int], ...]


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """The hosts of a hostfile's text.

    Raises:
        InvalidArgumentError: a malformed line (``source:line`` named) or no host at all.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        if len(words) > 2:
            raise InvalidArgumentError(f"{where}: expected 'HOST [SLOTS]', got {raw.strip()!r}")
        name = words[0]
        if name.startswith("-"):  # ssh would take it for an option
            raise InvalidArgumentError(f"{where}: host {name!r} starts with '-'")
        slots_text = words[1].removeprefix("slots=") if len(words) == 2 else "1"
        try:
            slots = int(slots_text)
        except ValueError:
            slots = 0
        if slots < 1:
            raise InvalidArgumentError(f"{where}: slots must be a positive integer, got {words[1]!r}")
        hosts.append(Host(name, slots))
    if not hosts:
        raise InvalidArgumentError(f"{source} lists no host")
    return hosts


def read_hostfile(path: str, what: str = "hostfile") -> list[Host]:
    """The hosts listed in the file ``path`` (``what`` names it in errors: ``'server hostfile'``).

    Raises:
        InvalidArgumentError: the file cannot be read, is malformed, or lists no host.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InvalidArgumentError(f"cannot read the {what} {path!r}: {reason}") from None
    return parse_hostfile(text, path)


def place(hosts: Sequence[Host], num_servers: int, num_workers: int,
          server_hosts: Sequence[Host] | None = None) -> Placement:
    """Place the scheduler, servers and workers on ``hosts`` (policy: see the module doc).

    Args:
        hosts: the hostfile's hosts: the scheduler, the workers, and the servers unless
            ``server_hosts`` is given.
        num_servers: servers to place.
        num_workers: workers to place.
        server_hosts: dedicated server hosts (``--server-hostfile``): server ``i`` on entry
            ``i mod len``; None: the servers share ``hosts`` with the workers.

    Raises:
        InvalidArgumentError: ``hosts`` (or a given ``server_hosts``) is empty.
    """
    if not hosts:
        raise InvalidArgumentError("no host to place the job on")
    if server_hosts is not None and not server_hosts:
        raise InvalidArgumentError("no server host to place the servers on")
    on = hosts if server_hosts is None else server_hosts
    servers = tuple(on[i % len(on)] for i in range(num_servers))
    order = [h for r in range(max(h.slots for h in hosts)) for h in hosts if h.slots > r]
    per_host: dict[str, int] = {}
    workers = []
    for rank in range(num_workers):
        host = order[rank % len(order)]
        workers.append((host, per_host.get(host.address, 0)))
        per_host[host.address] = per_host.get(host.address, 0) + 1
    return Placement(hosts[0], servers, tuple(workers))


def ssh_argv(host: Host, cwd: str, argv: Sequence[str], ssh_command: str = "ssh") -> list[str]:
    """``SSH_COMMAND -o BatchMode=yes HOST 'cd CWD && ARGV'``, quoted for the remote shell.

    ``ssh_command`` (``--ssh-command``) is split as a shell would: a program and its options.
    """
    return [*shlex.split(ssh_command), "-o", "BatchMode=yes", host.name,
            f"cd {shlex.quote(cwd)} && {shlex.join(argv)}"]


def ssh_specs(config: LaunchConfig, hosts: Sequence[Host],
              server_hosts: Sequence[Host] | None = None) -> list[ProcessSpec]:
    """The scheduler, servers and workers of a job on ``hosts`` (servers on ``server_hosts`` if given), in start order."""
    where = place(hosts, config.num_servers, config.num_workers, server_hosts)
    layout = config.layout(where.scheduler.address, DEFAULT_SSH_PORT if config.port is None else config.port)

    def spec(role: str, rank: int | None, host: Host, env: dict[str, str], command: Sequence[str]) -> ProcessSpec:
        guarded = guard_argv(config.python, role, config.stop_grace, config.exit_grace, inline=True)
        return ProcessSpec(role, rank, host.address, tuple(ssh_argv(host, config.cwd,
                                                                   guarded + env_argv(env, config.env, command),
                                                                   config.ssh_command)))

    specs = [spec("scheduler", None, where.scheduler, contract_env(layout, "scheduler", where.scheduler.address),
                  role_argv(config.python, "scheduler"))]
    for rank, host in enumerate(where.servers):
        specs.append(spec("server", rank, host, contract_env(layout, "server", host.address, rank),
                          role_argv(config.python, "server")))
    for rank, (host, local_rank) in enumerate(where.workers):
        specs.append(spec("worker", rank, host, contract_env(layout, "worker", host.address, rank, local_rank),
                          config.command))
    return specs


def run_ssh(config: LaunchConfig, console: Console) -> int:
    """Run the job on the hostfile's hosts; returns the launcher's exit code.

    Raises:
        InvalidArgumentError: the hostfile or the server hostfile is unreadable or malformed
            (nothing started).
    """
    assert config.hostfile is not None  # LaunchConfig checks it
    hosts = read_hostfile(config.hostfile)
    server_hosts = read_hostfile(config.server_hostfile, "server hostfile") if config.server_hostfile else None
    specs = ssh_specs(config, hosts, server_hosts)
    with Supervisor(console, stop_grace=config.stop_grace, exit_grace=config.exit_grace,
                    timeout=config.timeout, via_ssh=True, worker_restarts=config.worker_restarts) as supervisor:
        try:
            for spec in specs:
                supervisor.start(spec)
        except LaunchError as exc:
            supervisor.abort(str(exc))
        return supervisor.run()
