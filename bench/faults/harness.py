"""The driver side: processes with timestamped output, hand-started jobs, ``pskv launch``, always reaped.

:class:`Proc` is one child in its own session whose output lines a reader thread
timestamps (``time.monotonic()``, the clock the workers' events use). :class:`Job` starts a
scheduler on a free port (``--port-file``), servers and worker scripts by hand;
:class:`Launch` runs the same job under ``pskv launch`` and finds its children through
``/proc``. Every job registers itself until reaped, and :func:`reap_all` (at exit too)
kills whatever is left.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import settings
from .settings import COMMON_ENV, CONTRACT_VARS, EVENT, WORKER_SCRIPT

_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


def log(msg: str) -> None:
    """A progress line on stderr."""
    sys.stderr.write(f"[bench_faults {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class Proc:
    """A child in its own session; a reader thread timestamps every output line (stdout+stderr)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.popen = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.eof = False
        self.exit_time: float | None = None
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        try:
            for line in self.popen.stdout:
                with self.cond:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                    self.cond.notify_all()
        except (ValueError, OSError):
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is not None and self.exit_time is None:
            self.exit_time = time.monotonic()
        return rc

    def find(self, pred: Callable[[str], bool], timeout: float, start: int = 0) -> tuple[float, str] | None:
        """The first line (from index ``start``) for which ``pred`` holds, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i][1]):
                        return self.lines[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.2))

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

    def text(self) -> list[str]:
        with self.cond:
            return [line for _, line in self.lines]

    def wait(self, timeout: float) -> int | None:
        """The exit status once the process ended and its output was read to the end (None: still running)."""
        try:
            rc = self.popen.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        self.poll()
        self._reader.join(5)  # the last lines may still be in the pipe
        return rc

    def kill_tree(self) -> None:
        """SIGCONT + SIGKILL to its session (its process group)."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def finish(self) -> None:
        """Kill it if still running, wait for it, and read its output to the end."""
        if self.popen.poll() is None:
            self.kill_tree()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - uninterruptible sleep
            pass
        self.poll()
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


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
    """A hand-started job: scheduler (free port via --port-file), S servers, W worker scripts."""

    def __init__(self, tmp: Path, servers: int, workers: int, spec: dict[str, Any], extra: dict[str, str]) -> None:
        self.tmp = tmp
        self.procs: dict[str, Proc] = {}
        self.job_id = f"bf{os.getpid()}-{tmp.name}"
        with _LIVE_LOCK:
            _LIVE.add(self)
        base = base_env(self.job_id, extra)
        base.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NODE_HOST": "127.0.0.1",
                     "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers)})
        port_file = tmp / "port"
        self.procs["scheduler"] = Proc("scheduler", [sys.executable, "-m", "pskv", "scheduler", "--port-file",
                                                     str(port_file)],
                                       {**base, "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0"}, tmp)
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.procs["scheduler"].poll() is not None:
                raise RuntimeError("the scheduler did not publish its port: "
                                   + " | ".join(self.procs["scheduler"].text()[-5:]))
            time.sleep(0.02)
        base["DMLC_PS_ROOT_PORT"] = port_file.read_text().strip()
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        for s in range(servers):
            self.procs[f"server {s}"] = Proc(f"server {s}", [sys.executable, "-m", "pskv", "server"],
                                             {**base, "DMLC_ROLE": "server", "PSKV_SERVER_RANK": str(s)}, tmp)
        for w in range(workers):
            self.procs[f"worker {w}"] = Proc(f"worker {w}",
                                             [sys.executable, str(WORKER_SCRIPT), "_worker", str(spec_path)],
                                             {**base, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)}, tmp)

    def wait_ready(self, names: Sequence[str], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for n in names:
            if self.procs[n].wait_event("ready", max(0.1, deadline - time.monotonic())) is None:
                raise RuntimeError(f"{n} did not get ready within {timeout:.0f} s: " + " | ".join(self.procs[n].text()[-6:]))

    def wait_exit(self, names: Sequence[str], timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        return {n: self.procs[n].wait(deadline - time.monotonic()) for n in names}

    def reap(self) -> None:
        """Kill what still runs and remove the job's shared memory."""
        for p in self.procs.values():
            p.finish()
        from pskv.transport.shm import remove_job_files

        remove_job_files(self.job_id)  # a SIGKILLed server cannot remove its shared memory
        with _LIVE_LOCK:
            _LIVE.discard(self)


class Launch:
    """``pskv launch`` as a child; its children's pids are found through /proc."""

    def __init__(self, tmp: Path, workers: int, servers: int, spec: dict[str, Any], envs: dict[str, str],
                 options: Sequence[str] = (), timeout: int = 120) -> None:
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        args = [sys.executable, "-m", "pskv", "launch", "-n", str(workers), "-s", str(servers), "--stop-grace", "2",
                "--timeout", str(timeout), *options]
        for k, v in {**COMMON_ENV, **envs}.items():
            args += ["--env", f"{k}={v}"]
        args += ["--", sys.executable, str(WORKER_SCRIPT), "_worker", str(spec_path)]
        env = base_env("", {})
        env.pop("PSKV_JOB_ID")  # the launcher draws one per attempt
        self.proc = Proc("launch", args, env, tmp)
        self.seen: set[int] = set()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def child(self, role: str, rank: int | None = None) -> int:
        """The pid of the launcher's (current) child of that role and rank."""
        for pid in _children(self.proc.pid):
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
        if self.proc.popen.poll() is None:
            kids = _children(self.proc.pid) + list(self.seen)
            try:
                self.proc.popen.send_signal(signal.SIGTERM)  # it stops its job
            except ProcessLookupError:
                pass
            if self.proc.wait(15) is None:
                for pid in kids:
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.killpg(pid, sig)
                        except (ProcessLookupError, PermissionError):
                            pass
        self.proc.finish()
        with _LIVE_LOCK:
            _LIVE.discard(self)


@atexit.register
def reap_all() -> None:
    """Reap every job and launcher still running (at exit, and when the run's deadline passed)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for item in live:
        try:
            item.reap()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


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
