"""What the launched-job tests share: a tag that marks a job's processes (:func:`~pskv.testing.jobs.tagged_pids`)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from pskv.testing.jobs import tagged_pids

__all__ = ["tag", "tagged_pids"]


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique tag for the processes of one test; stragglers are killed at the end."""
    value = uuid.uuid4().hex
    yield value
    for pid in tagged_pids(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
