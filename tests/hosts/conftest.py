"""Fixtures of the simulated-host tests: :class:`~pskv.testing.hosts.SimulatedHosts`, skipped where not permitted."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pskv.testing.hosts import SimulatedHosts, Unavailable


@pytest.fixture
def simulated_hosts() -> Iterator[Callable[..., SimulatedHosts]]:
    """``make(count, rate=None, delay=None)``: hosts removed at the end of the test; skips if unavailable."""
    made: list[SimulatedHosts] = []

    def make(count: int, rate: str | None = None, delay: str | None = None) -> SimulatedHosts:
        try:
            hosts = SimulatedHosts(count, rate=rate, delay=delay)
        except Unavailable as exc:
            pytest.skip(f"simulated hosts unavailable: {exc}")
        made.append(hosts)
        return hosts

    yield make
    for hosts in made:
        hosts.destroy()
        assert hosts.all_of_this_process() == []
