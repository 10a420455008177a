"""An elastic job's workers under ``pskv launch -n MIN:MAX``: departures reported, new workers started.

The launcher owns hosts, the scheduler owns views (:mod:`pskv.cluster.elastic`). This module is the
launcher's half, one object the :class:`~pskv.launch.supervisor.Supervisor` calls at two points:

* a worker exits (:meth:`ElasticWorkers.departed`): exiting non-zero or killed, it is a *departure*,
  not the job's root cause. The launcher tells the scheduler at once (``ROSTER gone``: the survivors
  stall for milliseconds, not for the heartbeat timeout), says so in one line, and keeps the slot's
  host place unused for ``--respawn-cooldown`` seconds. A worker's exit 0 means the job is ending:
  no worker is started after it. The last worker's failure is the job's (nobody is left to go on);
* every pass of the supervisor's loop (:meth:`ElasticWorkers.tick`): when the discovered slots
  (``--host-discovery-script``, :mod:`pskv.launch.discovery`; without one: this machine, MAX slots)
  allow more workers than run, up to MAX, a new worker starts with a fresh slot number (slots are
  never reused: a slot is a worker's identity at every server). The scheduler holds its
  registration until the next commit, where it joins.

Below MIN the scheduler holds the job's meetings and, after ``--elastic-timeout``, fails the job
(its exit is then the launcher's root cause, with its message).

Every other job has :class:`FixedWorkers`: no departures, nothing started.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from pskv.errors import LaunchError
from pskv.launch.config import LaunchConfig
from pskv.launch.contract import ProcessSpec
from pskv.launch.discovery import HostDiscovery
from pskv.launch.roster import RosterClient

__all__ = ["FIXED", "ElasticWorkers", "FixedWorkers", "Workers", "workers_of"]


class FixedWorkers:
    """A job of a fixed number of workers: a worker's failure is the job's."""

    def begin(self, start: Start, stop: Callable[[int], None], address: str, token: str, curve_key_file: str,
              ready: Callable[[str], bool] | None = None) -> None:
        pass

    def hosts(self) -> list[str]:
        return []

    def departed(self, spec: ProcessSpec, returncode: int, what: str) -> bool:
        return False

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


class ElasticWorkers:
    """The workers of an elastic job (see the module docstring).

    Args:
        min_workers, max_workers: the job's bounds.
        discovery: where workers may run (started; :meth:`close` stops it).
        cooldown: seconds a departed worker's host place stays unused.
        note: prints a launcher note.
        clock: the time (tests).
    """

    def __init__(self, min_workers: int, max_workers: int, discovery: HostDiscovery, hosts: dict[str, int],
                 cooldown: float, note: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 drain_timeout: float = 60.0) -> None:
        self.min_workers = min_workers
        self.max_workers = max_workers
        self._discovery = discovery
        self._first = _places(hosts, max_workers)  # where the first workers run
        self._cooldown = cooldown
        self._drain_timeout = drain_timeout
        self._note = note
        self._clock = clock
        self.live: dict[int, str] = {}  # slot -> the host (discovered name) it runs on
        self._local: dict[int, int] = {}  # slot -> its local rank on its host (PSKV_LOCAL_RANK)
        self._cooling: list[tuple[float, str]] = []  # (until, host): a departed worker's place
        self._next_slot = 0
        self._ending = False  # a worker exited 0: the job is ending, nothing more starts
        self._draining: dict[int, float] = {}  # slot -> when it was asked to leave at the next commit
        self._start: Start | None = None
        self._ready: Callable[[str], bool] = lambda host: True
        self._stop: Callable[[int], None] = lambda slot: None
        self._roster: RosterClient | None = None

    def begin(self, start: Start, stop: Callable[[int], None], address: str, token: str, curve_key_file: str,
              ready: Callable[[str], bool] | None = None) -> None:
        """Start the first workers (``start(slot, host, local rank)``) once the scheduler listens at ``address``; its
        launch ``token`` goes with every report of an exit. ``stop(slot)`` ends a drained worker that stays too long.
        ``ready(host)``: whether a host found later may take workers now (the ssh launcher's preflight of it)."""
        self._start, self._stop, self._roster = start, stop, RosterClient(address, token, curve_key_file)
        if ready is not None:
            self._ready = ready
        for host in self._first:
            self._launch(host)

    def departed(self, spec: ProcessSpec, returncode: int, what: str) -> bool:
        """Worker ``spec`` exited: True if it is a departure the job goes on without (see the module)."""
        slot = spec.rank if spec.rank is not None else -1
        host = self.live.pop(slot, None)
        if slot in self._draining:
            del self._draining[slot]
            if returncode == 0:  # it left at a commit, as asked
                self._note(f"worker slot {slot} on {spec.host} was drained: it left the job at a commit; "
                           f"{len(self.live)} workers go on")
                return True
        if returncode == 0:
            self._ending = True
            return False
        if host is None or not self.live:  # not one of ours, or the last one: the job's failure
            return False
        self._cooling.append((self._clock() + self._cooldown, host))
        if self._roster is not None:
            self._roster.report("gone", slot)
        self._note(f"worker slot {slot} on {spec.host} {what}: it left the job; {len(self.live)} workers go on "
                   f"(MIN {self.min_workers}, MAX {self.max_workers})")
        return True

    def tick(self) -> None:
        """Start workers where the discovered slots allow more than run (up to MAX)."""
        if self._ending or self._start is None:
            return
        now = self._clock()
        self._cooling = [(until, host) for until, host in self._cooling if until > now]
        free = self._discovery.slots()
        for host in list(self.live.values()) + [host for _, host in self._cooling]:
            free[host] = free.get(host, 0) - 1
        self._drain(free)
        for host in _places({h: n for h, n in free.items() if n > 0 and self._ready(h)}, self.max_workers - len(self.live)):
            self._launch(host)
            self._note(f"started worker slot {self._next_slot - 1} on {host}: it joins at the next commit "
                       f"({len(self.live)} workers)")

    def _drain(self, free: dict[str, int]) -> None:
        """Ask the scheduler to remove the newest workers of hosts that have fewer slots than workers now."""
        now = self._clock()
        for slot, since in self._draining.items():  # asked before: their places count as free already
            free[self.live[slot]] += 1
            if now - since > self._drain_timeout and since >= 0:
                self._note(f"worker slot {slot} did not leave within --drain-timeout {self._drain_timeout:g} s of its "
                           "drain (it made no commit); stopping it: a departure")
                self._draining[slot] = -1.0  # stopped once
                self._stop(slot)
        for slot in sorted(self.live, reverse=True):
            host = self.live[slot]
            if free.get(host, 0) < 0 and slot not in self._draining:
                free[host] += 1
                self._draining[slot] = self._clock()
                if self._roster is not None:
                    self._roster.report("drain", slot)
                self._note(f"{host} has fewer slots now: worker slot {slot} is drained at the next commit")

    def _launch(self, host: str) -> None:
        assert self._start is not None
        slot = self._next_slot
        self._next_slot += 1
        taken = {self._local[s] for s, h in self.live.items() if h == host}
        self._local[slot] = next(i for i in range(len(taken) + 1) if i not in taken)  # the lowest free one
        self.live[slot] = host
        self._start(slot, host, self._local[slot])

    def hosts(self) -> list[str]:
        """The hosts the first workers start on (the discovery's first answer), each once."""
        return list(dict.fromkeys(self._first))

    def close(self) -> None:
        self._discovery.stop()
        if self._roster is not None:
            self._roster.close()


Workers = FixedWorkers | ElasticWorkers
Start = Callable[[int, str, int], None]  # starts worker (slot, host, local rank)
FIXED = FixedWorkers()  # every job's but an elastic one's (it keeps no state)


def workers_of(config: LaunchConfig, note: Callable[[str], None],
               hosts: dict[str, int] | None = None) -> tuple[LaunchConfig, Workers]:
    """``config`` with the number of workers to start first, and its workers: :data:`FIXED` unless elastic.
    Without a discovery script the workers' hosts are ``hosts`` ({name: slots}; default this machine, MAX slots).

    Raises:
        LaunchError: the discovery script failed, or named fewer than MIN slots.
    """
    if not config.elastic:
        return config, FIXED
    hosts_given = bool(hosts)
    discovery = HostDiscovery(config.host_discovery_script, config.discovery_interval,
                              hosts or {"127.0.0.1": config.max_workers}, note)
    hosts = discovery.start()
    first = min(config.max_workers, sum(max(0, n) for n in hosts.values()))
    if first < config.min_workers:
        discovery.stop()
        raise LaunchError(f"{_slots_source(config, hosts_given)} named {first} worker slots; an elastic job needs "
                          f"MIN {config.min_workers} to start")
    workers = ElasticWorkers(config.min_workers, config.max_workers, discovery, hosts, config.respawn_cooldown, note,
                             drain_timeout=config.drain_timeout)
    return dataclasses.replace(config, num_workers=first), workers


def _slots_source(config: LaunchConfig, hosts_given: bool) -> str:
    """What named an elastic job's first slots, for a message: the script, else where the fixed hosts came from."""
    if config.host_discovery_script:
        return "--host-discovery-script"
    if not hosts_given:
        return f"this machine (MAX {config.max_workers})"
    return f"-H {config.hostfile}" if config.hostfile else "the allocation (SLURM_JOB_NODELIST)"


def _places(hosts: dict[str, int], count: int) -> list[str]:
    """Up to ``count`` places on ``hosts`` ({host: free slots}), round-robin over the hosts (as the fixed
    placement: :func:`pskv.launch.ssh.place`)."""
    order = [host for r in range(max(hosts.values(), default=0)) for host, slots in hosts.items() if slots > r]
    return order[:max(0, count)]
