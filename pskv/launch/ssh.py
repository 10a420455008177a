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

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pskv import __version__
from pskv.config import omp_num_threads_set
from pskv.errors import InvalidArgumentError, LaunchError
from pskv.launch.config import DEFAULT_SSH_PORT, LaunchConfig
from pskv.launch.console import Console
from pskv.launch.contract import (
    JobLayout,
    ProcessSpec,
    contract_env,
    env_argv,
    omp_note,
    port_beside,
    role_argv,
    with_workers,
)
from pskv.launch.elastic import workers_of
from pskv.launch.on_host import publish_address
from pskv.launch.supervisor import Supervisor, describe_exit, guard_argv

__all__ = ["Host", "HostCheck", "LatePreflight", "Placement", "check_hosts", "parse_host_list", "parse_hostfile", "read_hostfile", "place", "ssh_argv",
           "ssh_layout", "ssh_specs", "ssh_worker", "run_ssh"]

_CHECK_MARK = "pskv-check:"  # starts the preflight's own lines (a login banner may come before them)
_CHECK_OUTPUT = 16384  # bytes of a host's preflight output kept (the last ones)


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


def parse_host_list(text: str, what: str = "host list") -> list[Host]:
    """A horovodrun-style host list: ``'host1:2,alice@host2:4,host3'`` (no slots: 1).

    Raises:
        InvalidArgumentError: a malformed entry (``what`` and its number named) or no host.
    """
    lines = []
    for entry in text.split(","):
        name, sep, slots = entry.strip().rpartition(":")
        lines.append(f"{name} {slots}" if sep else slots)  # one hostfile line per entry
    return parse_hostfile("\n".join(lines), f"{what} {text!r} entry")


def read_hostfile(path: str, what: str = "hostfile") -> list[Host]:
    """The hosts listed in the file ``path`` (``what`` names it in errors: ``'server hostfile'``),
    or, when no such file exists and ``path`` has a ``:`` or ``,``, the host list it is
    (:func:`parse_host_list`, horovodrun's ``-H host1:2,host2:2``).

    Raises:
        InvalidArgumentError: the file cannot be read, is malformed, or lists no host.
    """
    if not os.path.exists(path) and (":" in path or "," in path):
        return parse_host_list(path, what.replace("hostfile", "host list"))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InvalidArgumentError(f"cannot read the {what} {path!r}: {reason} (a host list has a ':' or ',': "
                                   "HOST:SLOTS[,HOST:SLOTS...])") from None
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


def ssh_specs(config: LaunchConfig, hosts: Sequence[Host], server_hosts: Sequence[Host] | None = None,
              pythons: Mapping[str, str] | None = None) -> list[ProcessSpec]:
    """The scheduler, servers and workers of a job on ``hosts`` (servers on ``server_hosts`` if given), in start order
    (an elastic job's workers: none, :class:`~pskv.launch.elastic.ElasticWorkers` starts them: :func:`ssh_worker`).

    ``pythons``: host name -> the interpreter to use there (:func:`check_hosts`' choice) for the
    guard, the roles and a worker command whose program is a bare ``python`` / ``python3``;
    a host not in it uses ``config.python`` (and the worker command runs as given).
    """
    where = place(hosts, config.num_servers, config.num_workers, server_hosts)
    layout = ssh_layout(config, where.scheduler, [h.address for h, _ in where.workers])
    chosen = pythons or {}
    specs = [_spec(config, chosen, "scheduler", None, where.scheduler,
                   contract_env(layout, "scheduler", where.scheduler.address), None)] if config.num_servers else []
    for rank, host in enumerate(where.servers):
        specs.append(_spec(config, chosen, "server", rank, host, contract_env(layout, "server", host.address, rank),
                           None))
    for rank, (host, local_rank) in enumerate(() if config.elastic else where.workers):
        specs.append(ssh_worker(config, layout, chosen, rank, host, local_rank))
    return specs


def ssh_layout(config: LaunchConfig, scheduler: Host, worker_hosts: Sequence[str]) -> JobLayout:
    """The job's layout for a scheduler on ``scheduler``; the torchrun variables unless elastic (no fixed ranks)."""
    port = DEFAULT_SSH_PORT if config.port is None else config.port
    layout = config.layout(scheduler.address, port)
    return layout if config.elastic else with_workers(layout, worker_hosts, port_beside(port))


def ssh_worker(config: LaunchConfig, layout: JobLayout, pythons: Mapping[str, str], rank: int, host: Host,
               local_rank: int) -> ProcessSpec:
    """Worker ``rank`` (an elastic job's: its slot) on ``host`` through ssh."""
    env = contract_env(layout, "worker", host.address, rank, local_rank)
    return _spec(config, pythons, "worker", rank, host, env, config.command)


def _spec(config: LaunchConfig, pythons: Mapping[str, str], role: str, rank: int | None, host: Host,
          env: dict[str, str], command: Sequence[str] | None) -> ProcessSpec:
    """One process on ``host`` through ssh, under the guard (``command`` None: a pskv role)."""
    python = pythons.get(host.name, config.python)
    if command is None:  # a pskv role
        command = role_argv(python, role)
    elif host.name in pythons and command[0] in ("python", "python3"):  # the login shell's may lack pskv
        command = [python, *command[1:]]
    guarded = guard_argv(python, role, config.stop_grace, config.exit_grace, inline=True)
    return ProcessSpec(role, rank, host.address, tuple(ssh_argv(host, config.cwd, guarded + env_argv(env, config.env, command),
                                                               config.ssh_command)))


@dataclass(frozen=True)
class HostCheck:
    """One host's preflight: the interpreter that imports pskv there, or why none does.

    Attributes:
        host: the host entry checked.
        python: the first candidate interpreter that imported pskv (empty: none did).
        version: ``pskv.__version__`` there.
        reason: why the host failed, one line (empty when ``python`` is set).
    """

    host: Host
    python: str = ""
    version: str = ""
    reason: str = ""


def _check_command(cwd: str, candidates: Sequence[str]) -> list[str]:
    """The remote command of the preflight: ``sh -c SCRIPT``, whatever the login shell."""
    mark = _CHECK_MARK
    script = (f"cd {shlex.quote(cwd)} 2>/dev/null || {{ echo '{mark} no directory {cwd}'; exit 1; }}\n"
              f"for py in {' '.join(shlex.quote(c) for c in candidates)}; do\n"
              "  if command -v \"$py\" >/dev/null 2>&1; then\n"
              "    if out=$(\"$py\" -c 'import pskv; print(pskv.__version__)' 2>&1); then\n"
              f"      echo \"{mark} ok $py $out\"; exit 0\n"
              "    fi\n"
              f"    echo \"{mark} $py: $(printf '%s\\n' \"$out\" | tail -n 1)\"\n"
              "  else\n"
              f"    echo \"{mark} $py: not found\"\n"
              "  fi\n"
              "done\n"
              "exit 1\n")
    return ["sh", "-c", script]


def _run_bounded(argv: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """Run ``argv`` (its own process group), keeping the last :data:`_CHECK_OUTPUT` bytes of its output.

    Returns:
        (exit code, output); exit code None: killed after ``timeout`` seconds.
    """
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc.strerror or exc}"
    stream = proc.stdout
    assert stream is not None
    kept = bytearray()

    def read() -> None:
        for chunk in iter(lambda: os.read(stream.fileno(), _CHECK_OUTPUT), b""):
            kept.extend(chunk)
            del kept[:-_CHECK_OUTPUT]

    reader = threading.Thread(target=read, daemon=True, name="pskv-launch-check")
    reader.start()
    try:
        code: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    reader.join(1.0)  # a grandchild outside the group may hold the pipe: give up on the rest
    if not reader.is_alive():
        stream.close()
    return code, bytes(kept).decode(errors="replace")


def check_hosts(config: LaunchConfig, hosts: Sequence[Host], timeout: float) -> list[HostCheck]:
    """The preflight (as ``horovodrun --check-build``): can each host run pskv, and with which interpreter?

    On every distinct host at once, through ``--ssh-command``, in ``config.cwd``: the first of
    ``config.python`` (the launcher's interpreter by default) and ``python3`` that runs
    ``import pskv``. At most ``timeout`` seconds in all.

    Returns:
        One :class:`HostCheck` per distinct host name, in the order given.
    """
    unique = list({h.name: h for h in hosts}.values())
    candidates = list(dict.fromkeys([config.python, "python3"]))
    results: dict[str, HostCheck] = {}

    def check(host: Host) -> None:
        argv = ssh_argv(host, "/", _check_command(config.cwd, candidates), config.ssh_command)
        code, out = _run_bounded(argv, timeout)
        lines = out.splitlines()
        own = [ln[len(_CHECK_MARK):].strip() for ln in lines if ln.startswith(_CHECK_MARK)]
        if code is None:
            results[host.name] = HostCheck(host, reason=f"no answer within {timeout:g} s")
        elif code == 0 and own and own[-1].startswith("ok "):
            _, python, version = (own[-1].split(" ", 2) + ["", ""])[:3]
            results[host.name] = HostCheck(host, python, version.strip())
        elif own:
            results[host.name] = HostCheck(host, reason="; ".join(own))
        else:  # ssh itself failed (connection, login): its last line says why
            last = lines[-1].strip() if lines else ""
            results[host.name] = HostCheck(host, reason=f"{config.ssh_command} {describe_exit(code, True)}"
                                                        + (f": {last}" if last else ""))

    threads = [threading.Thread(target=check, args=(h,), daemon=True, name=f"pskv-launch-check-{h.name}")
               for h in unique]
    for t in threads:
        t.start()
    limit = time.monotonic() + timeout + 5.0  # each check kills its own ssh at `timeout`
    for t in threads:
        t.join(max(0.0, limit - time.monotonic()))
    return [results.get(h.name, HostCheck(h, reason=f"no answer within {timeout:g} s")) for h in unique]


def _note_version(check: HostCheck, note: Callable[[str], None]) -> None:
    if check.version != __version__:
        note(f"host {check.host.name}: {check.python} has pskv {check.version}, this launcher {__version__}")


class LatePreflight:
    """The preflight of the hosts an elastic job's discovery script names after the start (ssh).

    Each new host is checked once (:func:`check_hosts`, on a thread of its own, at most
    ``startup_timeout`` seconds); until its check passes its slots take no worker, and a host
    that fails is named once, with the reason, and never takes one (a worker started there
    would fail at once, and again after every ``--respawn-cooldown``).

    Args:
        pythons: host name -> its interpreter (the hosts checked at the start); a passed host is added.
        note: prints a launcher note.
    """

    def __init__(self, config: LaunchConfig, pythons: dict[str, str], note: Callable[[str], None]) -> None:
        self._config, self._pythons, self._note = config, pythons, note
        self._asked: set[str] = set()  # hosts whose check started (passed ones are in pythons)
        self._lock = threading.Lock()

    def ready(self, host: str) -> bool:
        """Whether workers may start on ``host`` now (the first ask starts its check)."""
        if host in self._pythons:
            return True
        with self._lock:
            if host in self._asked:
                return False
            self._asked.add(host)
        threading.Thread(target=self._check, args=(host,), daemon=True, name=f"pskv-launch-check-{host}").start()
        return False

    def _check(self, host: str) -> None:
        (check,) = check_hosts(self._config, [Host(host)], self._config.startup_timeout)
        if not check.python:
            self._note(f"host {host}: cannot run pskv: {check.reason}; its slots take no worker")
            return
        _note_version(check, self._note)
        self._pythons[host] = check.python  # one assignment: the supervisor's thread reads it


def run_ssh(config: LaunchConfig, console: Console) -> int:
    """Run the job on the hostfile's hosts; returns the launcher's exit code.

    First the preflight (:func:`check_hosts`, at most ``startup_timeout`` seconds): every
    host that cannot run pskv is named with its reason, one line each, and nothing starts.

    Raises:
        InvalidArgumentError: the hostfile or the server hostfile is unreadable or malformed
            (nothing started).
        LaunchError: the preflight failed on a host (nothing started).
    """
    assert config.hostfile is not None  # LaunchConfig checks it
    hosts = read_hostfile(config.hostfile)
    server_hosts = read_hostfile(config.server_hostfile, "server hostfile") if config.server_hostfile else None
    console.started(config.num_workers, config.num_servers,
                    f"{hosts[0].address}:{DEFAULT_SSH_PORT if config.port is None else config.port}"
                    if config.num_servers else "no host (-s 0: workers only)", "ssh")
    config, workers = workers_of(config, console.note, {h.name: h.slots for h in hosts})
    with contextlib.ExitStack() as unless_started:
        unless_started.callback(workers.close)
        # an elastic job's first discovered hosts are checked with the others; hosts found later by LatePreflight
        found = [Host(name) for name in workers.hosts() if name not in {h.name for h in hosts}]
        checks = check_hosts(config, [*hosts, *(server_hosts or []), *found], config.startup_timeout)
        failed = [c for c in checks if not c.python]
        for c in failed:
            console.note(f"host {c.host.name}: cannot run pskv: {c.reason}")
        if failed:
            raise LaunchError(f"the preflight failed on {len(failed)} of {len(checks)} host(s) (pskv must import "
                              "there with --python PATH or python3, in the same directory); nothing was started")
        unless_started.pop_all()
    for c in checks:
        _note_version(c, console.note)
    pythons = {c.host.name: c.python for c in checks}
    specs = ssh_specs(config, hosts, server_hosts, pythons)
    if config.num_servers:  # -s 0: workers only, no scheduler
        publish_address(config, console, f"{hosts[0].address}:{DEFAULT_SSH_PORT if config.port is None else config.port}")
    note = omp_note(config.env, omp_num_threads_set())
    if note:
        console.note(note)
    if config.command[0] in ("python", "python3") and {pythons[h.name] for h in hosts} != {config.command[0]}:
        console.note(f"the worker command's {config.command[0]} runs as "
                     f"{', '.join(sorted({pythons[h.name] for h in hosts}))} on the hosts (it imports pskv there)")
    layout = ssh_layout(config, hosts[0], ())
    with contextlib.closing(workers), Supervisor(console, stop_grace=config.stop_grace, exit_grace=config.exit_grace,
                                                 timeout=config.timeout, via_ssh=True,
                                                 worker_restarts=config.worker_restarts, workers=workers) as supervisor:
        try:
            for spec in specs:
                supervisor.start(spec)
            workers.begin(lambda slot, host, local: supervisor.start(ssh_worker(config, layout, pythons, slot,
                                                                                Host(host), local)),
                          supervisor.stop_worker,
                          f"tcp://{hosts[0].address}:{layout.root_port}", config.launch_token, config.curve_key_file,
                          LatePreflight(config, pythons, console.note).ready)
        except LaunchError as exc:
            supervisor.abort(str(exc))
        return supervisor.run()
