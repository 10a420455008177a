"""Where an elastic job's workers may run: ``--host-discovery-script`` (horovodrun's), polled.

The script prints one host per line, ``HOST:SLOTS`` or ``HOST`` (one slot); blank lines and
``#`` comments are skipped. It runs under ``sh -c`` every ``interval`` seconds on a thread of its
own; :meth:`HostDiscovery.slots` is the last good answer. A run that fails, hangs past its
timeout or prints nothing usable leaves the last answer standing (said once a minute at most):
a flaky script must not remove every worker. Without a script the answer is fixed.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

from pskv.errors import LaunchError

__all__ = ["HostDiscovery", "parse_hosts"]

_NOTE_EVERY = 60.0  # seconds between notes of a failing script


def parse_hosts(text: str) -> dict[str, int]:
    """``HOST[:SLOTS]`` lines -> {host: slots} (a host named twice: its slots added).

    Raises:
        ValueError: a line that is not ``HOST`` or ``HOST:SLOTS`` with SLOTS >= 0 (names it).
    """
    hosts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, sep, count = line.rpartition(":") if ":" in line else (line, "", "1")
        if not host or not count.isdigit() or any(c.isspace() for c in host):
            raise ValueError(f"expected HOST or HOST:SLOTS, got {line[:80]!r}")
        hosts[host] = hosts.get(host, 0) + int(count)
    return hosts


class HostDiscovery:
    """The hosts an elastic job may use now.

    Args:
        script: the discovery command (``sh -c``); empty: ``fixed`` always.
        interval: seconds between runs.
        fixed: the answer without a script.
        note: prints a launcher note.
        timeout: seconds one run may take.
    """

    def __init__(self, script: str, interval: float, fixed: dict[str, int], note: Callable[[str], None],
                 timeout: float = 30.0) -> None:
        self._script = script
        self._interval = interval
        self._note = note
        self._timeout = timeout
        self._hosts = dict(fixed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._noted_at = -_NOTE_EVERY
        self._thread: threading.Thread | None = None

    def start(self) -> dict[str, int]:
        """Run the script once (the job's first hosts), then keep polling; returns the first answer.

        Raises:
            LaunchError: the first run failed (nothing to start the job on).
        """
        if self._script:
            try:
                self._hosts = self._run()
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                raise LaunchError(f"--host-discovery-script {self._script!r}: {exc}") from None
            self._thread = threading.Thread(target=self._poll, name="pskv-launch-discovery", daemon=True)
            self._thread.start()
        return dict(self._hosts)

    def slots(self) -> dict[str, int]:
        """The last good answer: {host: slots}."""
        with self._lock:
            return dict(self._hosts)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout + 1)

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                hosts = self._run()
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                now = time.monotonic()
                if now - self._noted_at >= _NOTE_EVERY:
                    self._noted_at = now
                    self._note(f"--host-discovery-script failed ({exc}); keeping the hosts it named before")
                continue
            with self._lock:
                self._hosts = hosts

    def _run(self) -> dict[str, int]:
        done = subprocess.run(["sh", "-c", self._script], capture_output=True, text=True, timeout=self._timeout,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ValueError(f"exited with {done.returncode}: {done.stderr.strip()[-200:]}")
        return parse_hosts(done.stdout)
