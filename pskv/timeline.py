"""A timeline: the spans of one process in a Chrome trace-event JSON file (``PSKV_TIMELINE``).

With ``PSKV_TIMELINE=<dir>`` each worker and server writes ``<dir>/<role>-<rank>.json``
(:func:`trace_path`): a JSON object ``{"traceEvents": [...]}`` that ``chrome://tracing``
and Perfetto (ui.perfetto.dev, its trace processor) load. As Horovod's timeline (its
``horovod/common/timeline.cc``), events are queued by the threads that record them and
written by a thread of their own; unlike it, every event is a complete span (``ph``
``"X"``: start and duration, recorded when the span ends), on a *track* (a ``tid``,
named by an ``"M"`` ``thread_name`` event): ``key 3`` for a key's spans, ``wait
(MainThread)`` for the time a thread blocks. Spans of one track that overlap (pipelined
pushes of a key) go to further lanes of it (``key 3 #2``), so that the spans of each
``tid`` never overlap and follow each other in the file: every viewer draws them.

The file is valid JSON after every write: each flush writes the new events over the
closing ``]...}`` and writes the closing again after them (one ``pwrite``). A process
killed between writes leaves a file that loads, holding everything up to its last flush
(at most :data:`FLUSH_INTERVAL` seconds old); a kill inside a write (it can cut a write
of more than a page short) leaves the events before it whole, which :func:`load` reads. Bounded: at most :data:`MAX_BUFFERED`
events wait for the writer; more are dropped and counted in the file's
``otherData.dropped_events``.

Off (no ``PSKV_TIMELINE``), there is no :class:`Timeline`: the code that records spans
holds ``None`` and checks it once per operation.

Times: ``ts`` and ``dur`` are whole microseconds of ``CLOCK_MONOTONIC``
(:func:`time.monotonic`), which every process of one host shares: the files of one
host's processes are on one time axis (:func:`merge` puts them in one file).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pskv.errors import InvalidArgumentError

__all__ = ["FLUSH_INTERVAL", "MAX_BUFFERED", "MAX_LANES", "MERGED", "Timeline", "is_merged", "load", "merge",
           "open_timeline", "stragglers", "summary", "trace_path", "write_merged"]

log = logging.getLogger("pskv.timeline")

#: Seconds between writes of the queued events (a killed process loses at most these).
FLUSH_INTERVAL = 1.0
#: Queued events that wake the writer before its interval is over.
FLUSH_EVENTS = 4096
#: Events queued at most; past it events are dropped (counted in the file).
MAX_BUFFERED = 1 << 16
#: Seconds :meth:`Timeline.close` waits for a write in progress (a hung file system) before giving up.
CLOSE_TIMEOUT = 10.0
#: Lanes of one track: spans that overlap every lane's last one are dropped (counted).
MAX_LANES = 16

_OPEN: weakref.WeakSet[Timeline] = weakref.WeakSet()


def trace_path(directory: str | os.PathLike[str], role: str, rank: int, restart: int = 0,
               replacement: bool = False) -> Path:
    """The file of process ``role`` ``rank`` under ``directory``: ``<role>-<rank>.json``.

    After a restart of the job (``PSKV_RESTART_COUNT`` ``n`` > 0) ``<role>-<rank>.restart<n>.json``;
    a replacement process in a running job (``--restart-workers`` / ``--restart-servers``)
    adds its process id, ``<role>-<rank>.pid<pid>.json``, so it never overwrites its
    predecessor's file.
    """
    name = f"{role}-{rank}"
    if restart > 0:
        name += f".restart{restart}"
    if replacement:
        name += f".pid{os.getpid()}"
    return Path(directory) / f"{name}.json"


def open_timeline(directory: str, role: str, rank: int, restart: int = 0,
                  replacement: bool = False) -> Timeline | None:
    """The timeline of this process (:func:`trace_path`), or None if ``directory`` is empty (off).

    Raises:
        InvalidArgumentError: the file cannot be created (names ``PSKV_TIMELINE`` and the path).
    """
    if not directory:
        return None
    return Timeline(trace_path(directory, role, rank, restart, replacement), f"{role} {rank}",
                    sort_index=rank if role == "worker" else 10_000 + rank)  # workers first in a merged view


class Timeline:
    """One process's trace file, written by a thread of its own until :meth:`close`.

    Args:
        path: the file (its directory is created; an existing file is replaced).
        process: the process's name in viewers (``"worker 0"``).
        sort_index: where viewers put the process among others (smaller: higher up).
        flush_interval: seconds between writes.
        max_buffered: events queued at most (more are dropped and counted).

    Raises:
        InvalidArgumentError: the file cannot be created.
    """

    def __init__(self, path: str | os.PathLike[str], process: str, flush_interval: float = FLUSH_INTERVAL,
                 max_buffered: int = MAX_BUFFERED, sort_index: int = 0) -> None:
        self.path = Path(path)
        self.pid = os.getpid()
        self._max_buffered = max_buffered
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()  # one write at a time, in queue order (writer thread, close)
        # spans as (name, tid, ts, dur, args) (formatted by the writer), metadata as bytes
        self._queued: list[tuple[str, int, int, int, Mapping[str, Any] | None] | bytes] = []
        self._lanes: dict[str, list[list[int]]] = {}  # track -> its lanes: [tid, end of its last span (us)]
        self._tids = 0
        self.dropped = 0
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InvalidArgumentError(f"PSKV_TIMELINE: cannot create the timeline file {self.path}: {exc}") from None
        self._end = 0  # where the closing ']...}' starts in the file
        self._closing = b""
        self._written_dropped = 0  # the dropped count the file's closing holds
        self._write(b'{"traceEvents":[\n' + _dumps(_meta("process_name", self.pid, 0, process)) + b",\n"
                    + _dumps({"name": "process_sort_index", "ph": "M", "pid": self.pid, "tid": 0,
                              "args": {"sort_index": sort_index}}))
        self._wake = threading.Condition(self._lock)
        self._interval = flush_interval
        self._writer = threading.Thread(target=self._run, name="pskv-timeline", daemon=True)
        self._writer.start()
        _OPEN.add(self)

    # -- recording (any thread) ---------------------------------------------------------------
    def span(self, name: str, track: str, start: float, end: float, args: Mapping[str, Any] | None = None) -> None:
        """A span ``name`` on ``track`` from ``start`` to ``end`` (:func:`time.monotonic` seconds).

        ``args`` (JSON-able values; others are written as their ``str``) is kept as given
        until written: the caller must not change it."""
        if self._closed:
            return
        ts = int(start * 1e6)
        end_us = int(end * 1e6)
        if end_us < ts:
            end_us = ts
        with self._lock:
            if self._closed:
                return
            if len(self._queued) >= self._max_buffered:
                self.dropped += 1
                return
            tid = self._lane(track, ts, end_us)
            if tid < 0:
                self.dropped += 1
                return
            self._queued.append((name, tid, ts, end_us - ts, args))
            if len(self._queued) == FLUSH_EVENTS:
                self._wake.notify()

    def _lane(self, track: str, ts: int, end: int) -> int:
        """A lane of ``track`` whose last span ended by ``ts`` (made if needed; the lock is held); -1: none."""
        lanes = self._lanes.get(track)
        if lanes is None:
            lanes = self._lanes[track] = []
        for lane in lanes:
            if lane[1] <= ts:
                lane[1] = end
                return lane[0]
        if len(lanes) >= MAX_LANES:
            return -1
        self._tids += 1
        tid = self._tids
        label = track if not lanes else f"{track} #{len(lanes) + 1}"
        lanes.append([tid, end])
        self._queued.append(_dumps(_meta("thread_name", self.pid, tid, label)))
        self._queued.append(_dumps({"name": "thread_sort_index", "ph": "M", "pid": self.pid, "tid": tid,
                                    "args": {"sort_index": tid}}))
        return tid

    # -- writing (the writer thread; close) ---------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._closed and len(self._queued) < FLUSH_EVENTS:
                    self._wake.wait(self._interval)
                if self._closed:
                    return
            self.flush()

    def flush(self, timeout: float | None = None) -> bool:
        """Write the queued events now (the file stays valid JSON); False if another write held the file
        for more than ``timeout`` seconds (nothing written)."""
        if not self._io_lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            with self._lock:
                events, self._queued = self._queued, []
                dropped = self.dropped
            if events or dropped != self._written_dropped:
                self._write(b"".join(b",\n" + (e if type(e) is bytes else self._span_json(e))  # type: ignore[arg-type]
                                     for e in events), dropped=dropped)
        finally:
            self._io_lock.release()
        return True

    def _span_json(self, span: tuple[str, int, int, int, Mapping[str, Any] | None]) -> bytes:
        """One span as trace-event JSON (formatted here rather than by json.dumps: the writer's time is the
        job's too)."""
        name, tid, ts, dur, args = span
        fields = ",".join(f"{json.dumps(k)}:{v}" if type(v) is int else f"{json.dumps(k)}:{json.dumps(v, default=str)}"
                          for k, v in args.items()) if args else ""
        return (f'{{"name":{json.dumps(name)},"ph":"X","pid":{self.pid},"tid":{tid},"ts":{ts},"dur":{dur},'
                f'"args":{{{fields}}}}}').encode()

    def _write(self, data: bytes, dropped: int = 0) -> None:
        """``data`` over the closing at the file's end, then the closing again (one write)."""
        closing = b'\n],\n"displayTimeUnit":"ms",\n"otherData":{"dropped_events":%d}}\n' % dropped
        fd = self._fd
        if fd is None:
            return
        try:
            written = os.pwrite(fd, data + closing, self._end)
            if written != len(data) + len(closing):
                raise OSError(f"{written} of {len(data) + len(closing)} bytes written (is the disk full?)")
            if len(closing) < len(self._closing):  # never: the count only grows
                os.ftruncate(fd, self._end + len(data) + len(closing))
        except OSError as exc:
            log.warning("timeline %s: writing failed, no more events are written: %s", self.path, exc)
            self._fd = None
            os.close(fd)
            return
        self._end += len(data)
        self._closing = closing
        self._written_dropped = dropped

    def close(self) -> None:
        """Write what is queued and close the file (idempotent; the writer thread ends)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
        if self._writer is not threading.current_thread():
            self._writer.join(CLOSE_TIMEOUT)
        _OPEN.discard(self)
        if not self.flush(CLOSE_TIMEOUT):
            log.warning("timeline %s: a write did not end within %.0f s; the last events are not written",
                        self.path, CLOSE_TIMEOUT)
            return
        with self._io_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: the parent's file and queue are not this process's (nothing is written)."""
        self._closed = True
        self._fd = None  # the parent's descriptor (O_CLOEXEC only across exec): left to the parent
        self._queued = []


def load(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The events of several timeline files (one job's), as :func:`merge` writes them.

    Raises:
        InvalidArgumentError: a file is not a trace-event JSON object (names it).
    """
    events: list[dict[str, Any]] = []
    taken: set[Any] = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            try:
                found = json.loads(text)["traceEvents"]
            except ValueError:
                found = _complete_events(text, path)
            pids = {e["pid"] for e in found}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"{path} is not a timeline file: {exc}") from None
        # the same pid in two files (processes of two hosts, or an in-process cluster): renumbered
        fresh = (n for n in range(1 << 22, 1 << 31) if n not in taken and n not in pids)
        renumber = {pid: next(fresh) for pid in sorted(pids & taken, key=str)}
        taken |= (pids - set(renumber)) | set(renumber.values())
        events.extend({**e, "pid": renumber[e["pid"]]} if e["pid"] in renumber else e for e in found)
    return events


def _complete_events(text: str, path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a timeline file whose last write was cut short (its process killed inside the write):
    every whole line of it up to the first that is not (one event per line, as :class:`Timeline` writes).

    Raises:
        ValueError: the file does not start as a timeline file does.
    """
    lines = text.split("\n")
    if lines[0] != '{"traceEvents":[':
        raise ValueError("it does not start with {\"traceEvents\":[")
    events = []
    for line in lines[1:]:
        try:
            event = json.loads(line.rstrip(","))
        except ValueError:
            break
        if not isinstance(event, dict):
            break
        events.append(event)
    log.warning("timeline %s was cut short (its process was killed while writing): %d whole events read", path,
                len(events))
    return events


def merge(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str]) -> int:
    """Write the events of several timeline files (one job's) into one file ``out``; returns their number.

    The processes keep their own ``pid`` (one that two files have is renumbered in the
    later one); the files of processes on one host share a time axis
    (:mod:`pskv.timeline`), so the merged file shows a step's spans on every worker and
    server together.

    The file is marked as merged (:data:`MERGED`), so a later pass over its folder can leave it
    out (:func:`is_merged`).

    Raises:
        InvalidArgumentError: a file is not a trace-event JSON object (names it).
    """
    paths = list(paths)
    events = load(paths)
    write_merged(events, len(paths), out)
    return len(events)


#: The ``otherData`` entry (first in the file) of a merged file: how many files it merged.
MERGED = "pskv_merged_files"
_MERGED_START = b'{"otherData":{"%s":' % MERGED.encode()


def write_merged(events: list[dict[str, Any]], files: int, out: str | os.PathLike[str]) -> None:
    """Write ``events`` (loaded from ``files`` timeline files) into ``out``, marked as merged (first in its
    ``otherData``, so that :func:`is_merged` reads a few bytes to tell)."""
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"otherData": {MERGED: files}, "traceEvents": events, "displayTimeUnit": "ms"}, f,
                  separators=(",", ":"))


def is_merged(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a merged file (:func:`merge`, ``pskv timeline -o``): its first bytes say so."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_MERGED_START)) == _MERGED_START
    except OSError:
        return False  # load names it


def summary(events: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int, float]]:
    """Per process (its name) and span name: how many spans and their total milliseconds, by process."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    totals: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e.get("ph") == "X":
            total = totals.setdefault((str(names.get(e["pid"], e["pid"])), e["name"]), [0, 0.0])
            total[0] += 1
            total[1] += e.get("dur", 0) / 1000
    return [(process, name, int(n), ms) for (process, name), (n, ms) in sorted(totals.items())]


def stragglers(events: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, int, float]]:
    """Which workers sync rounds waited for, from the servers' ``merge`` spans of several workers: per
    worker, ``(name, rounds it came last in, rounds, milliseconds after the one before it, summed)``,
    most rounds first."""
    last: dict[str, list[float]] = {}
    rounds = 0
    for e in events:
        pushes = e.get("args", {}).get("pushes") if e.get("ph") == "X" and e.get("name") == "merge" else None
        if not isinstance(pushes, dict) or len(pushes) < 2:
            continue
        rounds += 1
        order = sorted(pushes.items(), key=lambda item: item[1])
        entry = last.setdefault(str(order[-1][0]), [0, 0.0])
        entry[0] += 1
        entry[1] += (order[-1][1] - order[-2][1]) / 1000
    return sorted(((name, int(n), rounds, ms) for name, (n, ms) in last.items()), key=lambda t: (-t[1], t[0]))


def _meta(name: str, pid: int, tid: int, label: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}


def _dumps(event: Mapping[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), default=str).encode()


@atexit.register
def _close_at_exit() -> None:
    """Interpreter exit: every timeline still open writes its queue."""
    for timeline in list(_OPEN):
        timeline.close()


def _forget_in_child() -> None:
    for timeline in list(_OPEN):
        timeline._forget()
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_in_child)
