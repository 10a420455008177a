"""Two network namespaces joined by a veth pair, and a pskv job started inside them.

Used by ``test_network.py``. Everything here is made by the test itself, under names
unique to this process, and removed when it ends:

* :class:`VethPair` — namespaces ``core`` and ``edge`` with one veth pair between them
  (``10.213.7.1/30`` in core, ``.2`` in edge: private addresses that exist only inside
  these namespaces) and loopback up in both. The *edge* end is the one taken down, so
  nodes of the core namespace keep talking to each other over their own address
  (taking an interface down removes its local routes) while the edge is cut off.
  ``tc`` qdiscs go on both ends, so traffic is shaped both ways.
* :class:`NetJob` — a scheduler (always in core), servers and workers as real
  processes, each started with ``ip netns exec <ns> python ...`` and the ``DMLC_*``
  contract pointing at those addresses; line readers per process; every process is
  reaped by :meth:`NetJob.reap`.

A host where namespaces, veth or ``tc`` are not permitted raises :class:`Unavailable`
(the tests turn it into a skip).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["CORE_IP", "EDGE_IP", "NetJob", "Unavailable", "VethPair"]

CORE_IP = "10.213.7.1"
EDGE_IP = "10.213.7.2"
PREFIX_LEN = 30

_counter = itertools.count()
_CMD_TIMEOUT = 15.0  # seconds any one `ip` / `tc` command may take


class Unavailable(Exception):
    """Network namespaces, veth pairs or a tc qdisc cannot be used here (the reason is the message)."""


def _run(argv: list[str], timeout: float = _CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _must(argv: list[str]) -> str:
    """Run ``argv``; raise Unavailable with its error output if it fails."""
    try:
        res = _run(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"`{' '.join(argv)}` failed: {exc}") from None
    if res.returncode != 0:
        raise Unavailable(f"`{' '.join(argv)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res.stdout


class VethPair:
    """Namespaces ``core`` and ``edge`` joined by a veth pair; :meth:`destroy` removes everything.

    Raises:
        Unavailable: ``ip`` is missing, or creating namespaces / the veth pair is not permitted.
    """

    def __init__(self) -> None:
        if sys.platform != "linux":
            raise Unavailable("network namespaces are Linux-only")
        if shutil.which("ip") is None:
            raise Unavailable("the `ip` command (iproute2) is not installed")
        n = next(_counter)
        tag = f"{os.getpid()}x{n}"
        self.ns = {"core": f"pskvt{tag}c", "edge": f"pskvt{tag}e"}
        self.dev = {"core": f"pv{tag}c", "edge": f"pv{tag}e"}  # at most 15 characters
        self.ip = {"core": CORE_IP, "edge": EDGE_IP}
        self._made: list[str] = []
        try:
            for side in ("core", "edge"):
                _must(["ip", "netns", "add", self.ns[side]])
                self._made.append(self.ns[side])
            # created inside core, so it never exists in the caller's namespace
            _must(["ip", "-n", self.ns["core"], "link", "add", self.dev["core"], "type", "veth",
                   "peer", "name", self.dev["edge"], "netns", self.ns["edge"]])
            for side in ("core", "edge"):
                ns, dev = self.ns[side], self.dev[side]
                _must(["ip", "-n", ns, "addr", "add", f"{self.ip[side]}/{PREFIX_LEN}", "dev", dev])
                _must(["ip", "-n", ns, "link", "set", "lo", "up"])
                _must(["ip", "-n", ns, "link", "set", dev, "up"])
        except BaseException:
            self.destroy()
            raise

    # -- faults ---------------------------------------------------------------------------
    def set_link(self, up: bool) -> None:
        """Bring the edge end of the link up or down (the core end then has no carrier)."""
        _must(["ip", "-n", self.ns["edge"], "link", "set", self.dev["edge"], "up" if up else "down"])

    def add_qdisc(self, spec: list[str]) -> None:
        """Put ``tc qdisc add dev <end> root <spec...>`` on both ends.

        Raises:
            Unavailable: ``tc`` is missing or the kernel does not know the qdisc (e.g. no
                ``sch_netem``).
        """
        if shutil.which("tc") is None:
            raise Unavailable("the `tc` command (iproute2) is not installed")
        for side in ("core", "edge"):
            _must(["ip", "netns", "exec", self.ns[side], "tc", "qdisc", "add", "dev", self.dev[side], "root", *spec])

    def qdisc_stats(self) -> dict[str, dict[str, int]]:
        """Per end: the root qdisc's counters (``bytes``, ``packets``, ``drops``, ...)."""
        stats = {}
        for side in ("core", "edge"):
            out = _must(["ip", "netns", "exec", self.ns[side], "tc", "-s", "-j", "qdisc", "show", "dev", self.dev[side]])
            roots = [q for q in json.loads(out) if q.get("root")]
            stats[side] = {k: v for k, v in roots[0].items() if isinstance(v, int)} if roots else {}
        return stats

    def link_bytes(self) -> dict[str, int]:
        """Per end: bytes the interface has sent."""
        sent = {}
        for side in ("core", "edge"):
            out = _must(["ip", "-n", self.ns[side], "-s", "-j", "link", "show", "dev", self.dev[side]])
            sent[side] = int(json.loads(out)[0]["stats64"]["tx"]["bytes"])
        return sent

    def connections(self, side: str) -> set[tuple[str, str]]:
        """Established TCP connections in the namespace of ``side``: (local, peer) address pairs."""
        out = _must(["ip", "netns", "exec", self.ns[side], "ss", "-t", "-n", "-H", "state", "established"])
        return {(cols[-2], cols[-1]) for cols in (line.split() for line in out.splitlines()) if len(cols) >= 4}

    def reset_connections(self, side: str) -> set[tuple[str, str]]:
        """Destroy every established TCP connection in ``side`` (``ss -K``: both ends see a reset).

        Returns the connections destroyed.

        Raises:
            Unavailable: ``ss`` is missing, or the kernel cannot destroy sockets
                (``CONFIG_INET_DIAG_DESTROY``): the connections survived.
        """
        if shutil.which("ss") is None:
            raise Unavailable("the `ss` command (iproute2) is not installed")
        before = self.connections(side)
        _must(["ip", "netns", "exec", self.ns[side], "ss", "-K", "-t", "-n", "state", "established"])
        survived = before & self.connections(side)
        if before and survived == before:
            raise Unavailable(f"`ss -K` destroyed none of {len(before)} connections (no CONFIG_INET_DIAG_DESTROY?)")
        return before - survived

    def exec_argv(self, side: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace of ``side`` (``ip netns exec`` execs in place: same pid)."""
        return ["ip", "netns", "exec", self.ns[side], *argv]

    @staticmethod
    def all_of_this_process() -> list[str]:
        """Names of the namespaces this process has made and not yet deleted."""
        out = _must(["ip", "netns", "list"])
        return [w for w in (line.split()[0] for line in out.splitlines() if line.strip())
                if w.startswith(f"pskvt{os.getpid()}x")]

    def destroy(self) -> None:
        """Delete both namespaces (idempotent); the veth pair goes with them."""
        for ns in self._made:
            try:
                _run(["ip", "netns", "del", ns])
            except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - best effort
                pass
        self._made = []


def probe_qdisc(spec: list[str]) -> None:
    """Raise Unavailable unless ``tc qdisc ... <spec>`` works here (tried on a throwaway pair)."""
    pair = VethPair()
    try:
        pair.add_qdisc(spec)
    finally:
        pair.destroy()


class NetJob:
    """A pskv job whose processes run in the namespaces of a :class:`VethPair`.

    Args:
        net: the namespaces.
        tmp: a directory for the scheduler's port file and the worker script.
        worker_script: source of the workers' program.
        placement: per node (``"server 0"``, ``"worker 1"``, ...) ``"core"`` or ``"edge"``;
            the scheduler always runs in core.
        env: extra environment for every process (heartbeat settings, test parameters).
    """

    def __init__(self, net: VethPair, tmp: Path, worker_script: str, placement: dict[str, str],
                 env: dict[str, str]) -> None:
        self.net = net
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: dict[str, queue.Queue[str]] = {}
        self.output: dict[str, list[str]] = {}
        servers = sorted(n for n in placement if n.startswith("server"))
        workers = sorted(n for n in placement if n.startswith("worker"))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "PSKV_"))}
        base = {**clean, "PYTHONUNBUFFERED": "1", "DMLC_PS_ROOT_URI": CORE_IP,
                "DMLC_NUM_SERVER": str(len(servers)), "DMLC_NUM_WORKER": str(len(workers)),
                "PSKV_SHM": "0",  # array data must cross the veth, not /dev/shm
                "PSKV_JOB_ID": f"net{os.getpid()}{next(_counter)}", **env}
        self.job_id = base["PSKV_JOB_ID"]
        port_file = tmp / "scheduler.port"
        self._start("scheduler", "core", [sys.executable, "-m", "pskv", "scheduler", "--port-file", str(port_file)],
                    {**base, "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0", "DMLC_NODE_HOST": CORE_IP})
        deadline = time.monotonic() + 30
        while not port_file.exists():  # readiness: the port file appears (written atomically)
            if self.procs["scheduler"].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the scheduler did not start: {''.join(self.drain('scheduler'))}")
            time.sleep(0.02)
        base["DMLC_PS_ROOT_PORT"] = port_file.read_text().strip()
        script = tmp / "net_worker.py"
        script.write_text(worker_script)
        for name in servers:
            rank = name.split()[1]
            self._start(name, placement[name], [sys.executable, "-m", "pskv", "server"],
                        {**base, "DMLC_ROLE": "server", "PSKV_SERVER_RANK": rank,
                         "DMLC_NODE_HOST": net.ip[placement[name]]})
        for name in workers:
            rank = name.split()[1]
            self._start(name, placement[name], [sys.executable, str(script)],
                        {**base, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": rank,
                         "DMLC_NODE_HOST": net.ip[placement[name]]})

    def _start(self, name: str, side: str, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(self.net.exec_argv(side, argv), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines: queue.Queue[str] = queue.Queue()
        self.procs[name], self.lines[name], self.output[name] = proc, lines, []

        def read() -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    lines.put(line)
            except ValueError:  # closed by reap()
                pass

        threading.Thread(target=read, name=f"read {name}", daemon=True).start()

    def drain(self, name: str) -> list[str]:
        """Everything ``name`` printed so far."""
        while True:
            try:
                self.output[name].append(self.lines[name].get_nowait())
            except queue.Empty:
                return self.output[name]

    def expect(self, name: str, text: str, timeout: float) -> str:
        """The first line (not seen by an earlier ``expect``) of ``name`` containing ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{name} did not print {text!r} within {timeout} s; it printed:\n"
                                     + "".join(self.output[name][-40:]))
            try:
                line = self.lines[name].get(timeout=min(left, 0.1))
            except queue.Empty:
                if self.procs[name].poll() is not None and self.lines[name].empty():
                    time.sleep(0.05)  # let the reader hand over the last lines
                    if self.lines[name].empty():
                        raise AssertionError(f"{name} exited ({self.procs[name].returncode}) without printing "
                                             f"{text!r}; it printed:\n" + "".join(self.output[name][-40:])) from None
                continue
            self.output[name].append(line)
            if text in line:
                return line

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Exit codes of every process; AssertionError naming those still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        running = [n for n, p in self.procs.items() if p.poll() is None]
        assert not running, f"still running {timeout} s later: {running}; " + self.describe()
        return {n: p.returncode for n, p in self.procs.items()}

    def describe(self) -> str:
        """The last lines of every process (for assertion messages)."""
        parts = []
        for name in self.procs:
            parts.append(f"--- {name}:\n" + "".join(self.drain(name)[-25:]))
        return "\n".join(parts)

    def reap(self) -> None:
        """Kill (by pid) every process of the job still running, and wait for each."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process in D state
                pass
            if proc.stdout is not None:
                proc.stdout.close()
