"""``MetricsWindow``: the scheduler's record of the metrics nodes report (``pskv top``). No I/O.

Each server and worker sends its :class:`~pskv.protocol.bodies.Counters` with a heartbeat
(at most every :data:`pskv.cluster.membership.METRICS_EVERY` seconds). The scheduler keeps
each node's reports of the last :data:`WINDOW` seconds, timed by its own clock (a peer's
clock is never trusted), and answers a ``METRICS`` request with every node's newest
totals and its rates over that window: ``(newest - oldest) / seconds between them``. A
counter that went down (a replacement process starts from 0) starts the node's reports again.
Memory is bounded: at most :data:`SAMPLES` reports per node, nodes of the job only.
"""

from __future__ import annotations

import time
from collections import deque

from pskv.protocol.bodies import Counters, JobReport, NodeReport

__all__ = ["MetricsWindow", "WINDOW", "SAMPLES"]

WINDOW = 3.0  # seconds of reports the rates are taken over
SAMPLES = 64  # reports kept per node at most
RATED = 5  # the first five counters are totals, rated per second (queue and stalls are "now")


class MetricsWindow:
    """Every node's recent metrics reports.

    Args:
        num_workers: the job's workers.
        num_servers: the job's servers.
    """

    def __init__(self, num_workers: int, num_servers: int) -> None:
        self._workers = num_workers
        self._servers = num_servers
        self._samples: dict[int, deque[tuple[float, Counters]]] = {}

    def add(self, nid: int, counters: Counters, now: float | None = None) -> None:
        """Node ``nid`` reported ``counters`` (a registered node's; the caller checked it)."""
        now = time.monotonic() if now is None else now
        samples = self._samples.get(nid)
        if samples is None:
            samples = self._samples[nid] = deque(maxlen=SAMPLES)
        elif samples and any(new < old for new, old in zip(counters[:RATED], samples[-1][1][:RATED])):
            samples.clear()  # counted down: a new process (its rates start again)
        samples.append((now, counters))
        while len(samples) > 2 and now - samples[1][0] >= WINDOW:  # keep one report older than the window
            samples.popleft()

    def forget(self, nid: int) -> None:
        """A new process took over ``nid``: its reports start again."""
        self._samples.pop(nid, None)

    def rates(self, nid: int) -> tuple[float, float, float, float, float] | None:
        """Per second over the window, of ops, rounds, bytes in, bytes out and wait (None: < 2 reports)."""
        samples = self._samples.get(nid)
        if not samples or len(samples) < 2:
            return None
        (t0, first), (t1, last) = samples[0], samples[-1]
        span = t1 - t0
        if span <= 0:
            return None
        r = [(b - a) / span for a, b in zip(first[:RATED], last[:RATED])]
        return (round(r[0], 3), round(r[1], 3), round(r[2], 1), round(r[3], 1), round(r[4], 4))

    def report(self, states: dict[int, tuple[str, float]], registered: int, workers: int | None = None,
               view: int = 0) -> JobReport:
        """The reply to ``METRICS``: ``states`` maps each node id to (state, seconds since heard); ``workers``:
        the job's workers now (an elastic job's view, whose epoch is ``view``), else the number it was started with."""
        nodes = []
        for nid in sorted(states):
            state, age = states[nid]
            samples = self._samples.get(nid)
            nodes.append(NodeReport(nid, state, age, samples[-1][1] if samples else None, self.rates(nid)))
        return JobReport(self._workers if workers is None else workers, self._servers, registered, tuple(nodes), view)
