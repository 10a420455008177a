"""Process helpers of the distributed benchmark, and the timing protocol its workers share.

Two halves, both importing only the standard library (and NumPy on the worker side), so
that every worker script can import this file — ``_dist_worker_mxnet.py`` runs in the
MXNet venv, the others in pskv's environment:

* **driver side** — :class:`ProcGroup` starts the processes of one cluster (each in its
  own session, so a signal to the group reaches every child it spawned), waits for them
  with hard deadlines, fails fast when any of them dies, and always reaps them: on
  normal exit, on an error, on Ctrl-C (the children are in other sessions and do not
  see the terminal's SIGINT; the driver kills them) and on SIGTERM (turned into
  ``KeyboardInterrupt`` by :func:`install_sigterm_handler`). An ``atexit`` hook kills
  whatever a group still holds if the interpreter exits some other way.
* **worker side** — :func:`sample_with_barrier` (warm-up, then samples of a loop of
  ``iters`` iterations, each sample started by a barrier across the workers, modes
  interleaved), :func:`read_spec` and :func:`emit`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# -- driver side ----------------------------------------------------------------------------
_LIVE_GROUPS: weakref.WeakSet[ProcGroup] = weakref.WeakSet()


class ProcError(RuntimeError):
    """A process of a group failed, or a wait ran past its deadline; the message has the logs' tails."""


class Proc:
    """One started process: its name, ``Popen`` and log files."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.name = name
        self.popen = popen
        self.out_path = out
        self.err_path = err

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while running."""
        return self.popen.poll()

    def stdout(self) -> str:
        """Everything it wrote to stdout (so far)."""
        return self.out_path.read_text(encoding="utf-8", errors="replace") if self.out_path.exists() else ""

    def stderr_tail(self, chars: int = 2500) -> str:
        """The last ``chars`` characters of its stderr."""
        if not self.err_path.exists():
            return ""
        return self.err_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def json_line(self) -> dict[str, Any]:
        """The last stdout line that is a JSON object.

        Raises:
            ProcError: there is none.
        """
        for line in reversed(self.stdout().splitlines()):
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]
        raise ProcError(f"{self.name} printed no JSON line; stderr tail:\n{self.stderr_tail()}")


class ProcGroup:
    """The processes of one cluster. Use as a context manager: leaving it reaps every child.

    Args:
        label: name used in messages.
        logdir: directory for the children's stdout/stderr files (``<name>.out/.err``).
    """

    def __init__(self, label: str, logdir: Path) -> None:
        self.label = label
        self.logdir = logdir
        self.procs: list[Proc] = []
        logdir.mkdir(parents=True, exist_ok=True)
        _LIVE_GROUPS.add(self)

    def __enter__(self) -> ProcGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> Proc:
        """Start ``argv`` with exactly ``env`` in a new session; stdout/stderr go to log files."""
        out, err = self.logdir / f"{name}.out", self.logdir / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=fo,
                                     stderr=fe, start_new_session=True)
        proc = Proc(name, popen, out, err)
        self.procs.append(proc)
        return proc

    def _failure(self, what: str) -> ProcError:
        lines = [f"{self.label}: {what}"]
        for p in self.procs:
            lines.append(f"--- {p.name} (exit status {p.returncode}) stderr tail:\n{p.stderr_tail()}")
        return ProcError("\n".join(lines))

    def _check_alive(self) -> None:
        for p in self.procs:
            rc = p.returncode
            if rc is not None and rc != 0:
                raise self._failure(f"{p.name} exited with status {rc}")

    def wait_for_file(self, path: Path, timeout: float) -> str:
        """The stripped content of ``path`` once it exists (polls every 10 ms).

        Raises:
            ProcError: a process of the group exited with an error first, or the deadline passed.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                text = path.read_text(encoding="ascii").strip()
                if text:
                    return text
            self._check_alive()
            time.sleep(0.01)
        raise self._failure(f"{path.name} did not appear within {timeout:.0f} s")

    def wait(self, procs: Sequence[Proc], timeout: float) -> None:
        """Wait until every process of ``procs`` exited with status 0.

        Any process of the group exiting non-zero fails the wait at once (a dead server
        would otherwise leave the workers waiting for their own timeouts).

        Raises:
            ProcError: a failure or the deadline; the caller's ``with`` then kills the rest.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if all(p.returncode == 0 for p in procs):
                return
            if time.monotonic() >= deadline:
                raise self._failure(f"still running after {timeout:.0f} s: "
                                    + ", ".join(p.name for p in procs if p.returncode is None))
            time.sleep(0.02)

    def close(self, grace: float = 3.0) -> None:
        """Stop every child still running (SIGTERM to its session, then SIGKILL) and reap all."""
        running = [p for p in self.procs if p.popen.poll() is None]
        for p in running:
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in running:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p.popen, signal.SIGKILL)
        for p in self.procs:
            try:
                p.popen.wait(5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
                pass
        # a child may have left its own children behind in its session: kill what is left there
        for p in self.procs:
            _signal_group(p.popen, signal.SIGKILL)
        _LIVE_GROUPS.discard(self)


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(popen.pid, sig)  # start_new_session: the child's pid is its process group id
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _reap_all() -> None:
    for group in list(_LIVE_GROUPS):
        group.close(grace=1.0)


def install_sigterm_handler() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in the main thread, so ``with`` blocks reap children."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for MXNet's scheduler, which cannot pick its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ThreadCpuSampler:
    """Samples the CPU time of every thread of some processes from ``/proc`` (Linux), every ``interval`` s.

    A background thread of the driver reads ``/proc/PID/task/TID/stat`` (user and system
    ticks) and ``comm`` (the thread name: ZeroMQ names its threads ``ZMQbg/IO/N``; Python
    threads keep the process name) and stores timestamped snapshots on the
    ``time.perf_counter()`` clock (CLOCK_MONOTONIC, shared with the workers' timing
    windows). :meth:`usage` then gives each thread's CPU seconds between two instants.
    The workers pause ``PSKV_BENCH_LINGER_S`` seconds after each timed window (see
    :func:`sample_with_barrier`), so the first snapshot after a window is taken while
    every process is still alive and before the next workload's set-up.
    """

    def __init__(self, pids: Mapping[str, int], interval: float = 0.05) -> None:
        self.pids = dict(pids)
        self.interval = interval
        self.snapshots: list[tuple[float, dict[tuple[str, int], tuple[str, float, float]]]] = []
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._stop = False
        import threading

        self._thread = threading.Thread(target=self._run, name="thread-cpu-sampler", daemon=True)

    @staticmethod
    def available() -> bool:
        """True where ``/proc/self/task`` exists."""
        return os.path.isdir("/proc/self/task")

    def start(self) -> ThreadCpuSampler:
        """Start sampling."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last snapshot and stop."""
        self._stop = True
        self._thread.join(5.0)

    def _snapshot(self) -> dict[tuple[str, int], tuple[str, float, float]]:
        out: dict[tuple[str, int], tuple[str, float, float]] = {}
        for name, pid in self.pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                base = f"/proc/{pid}/task/{tid}"
                try:
                    with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
                        comm = f.read().strip()
                    with open(f"{base}/stat", encoding="ascii", errors="replace") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                label = "main" if int(tid) == pid else comm
                out[(name, int(tid))] = (label, int(fields[11]) / self._tick, int(fields[12]) / self._tick)
        return out

    def _run(self) -> None:
        while True:
            self.snapshots.append((time.perf_counter(), self._snapshot()))
            if self._stop:
                return
            time.sleep(self.interval)

    def usage(self, start: float, end: float) -> tuple[float, dict[tuple[str, int], tuple[str, float, float]]]:
        """``(seconds covered, {(process, tid): (thread label, user s, system s)})`` between the
        last snapshot at or before ``start`` and the first at or after ``end``; threads present in both."""
        before = [s for s in self.snapshots if s[0] <= start]
        after = [s for s in self.snapshots if s[0] >= end]
        if not before or not after:
            return 0.0, {}
        (t0, a), (t1, b) = before[-1], after[0]
        used = {}
        for key, (label, u1, s1) in b.items():
            if key in a:
                _, u0, s0 = a[key]
                used[key] = (label, u1 - u0, s1 - s0)
        return t1 - t0, used


# -- worker side ----------------------------------------------------------------------------
Step = Callable[[int], None]


def read_spec(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON spec whose path is the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: <worker script> SPEC.json")
    with open(args[0], encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def sample_with_barrier(steps: dict[str, Step], barrier: Callable[[], None], warmup: int, iters: int,
                        repeats: int, window: list[float] | None = None) -> dict[str, list[float]]:
    """Warm every mode up, then ``repeats`` samples per mode (modes interleaved).

    Every sample starts right after a barrier across the workers, so the workers time the
    same iterations; a sample is the time of ``iters`` iterations divided by ``iters``.

    Args:
        window: if given, receives ``[start of the first sample, end of the last]`` in
            ``time.perf_counter()`` seconds — CLOCK_MONOTONIC on Linux, the same clock in
            every process, so the driver can line it up with its per-thread CPU samples.

    Returns:
        mode -> samples in seconds per iteration, in measurement order.
    """
    for step in steps.values():
        barrier()
        step(max(1, warmup))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    first = last = 0.0
    for _ in range(repeats):
        for name, step in steps.items():
            barrier()
            start = time.perf_counter()
            step(iters)
            last = time.perf_counter()
            first = first or start
            samples[name].append((last - start) / iters)
    if window is not None:
        window[:] = [first, last]
    linger = float(os.environ.get("PSKV_BENCH_LINGER_S", "0") or 0)
    if linger > 0:  # bench_dist.py --thread-cpu: a quiet moment for the sampler's snapshot after the window
        barrier()
        time.sleep(linger)
    return samples


def emit(payload: dict[str, Any]) -> None:
    """Print the worker's result as one JSON line on stdout."""
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()
