"""The console of ``pskv launch``: where the children's output and the launcher's notes go.

Presentation only, apart from :mod:`pskv.launch.supervisor`, which decides: the
terminal with a ``[worker 1] `` prefix on every line (or ``\r``-update) of a process,
one log file per process (``--log-dir``, ``--tee``), the launcher's own
``pskv launch: ...`` messages, and the root cause's last lines when the terminal did
not show them. A line a process writes in pieces is held back briefly rather than cut
by another process's output. A terminal that stops reading (a paused ``| less``, a stalled
CI log collector, Ctrl-S) never blocks the launcher: the terminal is written by a thread of
its own, and the children's output is dropped there (not in the log files) while it lags.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
import weakref
from collections import deque
from typing import IO, Any

from pskv.errors import InvalidArgumentError, LaunchError
from pskv.launch.contract import ProcessSpec

__all__ = ["CHUNK", "HOLD_SECONDS", "Console", "Output"]

CHUNK = 65536  # bytes read from a child's output at once (whatever is there, up to this)
HOLD_SECONDS = 0.1  # how long the terminal waits for the rest of a line before showing its start
BACKLOG = 1 << 20  # bytes of the children's output queued for a lagging terminal; more is dropped
NOTE_WAIT = 0.5  # seconds a note waits to be written (to come before a later print); longer: a stall
EXIT_WAIT = 2.0  # seconds the launcher's exit waits for the queued output of a stalled terminal


class Console:
    """Where the children's output (``out``, log files) and the launcher's notes (``err``) go.

    One lock keeps writes whole. Output is passed on as it arrives, not line by line:
    a line ended by ``\\r`` (a progress bar) shows at once, every ``\\r``- or
    ``\\n``-started piece carrying the process's ``[worker 1] `` prefix. A line left
    unfinished by one process is ended before another process (or a note) writes. A
    closed or broken output (``pskv launch ... | head``) drops output but never blocks a
    child: its pipe keeps being read. Nor does a stalled one (a paused ``| less``): the
    children's output is queued for it up to ``BACKLOG`` bytes, then dropped and counted
    (``output stalled, 12 lines dropped``) while notes still queue, in order, so the
    supervisor's deadlines and kills go on; the log files keep everything. At exit the
    queue gets ``EXIT_WAIT`` seconds to be written.

    Args:
        out: binary stream for the children's prefixed output.
        err: text stream for the launcher's own messages (``pskv launch: ...``).
        log_dir: a directory for one file per process (``--log-dir``): ``scheduler.log``,
            ``server-0.log``, ``worker-1.log``, the raw output without prefix; a process
            started again in this launcher's run (a restart) appends, after a marker
            line. Created if missing. Empty: no files.
        tee: with ``log_dir``, the children's output also goes to ``out`` (``--tee``);
            without it ``out`` gets none, and the root cause's report shows the failed
            process's last lines.

    Raises:
        InvalidArgumentError: ``log_dir`` cannot be created, or ``tee`` without it.
    """

    def __init__(self, out: IO[bytes], err: IO[str], *, log_dir: str = "", tee: bool = False) -> None:
        if tee and not log_dir:
            raise InvalidArgumentError("--tee needs --log-dir (without it all output goes to the terminal)")
        if log_dir:
            try:
                os.makedirs(log_dir, exist_ok=True)
            except OSError as exc:
                raise InvalidArgumentError(f"--log-dir {log_dir!r}: cannot create it: {exc.strerror or exc}") from None
        self._writer = _writer(out, err)
        self._dropped = 0  # lines of the children's output the terminal lost while it lagged, not told yet
        self._lock = threading.RLock()  # _end shows held text through _write
        self.log_dir = log_dir
        self.to_terminal = tee or not log_dir  # children's output on `out`
        self._opened: set[str] = set()  # log files written in this run: a later start appends
        self._open: Output | None = None  # the output whose unfinished line `out` shows
        self._t0 = time.monotonic()
        # Set when the launcher itself was told to stop (a signal, --timeout), or every worker had
        # exited 0 before a role failed or lingered: a job that ended that way is not restarted
        # (--max-restarts).
        self.stop_requested = False
        _LIVE.add(self)

    def output(self, spec: ProcessSpec) -> Output:
        """The output of one started process (its log file opened, or appended to after a marker).

        Raises:
            LaunchError: the log file cannot be opened.
        """
        file = None
        if self.log_dir:
            path = os.path.join(self.log_dir, spec.name.replace(" ", "-") + ".log")
            again = path in self._opened
            try:
                file = open(path, "a+b" if again else "wb")  # noqa: SIM115 - closed by Output.close
                if again:
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                    marker = f"----- pskv launch: {spec.name} started again at {stamp} -----\n".encode()
                    file.write(marker if _ends_line(file) else b"\n" + marker)
                    file.flush()
            except OSError as exc:
                raise LaunchError(f"cannot write {spec.name}'s log file {path}: {exc.strerror or exc}") from None
            self._opened.add(path)
        return Output(self, f"[{spec.name}] ".encode(), file)

    def _write(self, output: Output, data: bytes, whole: bool = False) -> None:
        """Pass ``data`` of ``output`` on to its file and, prefixed, to ``out``.

        On the terminal, text after the last line end (``\n`` or ``\r``) waits in
        ``output.held`` for the rest of its line, so that a line a process writes in pieces
        is not cut by another process's output; the reader shows it anyway after
        ``HOLD_SECONDS`` without more output (``whole=True``: show what is held).
        """
        with self._lock:
            if output.file is not None and data:
                try:
                    output.file.write(data)
                    output.file.flush()
                except (OSError, ValueError):
                    pass
            if not self.to_terminal:
                return
            data = output.held + data
            end = len(data) if whole else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if len(data) - end > CHUNK:  # a very long line without an end: shown as it is
                end = len(data)
            data, output.held = data[:end], data[end:]
            if not data:
                return
            buf = bytearray()
            if self._open is not None and self._open is not output:
                buf += b"\n"  # end another process's unfinished line
                self._open.at_start = self._open.cut = True
            for piece in _PIECES.findall(data):
                text = piece.rstrip(b"\r\n")
                if output.cut and not text and piece.endswith(b"\n"):
                    output.cut = False  # the end of the line another process's output already ended
                    continue
                output.cut = False
                if (text or piece.endswith(b"\n")) and output.at_start:
                    buf += output.prefix  # each new line or \r-update shows whose it is
                buf += piece
                output.at_start = len(text) < len(piece)
            if buf:
                self._show(output, bytes(buf))

    def _show(self, output: Output, data: bytes) -> None:
        """Queue ``data`` (``output``'s) for the terminal or, while the terminal lags, drop and count it.

        Once dropping, it drops until half the backlog is written (output flows again).
        """
        if self._writer.room(len(data) + (BACKLOG // 2 if self._dropped else 0)):
            self._tell_dropped()
            self._open = None if data.endswith(b"\n") else output
            self._writer.put_out(data)
            return
        self._dropped += data.count(b"\n") + (not data.endswith(b"\n"))
        if self._open is not None:  # the terminal shows an unfinished line: end it, its rest is lost
            self._writer.put_out(b"\n")
            self._open = None
        output.cut, output.at_start = not output.at_start, True  # its next bytes start a line on the terminal

    def _end(self, output: Output) -> None:
        """``output``'s process is gone: show what it held back, complete its unfinished line."""
        with self._lock:
            if output.held:
                self._write(output, b"", whole=True)
            if self._open is output:
                self._open = None
                self._writer.put_out(b"\n")

    def note(self, text: str) -> None:
        """Write one launcher message: ``pskv launch: <text>`` (never blocked by a stalled terminal)."""
        with self._lock:
            self._tell_dropped()
            self._say(f"pskv launch: {text}\n")

    def _say(self, text: str) -> None:
        """Write ``text`` to ``err`` on a line of its own (the caller holds the lock)."""
        if self._open is not None:
            self._open.at_start = self._open.cut = True
            self._open = None
            self._writer.put_out(b"\n")
        self._writer.put_err(text)

    def _tell_dropped(self) -> None:
        """Say how much output the terminal lost, where it lost it (the caller holds the lock)."""
        if self._dropped:
            self._say(f"pskv launch: output stalled, {_count(self._dropped, 'line')} dropped\n")
            self._dropped = 0

    def flush(self, timeout: float = EXIT_WAIT) -> None:
        """Write what is queued for the terminal, waiting at most ``timeout`` seconds (at exit)."""
        with self._lock:
            self._tell_dropped()
        self._writer.drain(timeout)

    def started(self, workers: int, servers: int, scheduler: str, launcher: str) -> None:
        """The start line: what the job is, so its first seconds are not silent."""
        logs = ""
        if self.log_dir:
            logs = f", logs in {self.log_dir}" + (" (and here: --tee)" if self.to_terminal else "")
        self.note(f"{_count(workers, 'worker')}, {_count(servers, 'server')}, scheduler on {scheduler}, "
                  f"launcher {launcher}{logs}")

    def registered(self, nodes: int) -> None:
        """Every node registered (the scheduler said so): told when the terminal shows no output of the job."""
        if not self.to_terminal:
            self.note(f"all {nodes} nodes registered, {time.monotonic() - self._t0:.1f} s after the start")

    def finished(self, workers: int) -> None:
        """The job succeeded: told when the terminal shows no output of the job (else it would end silently)."""
        if not self.to_terminal:
            self.note(f"{_count(workers, 'worker')} finished (exit 0), {time.monotonic() - self._t0:.1f} s after "
                      f"the start; their output is in {self.log_dir}")

    def report_log(self, name: str, output: Output) -> None:
        """Name the root cause's log file and, when the terminal did not show it, its last lines."""
        if output.file is None:
            return
        lines = output.last_lines()
        if self.to_terminal or not lines:
            self.note(f"{name}'s output is in {output.file.name}")
            return
        self.note(f"{name}'s output is in {output.file.name}; its last {_count(len(lines), 'line')}:")
        with self._lock:
            self._writer.put_err("".join(f"[{name}] {line.decode(errors='replace')}\n" for line in lines))


_PIECES = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # pieces of output, each with its line end if any
_TAIL_LINES = 15  # lines of the root cause's output the report shows
_TAIL_BYTES = 4096  # of one line, the last ones kept for it


def _ends_line(file: IO[bytes]) -> bool:
    """True if the file (open for reading) is empty or ends with a newline."""
    size = file.seek(0, os.SEEK_END)
    if size == 0:
        return True
    file.seek(size - 1)
    return file.read(1) == b"\n"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _write(stream: IO[Any], data: Any) -> None:
    """Write and flush ``data``; a closed or broken stream takes nothing (never raises)."""
    try:
        stream.write(data)
        stream.flush()
    except (OSError, ValueError):
        pass


class _Direct:
    """Writes at once, in the caller's thread: for in-memory streams (a test's), which cannot stall."""

    def __init__(self, out: IO[bytes], err: IO[str]) -> None:
        self._out = out
        self._err = err

    def room(self, size: int) -> bool:
        return True

    def put_out(self, data: bytes) -> None:
        _write(self._out, data)

    def put_err(self, text: str) -> None:
        _write(self._err, text)

    def drain(self, timeout: float) -> None:
        pass


class _Queued:
    """Writes from threads of their own: a terminal that stops reading blocks its thread alone.

    One queue (and thread) per destination: ``out`` and ``err`` share one when they are the
    same file (the terminal, a ``2>&1`` pipe), keeping their order; else a paused ``| less``
    on ``out`` holds no note back from the terminal on ``err``.
    """

    def __init__(self, out: int, err: int, encoding: str) -> None:
        self._out_fd = out
        self._err_fd = err
        self._encoding = encoding
        self._out = _Queue()
        self._err = self._out if _same_file(out, err) else _Queue()

    def room(self, size: int) -> bool:
        return self._out.room(size)

    def put_out(self, data: bytes) -> None:
        self._out.put(self._out_fd, data)

    def put_err(self, text: str) -> None:
        self._err.wait(self._err.put(self._err_fd, text.encode(self._encoding, errors="replace")))

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._err.drain(timeout)
        self._out.drain(max(0.0, deadline - time.monotonic()))


class _Queue:
    """What one thread writes, in order, to one destination.

    Straight to the file descriptors (``os.write``): a thread blocked in a stream's
    ``write`` would hold the stream's lock, and the interpreter's exit, flushing
    ``sys.stdout``, would abort on it.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[int, bytes]] = deque()
        self._changed = threading.Condition()
        self._queued = 0  # bytes in _items or being written
        self._put_count = self._done_count = 0
        self._stalled = False  # a wait ran out; until the queue empties
        threading.Thread(target=self._run, daemon=True, name="pskv-launch-console").start()

    def room(self, size: int) -> bool:
        with self._changed:
            return self._queued + size <= BACKLOG

    def put(self, fd: int, data: bytes) -> int:
        """Queue ``data`` for ``fd``; returns its turn (for :meth:`wait`)."""
        with self._changed:
            self._items.append((fd, data))
            self._queued += len(data)
            self._put_count += 1
            self._changed.notify_all()
            return self._put_count

    def wait(self, turn: int) -> None:
        """Wait ``NOTE_WAIT`` at most for ``turn`` to be written (a ``print`` after a note comes after it).

        Not at all once the destination is known to stall: the control path goes on.
        """
        with self._changed:
            if not self._stalled and not self._changed.wait_for(lambda: self._done_count >= turn, NOTE_WAIT):
                self._stalled = True

    def drain(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self._queued, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._items)
                fd, data = self._items.popleft()
            _write_all(fd, data)
            with self._changed:
                self._queued -= len(data)
                self._done_count += 1
                self._stalled = self._stalled and self._queued > 0
                self._changed.notify_all()


def _same_file(a: int, b: int) -> bool:
    try:
        one, two = os.fstat(a), os.fstat(b)
    except OSError:
        return True
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # a closed or broken output (`| head`): dropped


def _writer(out: IO[bytes], err: IO[str]) -> _Direct | _Queued:
    """The writer for ``out`` and ``err``: queued when both are real files (a terminal, a pipe)."""
    try:
        fds = out.fileno(), err.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream
        return _Direct(out, err)
    for stream in (out, err):  # what the streams hold comes before what goes straight to their files
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return _Queued(*fds, getattr(err, "encoding", None) or "utf-8")


_LIVE: weakref.WeakSet[Console] = weakref.WeakSet()  # consoles whose queue the exit writes out


@atexit.register
def _flush_at_exit() -> None:
    for console in list(_LIVE):
        console.flush()


class Output:
    """One process's output (see :class:`Console`): its prefix, log file and last lines."""

    def __init__(self, console: Console, prefix: bytes, file: IO[bytes] | None) -> None:
        self.console = console
        self.prefix = prefix
        self.file = file
        self.at_start = True  # the next byte on the terminal starts a line (or a \r-update)
        self.cut = False  # its unfinished line was ended by another's output (a \n of its own would be an empty line)
        self._lines: deque[bytes] = deque(maxlen=_TAIL_LINES)
        self._partial = b""
        self._overwrite = False  # a \r came: the next text replaces the unfinished line
        self.held = b""  # text after its last line end, not yet on the terminal (Console._write)

    def write(self, data: bytes) -> list[bytes]:
        """Pass ``data`` on; returns the lines it completed (each as last shown, without its end)."""
        self.console._write(self, data)
        done = []
        for piece in _PIECES.findall(data):
            text = piece.rstrip(b"\r\n")
            if text:
                self._partial = (text if self._overwrite else self._partial + text)[-_TAIL_BYTES:]
                self._overwrite = False
            if piece.endswith(b"\n"):
                done.append(self._partial)
                self._partial, self._overwrite = b"", False
            elif piece.endswith(b"\r"):
                self._overwrite = True
        self._lines.extend(done)
        return done

    def show_held(self) -> None:
        """Show the text held back for the rest of its line (none came in time)."""
        self.console._write(self, b"", whole=True)

    def last_lines(self) -> list[bytes]:
        """The last lines, an unfinished one included."""
        return list(self._lines) + ([self._partial] if self._partial else [])

    def close(self) -> None:
        """The process's output ended: complete its line on the terminal, close its file."""
        self.console._end(self)
        if self.file is not None:
            self.file.close()
