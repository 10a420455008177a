"""A simulated multi-host cluster on one Linux machine, for tests and benchmarks.

:class:`SimulatedHosts` makes N "hosts": each a network namespace with one veth link to a
bridge that lives in a namespace of its own, a private address ``10.215.0.<i+1>/24`` that
exists only inside these namespaces, and optional ``tc`` shaping of its link (``tbf`` for
a rate, both ways; ``netem`` for a delay where the kernel has ``sch_netem``, found out once
per process by :func:`netem_available` — elsewhere the delay is left out and the links are
shaped by ``tbf`` alone, so jobs still run). Everything is named uniquely per process and
removed when the context ends, also on failure.

A job runs on them through the real ssh launcher: :meth:`SimulatedHosts.hostfile` writes
a hostfile of their addresses and :meth:`SimulatedHosts.ssh_command` is the
``pskv launch --ssh-command`` that "enters" a host instead of logging into it::

    python -S .../pskv/testing/hosts.py enter ADDR=NETNS/NAME[,...] [ssh options] ADDR COMMAND

(this file run as a script: it needs only the standard library, so starting a process on
a host does not import pskv once more; ``python -m pskv.testing.hosts enter`` is the same)

drops the ssh options (as ssh takes them), and runs ``sh -c COMMAND`` inside the host's
network namespace with its own UTS namespace and host name ``NAME``. So pskv's
:func:`~pskv.transport.shm.host_id` differs per host, and the shared-memory path is
taken exactly between processes of one host, as on real machines.

TCP inside the hosts uses the machine's default congestion control
(``net.ipv4.tcp_congestion_control``; ``bench/bench_hosts.py`` records it): with BBR, the
flows of a parameter server share the shaped links unevenly, which pskv's data connections
avoid by leaving BBR (:mod:`pskv.transport.stream`).

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), ``ip`` and ``unshare``; where any of it
is missing or not permitted, :class:`SimulatedHosts` raises :class:`Unavailable` (tests
skip).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["SUBNET", "SimHost", "SimulatedHosts", "Unavailable", "enter_argv", "main", "netem_available",
           "strip_ssh_options"]

SUBNET = "10.215.0"  # /24; the addresses exist only inside the namespaces made here
PREFIX_LEN = 24
BRIDGE = "br0"
HOST_DEV = "eth0"

_log = logging.getLogger("pskv.testing.hosts")
_counter = itertools.count()
_CMD_TIMEOUT = 15.0  # seconds any one `ip` / `tc` command may take
_SSH_OPTIONS_WITH_VALUE = frozenset("BbcDEeFIiJLlmOopQRSWw")  # ssh(1) options that take an argument


class Unavailable(Exception):
    """Network namespaces, veth links, the bridge or a tc qdisc cannot be used here (the reason is the message)."""


def _must(argv: Sequence[str]) -> str:
    """Run ``argv``; raise Unavailable with its error output if it fails."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"`{shlex.join(argv)}` failed: {exc}") from None
    if res.returncode != 0:
        raise Unavailable(f"`{shlex.join(argv)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res.stdout


@functools.cache
def netem_available() -> bool:
    """Whether ``tc`` can add a ``netem`` qdisc here (tried once per process, in a namespace made for it).

    Many kernels (and containers) come without ``sch_netem``; ``tbf`` is built in nearly
    everywhere. False also where namespaces cannot be made (nothing can be tried).
    """
    if sys.platform != "linux" or shutil.which("tc") is None or shutil.which("ip") is None:
        return False
    probe = f"pskvn{os.getpid()}x{next(_counter)}"
    try:
        _must(["ip", "netns", "add", probe])
    except Unavailable:
        return False
    try:
        _must(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
        return True
    except Unavailable:
        return False
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=_CMD_TIMEOUT, check=False)


@dataclass(frozen=True)
class SimHost:
    """One simulated host.

    Attributes:
        index: its position (0-based).
        address: its IP address (also its hostfile name and ``DMLC_NODE_HOST``).
        netns: its network namespace.
        hostname: the host name its processes see.
        link: the bridge-side end of its veth link (in the bridge's namespace).
    """

    index: int
    address: str
    netns: str
    hostname: str
    link: str


class SimulatedHosts:
    """``count`` hosts on one bridge; a context manager that removes everything at exit.

    Args:
        count: how many hosts (1..250).
        rate: a ``tc tbf`` rate (e.g. ``'1gbit'``) for every host's link, both ways; None: unshaped.
        delay: a ``tc netem`` delay (e.g. ``'1ms'``) on every host's outgoing traffic where
            :func:`netem_available`; elsewhere none. None: none.

    Attributes:
        rate: the rate in effect.
        delay: the delay in effect: ``delay``, or None where the kernel has no ``netem``.

    Raises:
        Unavailable: not Linux, ``ip`` / ``unshare`` (or ``tc``, for a rate) missing,
            namespaces not permitted, or ``tbf`` refused the rate.
        ValueError: ``count`` out of range.
    """

    def __init__(self, count: int, rate: str | None = None, delay: str | None = None) -> None:
        if not 1 <= count <= 250:
            raise ValueError(f"count must be in 1..250, got {count}")
        if sys.platform != "linux":
            raise Unavailable("network namespaces are Linux-only")
        for tool in ("ip", "unshare", "hostname") + (("tc",) if rate else ()):
            if shutil.which(tool) is None:
                raise Unavailable(f"the `{tool}` command is not installed")
        self.rate = rate
        self.delay = delay if delay and netem_available() else None
        if delay and self.delay is None:
            _log.warning("no sch_netem here: the delay %s is left out (links shaped by tbf alone)", delay)
        self.tag = f"pskvh{os.getpid()}x{next(_counter)}"
        self.bridge_ns = f"{self.tag}b"
        self.hosts = tuple(SimHost(i, f"{SUBNET}.{i + 1}", f"{self.tag}h{i}", f"simhost{i}", f"v{i}")
                           for i in range(count))
        self._made: list[str] = []
        try:
            self._build(self.rate, self.delay)
        except BaseException:
            self.destroy()
            raise

    def _build(self, rate: str | None, delay: str | None) -> None:
        _must(["ip", "netns", "add", self.bridge_ns])
        self._made.append(self.bridge_ns)
        _must(["ip", "-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge"])
        _must(["ip", "-n", self.bridge_ns, "link", "set", BRIDGE, "up"])
        for host in self.hosts:
            _must(["ip", "netns", "add", host.netns])
            self._made.append(host.netns)
            # made inside the bridge's namespace, so no end ever exists in the caller's namespace
            _must(["ip", "-n", self.bridge_ns, "link", "add", host.link, "type", "veth",
                   "peer", "name", HOST_DEV, "netns", host.netns])
            _must(["ip", "-n", self.bridge_ns, "link", "set", host.link, "master", BRIDGE, "up"])
            _must(["ip", "-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", HOST_DEV])
            _must(["ip", "-n", host.netns, "link", "set", "lo", "up"])
            _must(["ip", "-n", host.netns, "link", "set", HOST_DEV, "up"])
            if rate:  # both ways: the host's egress, and the bridge port's egress toward the host
                tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
                self._qdisc(host.netns, HOST_DEV, ["netem", "delay", delay] if delay else tbf, "1:")
                if delay:
                    self._qdisc(host.netns, HOST_DEV, tbf, None, parent="1:1")
                self._qdisc(self.bridge_ns, host.link, tbf, None)
            elif delay:
                self._qdisc(host.netns, HOST_DEV, ["netem", "delay", delay], None)

    @staticmethod
    def _qdisc(netns: str, dev: str, spec: list[str], handle: str | None, parent: str = "root") -> None:
        where = ["root"] if parent == "root" else ["parent", parent]
        _must(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, *where,
               *(["handle", handle] if handle else []), *spec])

    # -- using them ------------------------------------------------------------------------
    def __enter__(self) -> SimulatedHosts:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.destroy()

    def __getitem__(self, index: int) -> SimHost:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def hostfile(self, path: str | os.PathLike[str], slots: Sequence[int] | None = None) -> Path:
        """Write a hostfile of every host's address (``slots[i]`` workers per round on host i; default 1)."""
        slots = slots or [1] * len(self.hosts)
        if len(slots) != len(self.hosts):
            raise ValueError(f"slots names {len(slots)} hosts, there are {len(self.hosts)}")
        out = Path(path)
        out.write_text("".join(f"{h.address} {n}  # {h.hostname}\n" for h, n in zip(self.hosts, slots)),
                       encoding="utf-8")
        return out

    def ssh_command(self, python: str = sys.executable) -> str:
        """The ``pskv launch --ssh-command`` that enters these hosts."""
        return shlex.join(enter_argv(self.hosts, python))

    def set_link(self, index: int, up: bool) -> None:
        """Bring host ``index``'s link up or down at the bridge (the host keeps its own address and routes)."""
        _must(["ip", "-n", self.bridge_ns, "link", "set", self.hosts[index].link, "up" if up else "down"])

    def link_bytes(self, index: int) -> dict[str, int]:
        """Bytes host ``index`` has sent (``tx``) and received (``rx``) on its link."""
        out = _must(["ip", "-n", self.hosts[index].netns, "-s", "-j", "link", "show", "dev", HOST_DEV])
        stats = json.loads(out)[0]["stats64"]
        return {"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])}

    def tcp_losses(self, index: int) -> dict[str, int]:
        """Host ``index``'s TCP segments retransmitted so far (``retrans``, its namespace's ``/proc/net/snmp``)
        and packets its link's shaping dropped (``dropped``: both ``tbf`` queues, out of and into the host):
        the traces of a link's queue overflowing, e.g. many senders at once to one host (incast)."""
        host = self.hosts[index]
        snmp = _must(["ip", "netns", "exec", host.netns, "cat", "/proc/net/snmp"]).splitlines()
        names, values = (line.split() for line in [x for x in snmp if x.startswith("Tcp:")][:2])
        dropped = 0
        for netns, dev in ((host.netns, HOST_DEV), (self.bridge_ns, host.link)):
            for qdisc in json.loads(_must(["ip", "netns", "exec", netns, "tc", "-s", "-j", "qdisc", "show", "dev", dev])
                                    or "[]"):
                dropped += int(qdisc.get("drops", 0)) if qdisc.get("kind") in ("tbf", "netem") else 0
        return {"retrans": int(dict(zip(names, values))["RetransSegs"]), "dropped": dropped}

    def all_of_this_process(self) -> list[str]:
        """Names of the namespaces of these hosts (made by this object) that still exist."""
        out = _must(["ip", "netns", "list"])
        names = {self.bridge_ns} | {h.netns for h in self.hosts}
        return [w for w in (line.split()[0] for line in out.splitlines() if line.strip()) if w in names]

    def destroy(self) -> None:
        """Kill what still runs inside the hosts, then delete every namespace (idempotent).

        The veth links and the bridge go with the namespaces. A process left behind (a job
        that did not end) gets SIGKILL by its id (``ip netns pids``), so nothing outlives
        the hosts.
        """
        for ns in reversed(self._made):
            try:
                pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                      timeout=_CMD_TIMEOUT, check=False).stdout.split()
            except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - best effort
                pids = []
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ValueError, ProcessLookupError, PermissionError):
                    pass
            try:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=_CMD_TIMEOUT, check=False)
            except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - best effort
                pass
        self._made.clear()


# -- the remote shell --------------------------------------------------------------------
def enter_argv(hosts: Sequence[SimHost], python: str = sys.executable) -> list[str]:
    """``PYTHON -S .../hosts.py enter ADDR=NETNS/NAME,...``: ssh's stand-in for ``hosts`` (standard library only)."""
    return [python, "-S", str(Path(__file__).resolve()), "enter",
            ",".join(f"{h.address}={h.netns}/{h.hostname}" for h in hosts)]


def _parse_table(text: str) -> dict[str, tuple[str, str]]:
    table = {}
    for item in text.split(","):
        address, _, rest = item.partition("=")
        netns, _, name = rest.partition("/")
        if not (address and netns and name):
            raise ValueError(f"bad host entry {item!r}: expected ADDR=NETNS/NAME")
        table[address] = (netns, name)
    return table


def strip_ssh_options(args: list[str]) -> list[str]:
    """``[ssh options] HOST COMMAND...`` -> ``[HOST, COMMAND...]``."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        opt = args[i]
        # "-o X" takes the next word; "-oX" / "-p22" carry it; flags like "-T" take nothing
        i += 2 if len(opt) == 2 and opt[1] in _SSH_OPTIONS_WITH_VALUE else 1
    if i < len(args) and args[i] == "--":
        i += 1
    return args[i:]


def main(argv: Sequence[str] | None = None) -> int:
    """``enter TABLE [ssh options] HOST COMMAND...``: run COMMAND inside HOST (never returns on success)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "enter":
        print("usage: python -m pskv.testing.hosts enter ADDR=NETNS/NAME[,...] [ssh options] HOST COMMAND",
              file=sys.stderr)
        return 2
    try:
        table = _parse_table(args[1])
    except ValueError as exc:
        print(f"pskv.testing.hosts: {exc}", file=sys.stderr)
        return 2
    rest = strip_ssh_options(args[2:])
    if len(rest) < 2:
        print("pskv.testing.hosts: expected HOST COMMAND after the ssh options", file=sys.stderr)
        return 2
    host, command = rest[0].rsplit("@", 1)[-1], " ".join(rest[1:])  # ssh joins the words with spaces
    if host not in table:
        print(f"pskv.testing.hosts: unknown host {host!r} (known: {', '.join(table)})", file=sys.stderr)
        return 255  # ssh's code for a connection failure
    netns, name = table[host]
    os.execvp("ip", ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c",
                     'hostname "$0" && exec sh -c "$1"', name, command])


if __name__ == "__main__":
    sys.exit(main())
