"""The driver side: hand-started jobs and ``pskv launch`` on :mod:`pskv.testing.jobs`, always reaped.

:class:`Proc` is a child in its own session whose output lines a reader thread timestamps
(``time.monotonic()``, the clock the workers' events use), read here as ``@@`` events.
:class:`Job` starts a scheduler on port 0 (``--port-file``), servers and worker scripts by
hand; :class:`Launch` runs the same job under ``pskv launch`` and finds its children
through ``/proc``. Each is a :class:`~pskv.testing.jobs.ProcessGroup`, and
:func:`~pskv.testing.jobs.reap_all` (at exit too) kills whatever is left.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from pskv.testing.jobs import Process, ProcessGroup, reap_all, start_launch, start_nodes

from . import settings
from .settings import COMMON_ENV, CONTRACT_VARS, EVENT, WORKER_SCRIPT

__all__ = ["Job", "Launch", "Proc", "first_after", "log", "reap_all", "send_signal", "strip_log"]


def log(msg: str) -> None:
    """A progress line on stderr."""
    sys.stderr.write(f"[bench_faults {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class Proc(Process):
    """A :class:`~pskv.testing.jobs.Process` (a child in its own session, every output line timestamped)
    whose ``@@`` event lines can be read and waited for."""

    def events(self, source: str | None = None) -> list[dict[str, Any]]:
        """Parsed ``@@`` events; ``source`` filters a launcher's prefix (e.g. ``'[worker 0]'``)."""
        out = []
        with self.cond:
            lines = list(self.lines)
        for t, line in lines:
            i = line.find(EVENT)
            if i < 0 or (source is not None and not line.startswith(source)):
                continue
            try:
                ev = json.loads(line[i + len(EVENT):])
            except ValueError:
                continue
            ev["recv"] = t
            ev["src"] = line[:i].strip() or self.name
            out.append(ev)
        return out

    def wait_event(self, ev: str, timeout: float, source: str | None = None,
                   where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events(source):
                if e["ev"] == ev and (where is None or where(e)):
                    return e
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                return None
            with self.cond:
                self.cond.wait(min(left, 0.2))


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(name))
    return out


def _descendants(pid: int, depth: int) -> list[int]:
    """Children, grandchildren, ... of ``pid`` down to ``depth`` generations (nearest first)."""
    found: list[int] = []
    generation = [pid]
    for _ in range(depth):
        generation = [c for p in generation for c in _children(p)]
        found += generation
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def send_signal(pid: int, sig: signal.Signals) -> float:
    """Send ``sig`` to ``pid``; returns the monotonic time of the injection."""
    t = time.monotonic()
    os.kill(pid, sig)
    return t


def base_env(job_id: str, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without the launch contract, plus the measured pskv/ and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS and not k.startswith("PS_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(settings.SOURCE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "PSKV_BENCH_SOURCE": str(settings.SOURCE),
                "PYTHONUNBUFFERED": "1", "PSKV_JOB_ID": job_id, **COMMON_ENV, **extra})
    return env


class Job:
    """A hand-started job (:func:`~pskv.testing.jobs.start_nodes`): scheduler on port 0, S servers, W worker scripts."""

    def __init__(self, tmp: Path, servers: int, workers: int, spec: dict[str, Any], extra: dict[str, str]) -> None:
        self.tmp = tmp
        self.job_id = f"bf{os.getpid()}-{tmp.name}"
        self.group = ProcessGroup(f"job {tmp.name}", process=Proc)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        start_nodes(self.group, tmp, servers, workers, [sys.executable, str(WORKER_SCRIPT), "_worker", str(spec_path)],
                    base_env(self.job_id, extra))
        self.procs: dict[str, Proc] = {p.name: cast(Proc, p) for p in self.group.procs}

    def wait_ready(self, names: Sequence[str], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for n in names:
            if self.procs[n].wait_event("ready", max(0.1, deadline - time.monotonic())) is None:
                raise RuntimeError(f"{n} did not get ready within {timeout:.0f} s: " + " | ".join(self.procs[n].text()[-6:]))

    def wait_exit(self, names: Sequence[str], timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        return {n: self.procs[n].wait(deadline - time.monotonic()) for n in names}

    def reap(self) -> None:
        """Kill what still runs and remove the job's shared memory (a SIGKILLed server cannot)."""
        self.group.close(grace=0)


class Launch:
    """``pskv launch`` as a child; its children's pids are found through /proc."""

    def __init__(self, tmp: Path, workers: int, servers: int, spec: dict[str, Any], envs: dict[str, str],
                 options: Sequence[str] = (), timeout: int = 120) -> None:
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        args = ["-n", str(workers), "-s", str(servers), "--stop-grace", "2", "--timeout", str(timeout), *options]
        for k, v in {**COMMON_ENV, **envs}.items():
            args += ["--env", f"{k}={v}"]
        args += ["--", sys.executable, str(WORKER_SCRIPT), "_worker", str(spec_path)]
        env = base_env("", {})
        env.pop("PSKV_JOB_ID")  # the launcher draws one per attempt
        self.group = ProcessGroup(f"launch {tmp.name}", process=Proc)
        self.proc = cast(Proc, start_launch(self.group, args, tmp, env))
        self.seen: set[int] = set()

    def child(self, role: str, rank: int | None = None) -> int:
        """The pid of the launcher's (current) process of that role and rank: a grandchild, below its guard."""
        for pid in _descendants(self.proc.pid, 3):
            env = _environ(pid)
            self.seen.add(pid)
            if env.get("DMLC_ROLE") != role:
                continue
            if rank is None or env.get({"server": "PSKV_SERVER_RANK", "worker": "DMLC_WORKER_ID"}[role]) == str(rank):
                return pid
        raise RuntimeError(f"no {role} {rank} among the launcher's children")

    def launcher_lines(self) -> list[str]:
        return [line for line in self.proc.text() if line.startswith("pskv launch: ")]

    def reap(self) -> None:
        """SIGTERM to the launcher (it stops its job); its children by their sessions if it does not end in 15 s."""
        if self.proc.poll() is None:
            kids = _descendants(self.proc.pid, 3) + list(self.seen)
            self.proc.signal(signal.SIGTERM)
            if self.proc.wait(15) is None:
                for pid in kids:
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.killpg(pid, sig)
                        except (ProcessLookupError, PermissionError):
                            pass
        self.group.close(grace=0)


def first_after(p: Proc, after: float, pred: Callable[[str], bool]) -> tuple[float, str] | None:
    """The first line received after monotonic time ``after`` for which ``pred`` holds."""
    with p.cond:
        lines = list(p.lines)
    return next(((t, line) for t, line in lines if t > after and pred(line)), None)


def strip_log(line: str | None) -> str:
    """A log line without the time stamp and logger prefix."""
    if not line:
        return ""
    for marker in ("pskv.scheduler: ", "pskv.server: ", "pskv.membership: ", "pskv.cluster.membership: ",
                   "pskv.kvstore.dist: "):
        if marker in line:
            return line.split(marker, 1)[1][:160]
    return line[-160:]
