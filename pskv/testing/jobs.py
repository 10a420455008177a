"""Real processes for tests and benchmarks: one harness for every job pskv runs as processes.

* :class:`Process` — one child in a session of its own (a signal to the session reaches
  whatever it started); a reader thread keeps its output lines, timestamped with
  ``time.monotonic()``, so a test waits for a line (:meth:`Process.expect`) instead of sleeping.
* :class:`ProcessGroup` — the processes of one job, started together and reaped together:
  leaving its ``with`` block, :meth:`ProcessGroup.close` or, last, an ``atexit`` hook stops
  every session still running (SIGTERM, then SIGKILL) and waits for each child. Waits have
  deadlines and fail fast when a process of the group dies (:class:`JobError` with every
  process's last lines).
* :func:`start_nodes` — a scheduler on port 0 (its ``--port-file`` is the readiness
  signal), then servers and workers, each with the ``DMLC_*`` contract; optionally each
  entered through a command prefix (``ip netns exec NS``, a profiler) at its own address.
* :func:`start_launch` / :func:`run_launch` — ``python -m pskv launch ...`` as a child
  (marked with ``PSKV_TEST_TAG`` so :func:`tagged_pids` finds what it started), and the
  same run to its end under a hard deadline.

Standard library and pskv only (no pytest): ``bench/`` drives its clusters with it too.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pskv.transport.shm import remove_job_files

__all__ = ["LOCALHOST", "SOURCE", "JobError", "Process", "ProcessGroup", "child_env", "free_port", "reap_all", "run_launch",
           "start_launch", "start_nodes", "tagged_pids"]

LOCALHOST = "127.0.0.1"
SOURCE = Path(__file__).resolve().parents[2]  # the directory holding this pskv package
_LIVE: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()
_job_ids = itertools.count()


class JobError(RuntimeError):
    """A process of a job failed, or a wait ran past its deadline; the message has the output tails."""


def child_env(extra: Mapping[str, str] | None = None, paths: Sequence[str | os.PathLike[str]] = ()) -> dict[str, str]:
    """This process's environment plus ``extra``, with :data:`SOURCE` and ``paths`` first on ``PYTHONPATH``.

    So ``python -m pskv`` in any working directory runs this pskv, and modules in ``paths``
    (e.g. a test's controller module) are importable by every process of the job.
    """
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE), *map(str, paths), *filter(None, [env.get("PYTHONPATH")])])
    return env


class Process:
    """A child in its own session; a reader thread keeps its output lines (stdout, and stderr unless ``stderr``).

    Args:
        name: its name in messages (``"worker 0"``).
        argv, env, cwd: what to run, with exactly that environment, where.
        stderr: a file for its stderr (kept apart from the lines); None: merged into the lines.

    Attributes:
        lines: ``(time.monotonic() when read, line without its newline)``, guarded by ``cond``.
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None,
                 stderr: Path | None = None) -> None:
        self.name = name
        self.stderr_path = stderr
        err_file = open(stderr, "wb") if stderr is not None else None  # noqa: SIM115 - the child holds it
        try:
            self.popen = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE,
                                          stderr=err_file if err_file is not None else subprocess.STDOUT,
                                          text=True, errors="replace", start_new_session=True)
        finally:
            if err_file is not None:
                err_file.close()
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.eof = False
        self.exit_time: float | None = None
        self._seen = 0  # lines passed by expect()
        self._reader = threading.Thread(target=self._read, name=f"read {name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        try:
            for line in self.popen.stdout:
                with self.cond:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                    self.cond.notify_all()
        except (ValueError, OSError):  # closed by finish()
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    # -- state ----------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit status, or None while it runs (the first time it is seen ended is ``exit_time``)."""
        rc = self.popen.poll()
        if rc is not None and self.exit_time is None:
            self.exit_time = time.monotonic()
        return rc

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def text(self) -> list[str]:
        """Every line it printed so far."""
        with self.cond:
            return [line for _, line in self.lines]

    def output(self) -> str:
        """Everything it printed so far, as one string."""
        return "".join(line + "\n" for line in self.text())

    def stderr_tail(self, chars: int = 2500) -> str:
        """The last ``chars`` characters of its stderr (of its output, where stderr is merged)."""
        if self.stderr_path is None:
            return self.output()[-chars:]
        if not self.stderr_path.exists():
            return ""
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def json_line(self) -> dict[str, Any]:
        """The last line it printed that is a JSON object.

        Raises:
            JobError: there is none.
        """
        for line in reversed(self.text()):
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]
        raise JobError(f"{self.name} printed no JSON line; stderr tail:\n{self.stderr_tail()}")

    # -- waiting ---------------------------------------------------------------------------
    def find(self, pred: Callable[[str], bool], timeout: float, start: int = 0) -> tuple[float, str] | None:
        """The first ``(time, line)`` from line ``start`` on for which ``pred`` holds, waiting up to ``timeout`` s.

        None if the time ran out or the output ended without one.
        """
        at = self._index(pred, timeout, start)
        return None if at is None else self.lines[at]

    def _index(self, pred: Callable[[str], bool], timeout: float, start: int) -> int | None:
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i][1]):
                        return i
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.2))

    def expect(self, text: str, timeout: float) -> str:
        """The first line, after those an earlier ``expect`` passed, that contains ``text``.

        Raises:
            JobError: not printed within ``timeout`` s, or the process ended without it.
        """
        at = self._index(lambda line: text in line, timeout, self._seen)
        if at is None:
            ended = "ended without printing" if self.eof else f"did not print within {timeout:g} s"
            raise JobError(f"{self.name} {ended} {text!r}; its last lines:\n" + "\n".join(self.text()[-40:]))
        self._seen = at + 1
        return self.lines[at][1]

    def wait(self, timeout: float) -> int | None:
        """The exit status once it ended and its output was read to the end; None if still running."""
        try:
            rc = self.popen.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        self.poll()
        self._reader.join(5)  # the last lines may still be in the pipe
        return rc

    # -- ending ----------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process itself (not its session)."""
        try:
            self.popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def signal_session(self, sig: int) -> None:
        """Send ``sig`` to its session (its process group: everything it started and did not move)."""
        try:
            os.killpg(self.popen.pid, sig)  # start_new_session: the child's pid is its process group id
        except (ProcessLookupError, PermissionError):
            pass

    def kill_tree(self) -> None:
        """SIGCONT (a stopped process dies at once) and SIGKILL to its session."""
        self.signal_session(signal.SIGCONT)
        self.signal_session(signal.SIGKILL)

    def finish(self, grace: float = 0.0) -> None:
        """End it (SIGTERM to its session and ``grace`` s first, if any; then SIGKILL), reap it, read it to the end.

        Whatever it left in its session is killed too.
        """
        if self.popen.poll() is None and grace > 0:
            self.signal_session(signal.SIGTERM)
            self.wait(grace)
        if self.popen.poll() is None:
            self.kill_tree()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass
        self.kill_tree()  # what it started and left behind in its session
        self.poll()
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


class ProcessGroup:
    """The processes of one job; a context manager that reaps every one of them.

    Args:
        label: the job's name in messages.
        logdir: where each process's stderr goes (``<name>.err``, kept apart from its
            lines); None: stderr is merged into the lines.
        process: the class of its processes (a subclass that reads more into the lines).
    """

    def __init__(self, label: str = "job", logdir: Path | None = None, process: type[Process] = Process) -> None:
        self.label = label
        self.logdir = logdir
        self._process = process
        self.procs: list[Process] = []
        self._cleanups: list[Callable[[], object]] = []
        if logdir is not None:
            logdir.mkdir(parents=True, exist_ok=True)
        _LIVE.add(self)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Process:
        for p in self.procs:
            if p.name == name:
                return p
        raise KeyError(f"{self.label} has no process {name!r}")

    def names(self) -> list[str]:
        return [p.name for p in self.procs]

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str],
              cwd: str | os.PathLike[str] | None = None) -> Process:
        """Start ``argv`` with exactly ``env`` as process ``name`` of the group."""
        err = self.logdir / f"{name.replace(' ', '')}.err" if self.logdir is not None else None
        proc = self._process(name, argv, env, cwd, stderr=err)
        self.procs.append(proc)
        return proc

    def on_close(self, cleanup: Callable[[], object]) -> None:
        """Call ``cleanup`` once every process is reaped (e.g. remove what a killed server left)."""
        self._cleanups.append(cleanup)

    # -- waiting ---------------------------------------------------------------------------
    def expect(self, name: str, text: str, timeout: float) -> str:
        """:meth:`Process.expect` of process ``name``, with every process's last lines in the error."""
        try:
            return self[name].expect(text, timeout)
        except JobError as exc:
            raise JobError(f"{exc}\n{self.describe()}") from None

    def describe(self, lines: int = 25) -> str:
        """The exit status and last ``lines`` lines of every process (for failure messages)."""
        return "\n".join(f"--- {p.name} (exit status {p.returncode}):\n" + "\n".join(p.text()[-lines:])
                         for p in self.procs)

    def failure(self, what: str) -> JobError:
        """A :class:`JobError` saying ``what``, with every process's exit status and stderr tail."""
        parts = [f"{self.label}: {what}"]
        parts += [f"--- {p.name} (exit status {p.returncode}) stderr tail:\n{p.stderr_tail()}" for p in self.procs]
        return JobError("\n".join(parts))

    def check(self) -> None:
        """Raise :class:`JobError` if a process of the group exited with an error."""
        for p in self.procs:
            rc = p.returncode
            if rc is not None and rc != 0:
                raise self.failure(f"{p.name} exited with status {rc}")

    def wait_for_file(self, path: Path, timeout: float) -> str:
        """The stripped text of ``path`` once it exists and is not empty (a readiness signal).

        Raises:
            JobError: a process of the group failed first, or the deadline passed.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and (text := path.read_text(encoding="utf-8").strip()):
                return text
            self.check()
            time.sleep(0.01)
        raise self.failure(f"{path.name} did not appear within {timeout:g} s")

    def wait(self, procs: Sequence[Process], timeout: float) -> None:
        """Wait until every process of ``procs`` exited with status 0.

        Any process of the group exiting non-zero fails the wait at once (a dead server
        would otherwise leave the workers waiting for their own timeouts).

        Raises:
            JobError: a failure, or the deadline.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            if all(p.returncode == 0 for p in procs):
                return
            if time.monotonic() >= deadline:
                raise self.failure(f"still running after {timeout:g} s: "
                                   + ", ".join(p.name for p in procs if p.returncode is None))
            time.sleep(0.02)

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Every process's exit status, whatever it is, once all ended.

        Raises:
            JobError: some still run ``timeout`` s later (named, with everyone's last lines).
        """
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(deadline - time.monotonic())
        running = [p.name for p in self.procs if p.returncode is None]
        if running:
            raise JobError(f"still running {timeout:g} s later: {running}\n{self.describe()}")
        return {p.name: p.popen.returncode for p in self.procs}

    def close(self, grace: float = 3.0) -> None:
        """Stop every process still running (SIGTERM to its session, SIGKILL after ``grace`` s), reap all."""
        for p in self.procs:
            if p.popen.poll() is None:
                p.signal_session(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.wait(deadline - time.monotonic())
        for p in self.procs:
            p.finish()
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            cleanup()
        _LIVE.discard(self)


@atexit.register
def reap_all() -> None:
    """Close every group still open (at exit too: a driver that ended some other way leaves nothing running)."""
    for group in list(_LIVE):
        group.close(grace=1.0)


# -- a job started by hand ----------------------------------------------------------------
def _here(name: str, argv: list[str]) -> list[str]:
    return argv


def _localhost(name: str) -> str:
    return LOCALHOST


def start_nodes(group: ProcessGroup, workdir: Path, servers: int, workers: int, worker_argv: Sequence[str] | None,
                env: Mapping[str, str], server_argv: Sequence[str] | None = None,
                enter: Callable[[str, list[str]], list[str]] = _here, address: Callable[[str], str] = _localhost,
                timeout: float = 60.0, cwd: Path | None = None) -> dict[str, str]:
    """Start a job by hand in ``group``: a scheduler on port 0, ``servers`` servers, ``workers`` workers.

    The processes are named ``"scheduler"``, ``"server 0"``, ..., ``"worker 0"``, ...; the
    servers and workers start once the scheduler wrote its port (``--port-file``).

    Args:
        workdir: the directory of the scheduler's port file.
        worker_argv: each worker's program (None: start no workers; the caller does).
        env: the environment of every process (:func:`child_env`); a ``PSKV_JOB_ID`` is
            added if it has none, and the job's shared memory is removed at ``group.close()``.
        server_argv: each server's program; default ``python -m pskv server``.
        enter: ``(name, argv) -> the argv to run`` (e.g. ``ip netns exec NS`` or a profiler in front).
        address: ``name -> the host address`` of that process (``DMLC_NODE_HOST``; the
            scheduler's is everyone's ``DMLC_PS_ROOT_URI``).
        timeout: seconds the scheduler may take to write its port.
        cwd: every process's working directory (default ``workdir``).

    Returns:
        The job's environment, with ``DMLC_PS_ROOT_PORT`` (to start more processes with).

    Raises:
        JobError: the scheduler ended, or wrote no port in time.
    """
    base = {**env, "DMLC_PS_ROOT_URI": address("scheduler"), "DMLC_NUM_SERVER": str(servers),
            "DMLC_NUM_WORKER": str(workers), "PYTHONUNBUFFERED": "1"}
    base.setdefault("PSKV_JOB_ID", f"t{os.getpid()}x{next(_job_ids)}")
    job_id = base["PSKV_JOB_ID"]
    group.on_close(lambda: remove_job_files(job_id))  # a SIGKILLed server cannot remove its shared memory
    port_file = workdir / f"{job_id}.port"

    def start(name: str, argv: Sequence[str], role: dict[str, str]) -> None:
        group.start(name, enter(name, list(argv)), {**base, **role, "DMLC_NODE_HOST": address(name)},
                    cwd=cwd or workdir)

    start("scheduler", [sys.executable, "-m", "pskv", "scheduler", "--port-file", str(port_file)],
          {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0"})
    base["DMLC_PS_ROOT_PORT"] = group.wait_for_file(port_file, timeout)
    for s in range(servers):
        start(f"server {s}", server_argv or [sys.executable, "-m", "pskv", "server"],
              {"DMLC_ROLE": "server", "PSKV_SERVER_RANK": str(s)})
    if worker_argv is not None:
        for w in range(workers):
            start(f"worker {w}", worker_argv, {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)})
    return base


# -- a job under pskv launch --------------------------------------------------------------
def start_launch(group: ProcessGroup, args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None,
                 tag: str | None = None, module: Sequence[str] = ("pskv", "launch"),
                 enter: Sequence[str] = (), name: str = "launch") -> Process:
    """Start ``python -m pskv launch ARGS`` (or ``-m MODULE``) as process ``name`` of ``group``.

    Args:
        env: its environment; default :func:`child_env`.
        tag: passed to every process of the job as ``PSKV_TEST_TAG`` (see :func:`tagged_pids`).
        enter: a command prefix to run it through (e.g. ``ip netns exec NS``).
    """
    tagged = ["--env", f"PSKV_TEST_TAG={tag}"] if tag is not None else []
    argv = [*enter, sys.executable, "-m", *module, *tagged, *args]
    return group.start(name, argv, child_env() if env is None else env, cwd=cwd)


def run_launch(args: Sequence[str], cwd: Path, deadline: float, env: Mapping[str, str] | None = None,
               tag: str | None = None, module: Sequence[str] = ("pskv", "launch")) -> tuple[int, str]:
    """Run ``python -m pskv launch ARGS`` to its end; (exit code, its output: stdout and stderr merged).

    Raises:
        JobError: it did not end within ``deadline`` s (it and everything it started are killed).
    """
    with ProcessGroup("pskv launch") as group:
        proc = start_launch(group, args, cwd, env, tag, module)
        code = proc.wait(deadline)
        if code is None:
            proc.kill_tree()
            proc.wait(10)
            raise JobError(f"the launcher did not finish within {deadline:g} s:\n{proc.output()}")
        return code, proc.output()


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


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that was free a moment ago (for programs that cannot bind port 0 and report it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
