"""Fixtures of the fault tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fault.netns import Unavailable, VethPair


@pytest.fixture
def net() -> Iterator[VethPair]:
    """A veth pair between two fresh namespaces; deleted when the test ends, whatever happens."""
    try:
        pair = VethPair()
    except Unavailable as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")
    try:
        yield pair
    finally:
        pair.destroy()
