"""What the launched-job tests share: a tag that marks a job's processes, and finding them."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest


def tagged_pids(tag: str) -> list[int]:
    """Live (not zombie) processes with ``PSKV_TEST_TAG=tag`` in their environment or command line."""
    needle = f"PSKV_TEST_TAG={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{entry}/{what}", "rb") as f:
                    found = needle in f.read().split(b"\0")
            except OSError:
                found = False
            if found and not _zombie(int(entry)):
                pids.append(int(entry))
                break
    return pids


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


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
