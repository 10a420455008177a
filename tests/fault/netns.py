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
  processes (a :class:`~pskv.testing.jobs.ProcessGroup`), each started with
  ``ip netns exec <ns> python ...`` and the ``DMLC_*`` contract pointing at those
  addresses; every process is reaped when the group closes.

A host where namespaces, veth or ``tc`` are not permitted raises :class:`Unavailable`
(the tests turn it into a skip).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pskv.testing.jobs import ProcessGroup, child_env, start_nodes

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


class NetJob(ProcessGroup):
    """A pskv job whose processes run in the namespaces of a :class:`VethPair` (:func:`~pskv.testing.jobs.start_nodes`).

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
        super().__init__("net job")
        side = {"scheduler": "core", **placement}
        clean = {k: v for k, v in child_env().items() if not k.startswith(("DMLC_", "PS_", "PSKV_"))}
        script = tmp / "net_worker.py"
        script.write_text(worker_script)
        try:
            started = start_nodes(
                self, tmp, servers=sum(n.startswith("server") for n in side),
                workers=sum(n.startswith("worker") for n in side), worker_argv=[sys.executable, str(script)],
                env={**clean, "PSKV_SHM": "0",  # array data must cross the veth, not /dev/shm
                     "PSKV_JOB_ID": f"net{os.getpid()}{next(_counter)}", **env},
                enter=lambda name, argv: net.exec_argv(side[name], argv), address=lambda name: net.ip[side[name]],
                timeout=30)
        except BaseException:
            self.close(grace=0)
            raise
        self.job_id = started["PSKV_JOB_ID"]
