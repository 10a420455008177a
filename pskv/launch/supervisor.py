"""Process supervision for ``pskv launch``: start, stream output, find the root cause, stop.

Each child runs in its own session (process group), so a Ctrl-C at the terminal reaches
only the launcher, which then stops the job itself, and stopping a child also stops
whatever it started. Two threads watch each child: one streams its merged
stdout/stderr line by line with a ``[worker 1] `` prefix (to :mod:`pskv.launch.console`),
one waits for its exit and posts it, time-stamped, to the queue the main thread reads. Signal handlers post to
the same queue, so all decisions are taken on the main thread, in time order:

* the first child to exit non-zero or by a signal is the root cause: one line names
  it, every other child is stopped (SIGTERM, then SIGKILL after ``stop_grace``; a child
  started with a stop command — an ``srun`` step — is asked by that command instead, and
  SIGTERM to its group is its hard stop), and the launcher exits with that child's code
  (128+N for signal N);
* a failed server's job is stopped only once the workers still running had up to
  ``_TELL_WORKERS`` seconds to end by themselves: the scheduler tells each worker why the
  server failed (``pskv.create`` or the call waiting raises, naming it), so every worker's
  own output says why, also when it started later than the server failed;
* children that fail afterwards are reported as consequences, not causes;
* SIGINT / SIGTERM to the launcher stop the job (exit 130 / 143), a second one kills
  at once; the ``timeout`` stops it with exit 124;
* when every worker has exited 0, servers and scheduler get ``exit_grace`` seconds
  to exit by themselves (exit 0), else they are stopped (exit 1, and no ``--max-restarts``
  restart: the job's work is done; ``Console.stop_requested``); one killed then by the
  SIGUSR1 that asks it to end (it came before the role could take it) ended as asked;
* what a failed child's output says of its cause is named with it: the peer its
  NodeFailedError blamed, the worker ahead, SLURM's cancelling of its step.

No orphans: every child's stdin is a lifeline, a pipe from the launcher that nobody
writes to, watched by :mod:`pskv.launch.guard` (around each local child; at the far end
of each ssh connection). When the launcher dies — SIGKILL included — the kernel closes
the pipes and every guard ends its process group (workers at once; scheduler and
servers by SIGUSR1, ``pskv.roles``'s "no worker will come"). Once every worker has
exited 0, the launcher closes the roles' lifeline itself: a job whose workers never
created a store ends at once instead of waiting for its registrations.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import IO, Any

from pskv.checkpoints import latest_server_checkpoint
from pskv.errors import LaunchError
from pskv.launch import guard
from pskv.launch.clues import UNEVEN, Clues
from pskv.launch.console import CHUNK, HOLD_SECONDS, Console, Output
from pskv.launch.contract import ProcessSpec
from pskv.launch.elastic import FIXED, Workers

__all__ = ["Console", "Supervisor", "describe_exit", "guard_argv", "signal_name"]

_READER_JOIN = 2.0  # seconds an exit notice waits for the child's last output lines
_KILL_WAIT = 5.0  # seconds to wait for SIGKILLed children before giving up on them
_TELL_WORKERS = 5.0  # seconds running workers get to end by themselves after a server failed (then SIGTERM)
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_FAILURE = 1  # lingering servers or scheduler, or the launcher's own error


def guard_argv(python: str, role: str, stop_grace: float, exit_grace: float, inline: bool = False) -> list[str]:
    """The command prefix that runs a process of ``role`` under :mod:`pskv.launch.guard`.

    A worker is stopped at once when the lifeline closes; a scheduler or server is asked
    to end (SIGUSR1) and stopped only after ``exit_grace`` + ``stop_grace`` + 1 seconds
    (by then a living launcher has stopped it itself). ``inline``: the guard's text on
    the command line (``-c``), for a host where this file may not be (ssh).
    """
    mode = "worker" if role == "worker" else "role"
    later = 0.0 if mode == "worker" else exit_grace + stop_grace + 1.0
    with open(guard.__file__, encoding="utf-8") as f:
        where = ["-c", f.read()] if inline else [guard.__file__]
    return [python, "-S", *where, mode, f"{stop_grace:g}", f"{later:g}", "--"]


def signal_name(signum: int) -> str:
    """``'SIGKILL'`` for 9; ``'signal 99'`` for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int, via_ssh: bool = False) -> str:
    """How a process ended, e.g. ``'exited with code 3'`` or ``'was killed by SIGKILL'``.

    Args:
        returncode: ``Popen.returncode`` (negative: killed by that signal).
        via_ssh: the process was an ssh client (255 is also ssh's own failure code).
    """
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    text = f"exited with code {returncode}"
    if returncode == 126:
        return text + " (the command is not executable)"
    if returncode == 127:
        return text + " (command not found)"
    if via_ssh and returncode == 255:
        return text + " (255 is also ssh's own code for a failed connection or login)"
    if 128 < returncode < 128 + 65 and not signal_name(returncode - 128).startswith("signal"):
        return text + f" (128+{returncode - 128}: a shell's way of saying killed by {signal_name(returncode - 128)})"
    return text


def _exit_status(returncode: int) -> int:
    """The launcher's exit code for a child's: its code, or 128+N for signal N."""
    return 128 - returncode if returncode < 0 else min(returncode, 255)


def _readable(stream: IO[bytes], timeout: float) -> bool:
    """True if ``stream`` has data (or its end) within ``timeout`` seconds (data already in its
    buffer is not seen: it waits for the next read, ``HOLD_SECONDS`` at most)."""
    try:
        return bool(select.select([stream], [], [], timeout)[0])
    except (OSError, ValueError):
        return True


@dataclass(eq=False)
class _Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    reader: threading.Thread
    output: Output
    returncode: int | None = None
    stop_signal: int | None = None
    abandoned: bool = False
    replaced: bool = False  # a failed worker that was started again (--restart-workers)
    clues: Clues = field(default_factory=Clues)  # what its output said of a failure's cause
    stop_argv: tuple[str, ...] = ()  # asks it to stop in place of SIGTERM to its group (see Supervisor.start)

    @property
    def running(self) -> bool:
        return self.returncode is None and not self.abandoned

    @property
    def where(self) -> str:
        return f"{self.spec.name} on {self.spec.host}"


@dataclass(order=True)
class _Event:
    when: float
    kind: str = field(compare=False)  # 'exit' or 'signal'
    child: _Child | None = field(default=None, compare=False)
    code: int = field(default=0, compare=False)  # returncode or signal number


class Supervisor:
    """Starts a job's processes and watches them until the job ends.

    Use as a context manager (it installs SIGINT/SIGTERM handlers when on the main
    thread, and on exit kills anything still running): :meth:`start` each process,
    optionally :meth:`wait_for_port`, then :meth:`run` for the exit code.

    Args:
        console: where output and messages go.
        stop_grace: seconds between the stop signal and SIGKILL.
        exit_grace: seconds servers and scheduler may take to exit after the last worker.
        timeout: seconds this run of the job may take, counted from now (None: no limit).
        via_ssh: the children are ssh clients (changes how exit code 255 is explained).
        worker_restarts: failed workers started again (alone, with the same rank) before a
            failure ends the job; the job must run with ``PSKV_RECOVERY_TIMEOUT``.
        server_restarts: failed servers started again (alone, same rank, loading the
            newest checkpoint in ``checkpoint_dir``); the job must run with
            ``PSKV_SERVER_RECOVERY``. Local processes only (``env`` argv).
        checkpoint_dir: where the checkpoints for ``server_restarts`` are.
        workers: an elastic job's workers (:mod:`pskv.launch.elastic`): departures and new workers.
    """

    def __init__(self, console: Console, *, stop_grace: float = 5.0, exit_grace: float = 30.0,
                 timeout: float | None = None, via_ssh: bool = False, worker_restarts: int = 0,
                 server_restarts: int = 0, checkpoint_dir: str = "", workers: Workers = FIXED) -> None:
        self.workers = workers
        self._console = console
        self._stop_grace = stop_grace
        self._exit_grace = exit_grace
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._via_ssh = via_ssh
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()  # put() is safe in signal handlers
        self._children: list[_Child] = []
        self._previous_handlers: dict[int, Any] = {}
        self._outcome: int | None = None  # the launcher's exit code, once decided
        self._cause = ""  # what ended the job, for consequence messages
        self._grace_at: float | None = None
        self._kill_at: float | None = None
        self._stop_at: float | None = None  # a server failed: the stop waits until then for the workers
        self._abandon_at: float | None = None
        self._stopped: list[str] = []
        self._worker_restarts = worker_restarts
        self._workers_restarted = 0
        self._server_restarts = server_restarts
        self._servers_restarted = 0
        self._checkpoint_dir = checkpoint_dir
        # the lifelines (read end, write end): one for the workers, one for scheduler and servers
        self._lifelines = {"worker": os.pipe(), "role": os.pipe()}

    # -- life cycle ---------------------------------------------------------------------
    def __enter__(self) -> Supervisor:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Kill every child still running (only left after an error), restore signal handlers."""
        for child in self._children:
            if child.running:
                _signal_group(child, signal.SIGKILL)
        for child in self._children:
            if child.running:
                try:
                    child.proc.wait(_KILL_WAIT)
                except subprocess.TimeoutExpired:
                    pass
            child.reader.join(_READER_JOIN)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        for kind in list(self._lifelines):
            for fd in self._lifelines.pop(kind):
                if fd >= 0:
                    os.close(fd)

    def _lifeline(self, spec: ProcessSpec) -> int:
        """The read end of the lifeline ``spec``'s process gets as stdin."""
        return self._lifelines["worker" if spec.is_worker else "role"][0]

    def _release_roles(self) -> None:
        """Every worker exited 0: close the roles' lifeline (their guards ask them to end)."""
        ends = self._lifelines.get("role")
        if ends is not None and ends[1] >= 0:
            os.close(ends[1])
            self._lifelines["role"] = (ends[0], -1)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._events.put(_Event(time.monotonic(), "signal", code=signum))

    # -- starting -----------------------------------------------------------------------
    def start(self, spec: ProcessSpec, stop_argv: Sequence[str] = ()) -> None:
        """Start one process; its output streams to the console from now on.

        ``stop_argv``: a command run here to ask the process to stop, in place of SIGTERM to its
        group, for a process whose starter does not pass SIGTERM on (``srun`` kills its step
        outright: ``scancel --signal=TERM`` of the step asks it instead) or whose group holds
        an ``srun`` of its own (``mpirun`` in an allocation: ``pkill -TERM -P {pid}`` signals
        ``mpirun`` alone); ``{pid}`` in it is the guard's pid. SIGTERM to the group is then
        the hard stop, after ``stop_grace``, and SIGKILL only after that.

        Raises:
            LaunchError: the process could not be started.
        """
        argv = list(spec.argv)
        if not self._via_ssh:  # over ssh the guard runs at the far end (pskv.launch.ssh)
            argv = guard_argv(sys.executable, spec.role, self._stop_grace, self._exit_grace) + argv
        output = self._console.output(spec)
        try:
            proc = subprocess.Popen(argv, stdin=self._lifeline(spec), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            output.close()
            raise LaunchError(f"could not start {spec.name} on {spec.host} ({spec.argv[0]}): {exc}") from exc
        assert proc.stdout is not None
        child = _Child(spec, proc, threading.Thread(), output, stop_argv=tuple(stop_argv))
        reader = threading.Thread(target=self._stream, args=(proc.stdout, child), daemon=True,
                                  name=f"pskv-launch-output-{spec.name}")
        child.reader = reader
        self._children.append(child)
        reader.start()
        threading.Thread(target=self._wait, args=(child,), daemon=True, name=f"pskv-launch-wait-{spec.name}").start()

    def _stream(self, stream: IO[bytes], child: _Child) -> None:
        """Pass the child's output on as it comes (a \\r-updated progress line shows live)."""
        read = getattr(stream, "read1", stream.read)  # read1: what is there, without waiting for more
        try:
            while True:
                if child.output.held and not _readable(stream, HOLD_SECONDS):
                    child.output.show_held()  # an unfinished line (a \r-update, a prompt) shows after a moment
                data = read(CHUNK)
                if not data:
                    break
                for line in child.output.write(data):
                    registered = child.clues.read(line, child.spec.role == "scheduler")
                    if registered is not None:
                        self._console.registered(registered)
        finally:
            stream.close()
            child.output.close()

    def _wait(self, child: _Child) -> None:
        returncode = child.proc.wait()
        when = time.monotonic()
        child.reader.join(_READER_JOIN)  # its last lines come before the launcher's verdict
        self._events.put(_Event(when, "exit", child, returncode))

    def stop_worker(self, rank: int) -> None:
        """Ask the running worker ``rank`` to stop (SIGTERM, or its stop command): an elastic job's drain that did
        not end in time. Its exit is then a departure."""
        for child in self._children:
            if child.running and child.spec.is_worker and child.spec.rank == rank:
                child.stop_signal = signal.SIGTERM
                if child.stop_argv:
                    _ask_to_stop(child)
                else:
                    _signal_group(child, signal.SIGTERM)

    def wait_for_port(self, path: str, timeout: float) -> int | None:
        """Wait until the scheduler writes its port to ``path``, watching the job meanwhile.

        Returns:
            The port, or None when the job ended first (the scheduler died, a signal, the timeout).

        Raises:
            LaunchError: no port within ``timeout`` seconds.
        """
        limit = time.monotonic() + timeout
        while self._outcome is None:
            port = _read_port(path)
            if port is not None:
                return port
            if time.monotonic() >= limit:
                raise LaunchError(f"the scheduler did not publish its port within {timeout:g} s")
            self._pump(0.02)  # the scheduler writes the file once: a cheap, bounded poll
        return None

    # -- supervising --------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """End the job because of the launcher itself (``reason`` is printed); exit code 1."""
        if self._outcome is None:
            self._decide(EXIT_FAILURE, f"{reason}; stopping the job", "the launcher's error")

    def run(self) -> int:
        """Watch the children until all have exited; returns the launcher's exit code."""
        while any(child.running for child in self._children):
            self._pump(0.5)
        for child in self._children:
            child.reader.join(_READER_JOIN)
        if self._stopped:  # in start order: scheduler, servers, workers
            names = [c.spec.name for c in self._children if c.spec.name in self._stopped]
            self._console.note(f"stopped {', '.join(names)}")
        if self._outcome is None:
            self._console.finished(len({c.spec.name for c in self._children if c.spec.role == "worker"}))
        return 0 if self._outcome is None else self._outcome

    def _pump(self, max_wait: float) -> None:
        """Handle the events of the next ``max_wait`` seconds (at most), then the deadlines."""
        wait = max(0.0, min([max_wait] + [t - time.monotonic() for t in self._deadlines()]))
        batch = []
        try:
            batch.append(self._events.get(timeout=wait))
            while True:
                batch.append(self._events.get_nowait())
        except queue.Empty:
            pass
        for event in sorted(batch):  # the earliest exit is the root cause
            if event.kind == "signal":
                self._on_launcher_signal(event.code)
            elif event.child is not None:
                self._on_exit(event.child, event.code)
        self._check_deadlines()

    def _deadlines(self) -> list[float]:
        if self._outcome is None:
            times = [self._deadline, self._grace_at]
        else:  # stopping: the workers told why, then the SIGKILL, then giving up on survivors
            times = [self._stop_at if self._stop_at is not None else
                     self._kill_at if self._abandon_at is None else self._abandon_at]
        return [t for t in times if t is not None]

    def _on_exit(self, child: _Child, returncode: int) -> None:
        if self._outcome is None and self._grace_at is not None and _ended_as_asked(child, returncode):
            self._console.note(f"{child.where} ended by the launcher's word that no worker will come, before it "
                               "was ready for it (every worker had exited 0)")
            returncode = 0
        child.returncode = returncode
        if self._outcome is None and child.spec.is_worker and self.workers.departed(
                child.spec, returncode, describe_exit(returncode, self._via_ssh)):
            child.replaced, returncode = True, 0  # an elastic job goes on without it
        if self._outcome is None and returncode != 0 and child.spec.role == "server" \
                and self._servers_restarted < self._server_restarts and self._restart_server(child, returncode):
            return
        if self._outcome is None and returncode != 0 and child.spec.is_worker \
                and self._workers_restarted < self._worker_restarts:
            self._workers_restarted += 1
            self._console.note(f"{child.where} {describe_exit(returncode, self._via_ssh)}; starting it again "
                               f"({self._workers_restarted} of at most {self._worker_restarts} worker restarts)")
            child.replaced = True
            try:
                self.start(child.spec, child.stop_argv)
            except LaunchError as exc:
                self._decide(EXIT_FAILURE, f"{exc}; stopping the job", "the launcher's error")
            return
        if self._outcome is None:
            if returncode != 0:
                what = f"{child.where} {describe_exit(returncode, self._via_ssh)}{child.clues.hint(child.spec.name)}"
                ahead = child.clues.ahead if child.clues.ahead != child.spec.name else None
                if ahead:  # the worker with the extra step is the cause, whoever raised first
                    what = f"{ahead} is ahead (mismatched step counts: {UNEVEN}): {what}"
                self._decide(_exit_status(returncode), f"{what}; stopping the job",
                             f"{ahead}'s extra step" if ahead else f"{child.spec.name}'s failure",
                             tell_workers=child.spec.role == "server")
                cause = next((c for c in self._children if c.spec.name == ahead), child)
                self._console.report_log(cause.spec.name, cause.output)
            elif self._grace_at is None and all(c.returncode == 0 for c in self._children
                                                if c.spec.is_worker and not c.replaced):
                self._grace_at = time.monotonic() + self._exit_grace
                self._release_roles()
        elif child.stop_signal is not None and returncode in _deaths_by(child.stop_signal):
            self._stopped.append(child.spec.name)
        elif returncode != 0:
            self._console.note(f"{child.where} {describe_exit(returncode, self._via_ssh)}"
                               f"; a consequence of {self._cause}, not a cause")

    def _restart_server(self, child: _Child, returncode: int) -> bool:
        """Start a failed server again from the newest checkpoint; False if there is none."""
        found = latest_server_checkpoint(self._checkpoint_dir, self._console.note) if self._checkpoint_dir else None
        what = f"{child.where} {describe_exit(returncode, self._via_ssh)}"
        if found is None:
            self._console.note(f"{what}; no complete checkpoint in {self._checkpoint_dir or '(no --checkpoint-dir)'} "
                               "to start it again from")
            return False
        argv = list(child.spec.argv)
        at = next((i for i, a in enumerate(argv) if i > 0 and "=" in a and argv[i - 1] != "-u"), 1)
        argv.insert(at, f"PSKV_RESUME_FROM={found}")  # env(1): NAME=VALUE pairs after its options
        self._servers_restarted += 1
        self._console.note(f"{what}; starting it again from checkpoint {found} "
                           f"({self._servers_restarted} of at most {self._server_restarts} server restarts)")
        child.replaced = True
        try:
            self.start(dataclasses.replace(child.spec, argv=tuple(argv)), child.stop_argv)
        except LaunchError as exc:
            self._decide(EXIT_FAILURE, f"{exc}; stopping the job", "the launcher's error")
        return True

    def _on_launcher_signal(self, signum: int) -> None:
        name = signal_name(signum)
        self._console.stop_requested = True
        if self._outcome is None:
            self._decide(128 + signum, f"received {name}; stopping the job", f"{name} to the launcher")
        elif self._stop_at is not None:
            self._stop_children()
        elif self._kill_at is not None and self._abandon_at is None:
            self._console.note(f"received {name} again; killing every process now")
            self._kill_at = time.monotonic()

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if self._outcome is None:
            if self._grace_at is None:
                self.workers.tick()  # an elastic job's new workers
            if self._deadline is not None and now >= self._deadline:
                self._console.stop_requested = True
                self._decide(EXIT_TIMEOUT, f"the job did not finish within --timeout {self._timeout:g} s; "
                             "stopping it", "the timeout")
            elif self._grace_at is not None and now >= self._grace_at:
                names = ", ".join(c.where for c in self._children if c.running)
                self._decide(EXIT_FAILURE, f"every worker exited 0, but {names} did not exit within "
                             f"{self._exit_grace:g} s after the last worker; stopping them", "the launcher stopping them")
            return
        if self._stop_at is not None and (now >= self._stop_at or not any(
                c.running for c in self._children if c.spec.is_worker)):
            self._stop_children()
        elif self._kill_at is not None and now >= self._kill_at and self._abandon_at is None:
            self._kill_late(now)
        elif self._abandon_at is not None and now >= self._abandon_at:
            self._abandon_survivors(now)

    def _kill_late(self, now: float) -> None:
        """``stop_grace`` is over: SIGKILL to the children still there (SIGTERM to those with a stop command)."""
        late = [c for c in self._children if c.running]
        if late:
            self._console.note(f"{', '.join(c.where for c in late)} did not stop within "
                               f"{self._stop_grace:g} s; killing (SIGKILL)")
        for child in late:  # a process asked by its stop command: SIGTERM to srun is its hard stop
            child.stop_signal = signal.SIGTERM if child.stop_argv else signal.SIGKILL
            _signal_group(child, child.stop_signal)
        self._abandon_at = now + _KILL_WAIT

    def _abandon_survivors(self, now: float) -> None:
        """SIGKILL to those that outlived their hard stop's SIGTERM; give up on those that outlived SIGKILL."""
        hard = [c for c in self._children if c.running and c.stop_signal == signal.SIGTERM]
        for child in hard:
            child.stop_signal = signal.SIGKILL
            _signal_group(child, signal.SIGKILL)
        if hard:
            self._abandon_at = now + _KILL_WAIT
            return
        for child in self._children:
            if child.running:
                self._console.note(f"{child.where} (pid {child.proc.pid}) survived SIGKILL; giving up on it")
                child.abandoned = True

    def _decide(self, exit_code: int, message: str, cause: str, tell_workers: bool = False) -> None:
        """Fix the job's outcome, say why, and stop every running child (SIGTERM): with ``tell_workers``, once
        the workers still running had ``_TELL_WORKERS`` seconds to end by themselves."""
        self._outcome = exit_code
        self._cause = cause
        if self._grace_at is not None:  # every worker exited 0: the work is done, a restart would redo it
            self._console.stop_requested = True
        self._console.note(message)
        if tell_workers and any(c.running for c in self._children if c.spec.is_worker):
            self._stop_at = time.monotonic() + min(_TELL_WORKERS, self._stop_grace)
            return
        self._stop_children()

    def _stop_children(self) -> None:
        """SIGTERM (or the stop command) to every running child; SIGKILL after ``stop_grace``."""
        self._stop_at = None
        for child in self._children:
            if child.running:
                child.stop_signal = signal.SIGTERM
                if child.stop_argv:
                    _ask_to_stop(child)
                else:
                    _signal_group(child, signal.SIGTERM)
        self._kill_at = time.monotonic() + self._stop_grace


def _ended_as_asked(child: _Child, returncode: int) -> bool:
    """A scheduler or server killed by the roles' SIGUSR1 ("no worker will come") before it could take it: under
    ``srun`` / ``mpirun`` the signal may reach the role's ``sh`` before its ``trap`` (:mod:`pskv.launch.slurm`)."""
    return not child.spec.is_worker and returncode in (-signal.SIGUSR1, 128 + signal.SIGUSR1)


def _deaths_by(signum: int) -> set[int]:
    """Exit codes of a process that died of ``signum`` (or of the SIGKILL that may follow)."""
    return {-signum, 128 + signum, -signal.SIGKILL, 128 + signal.SIGKILL}


def _signal_group(child: _Child, signum: int) -> None:
    # start_new_session made the child a group leader: its group id is its pid. The
    # group outlives the leader only while members remain, so this reaches exactly the
    # processes the child started.
    if child.proc.returncode is not None:
        return
    try:
        os.killpg(child.proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _ask_to_stop(child: _Child) -> None:
    """Run the child's stop command (reaped by a thread: the main thread never waits for it)."""
    try:
        proc = subprocess.Popen([a.replace("{pid}", str(child.proc.pid)) for a in child.stop_argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        _signal_group(child, signal.SIGTERM)
        return
    threading.Thread(target=proc.wait, daemon=True, name="pskv-launch-stop").start()


def _read_port(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
