#!/usr/bin/env python
"""What a membership change costs the other workers of an elastic job (issue 24's bars), on real jobs.

Every job is ``pskv launch -n MIN:MAX -s 2 --host-discovery-script 'cat HOSTS'`` on 127.0.0.1 running
``bench/_elastic_worker.py``: a model of ``--model-mb`` MB of float32 in ``--keys`` keys (cut over the 2
servers, SGD on the servers), each step a push and a pull of all of it after ``--compute-ms`` of sleep, a
commit every ``--commit-every`` steps. Every worker prints a line with ``time.time()`` per step, commit,
restore, kill and pull (one host, one clock); the scheduler logs its ``view N:`` lines (``PSKV_LOG_LEVEL=INFO``,
millisecond times) and the launcher's notes get the time the driver read them. The cases, each ``--repeats``
times (the change at step ``--change-step``; the driver ends the job ``--after`` steps past the change):

* ``kill``  — 3 workers; slot 1 SIGKILLs itself mid-step (after its push): the launcher reports its exit
  (``ROSTER gone``), the scheduler makes a failure view, the survivors restore to the last commit and redo;
* ``hang``  — 3 workers; the driver SIGSTOPs slot 1: only the heartbeats find it (an elastic job's default
  0.5 s interval, 3 s timeout); the driver SIGKILLs the stopped process once the survivors went on;
* ``join``  — 2 workers; the discovery file grows to 3 slots: the launcher starts slot 2, the scheduler holds
  its registration until the next commit, admits it there (a ``grow`` view), and it pulls the model;
* ``drain`` — 3 workers; the discovery file shrinks to 2: slot 2 leaves at the next commit (nothing voided);
* ``timeline`` — once: 3 workers, slot 1 killed, then a fourth slot (3) joins: the trace of
  ``docs/img/elastic_timeline.svg`` (``bench/plot_elastic.py``).

Measured, per survivor and then the median over them (all in seconds):

* **stall**: the time from the survivor's last commit before the change to its first commit once the change
  is through, minus the median commit interval for each commit interval in that window: the extra time
  the change cost (for a kill: the work voided before it, the detection, the new view, the redo);
* kill / hang: **detect** (kill or SIGSTOP to the scheduler's failure view), **to_restore** (view to the
  survivors' restore), **redo** (restore to the next commit), **note** (kill to the launcher's line);
* join: the joiner's **start_to_first_commit** (the launcher started it to its first committed step), split
  into **discover** (hosts file grown to the launcher's start), **register** (start to the scheduler holding
  it), **wait_commit** (held to the ``grow`` view), **pull** (its pull of the model), and the members'
  **stall** over the admitting commit and the joiner's first step;
* drain: **to_view** (hosts file shrunk to the ``drain`` view at a commit) and the members' **stall**.

The bars: a removal (kill, hang) costs the others at most 5 s; a join costs the members at most one round
(the median commit interval) plus the joiner's pull of the model.

    python bench/bench_elastic.py                          # ~2-3 min on 2 cores
    python bench/bench_elastic.py --cases kill,join --repeats 1 --json /tmp/elastic.json

``--json PATH`` writes every run's events and metrics, the medians and ranges, the commit (``+dirty`` when
pskv/ or bench/ has uncommitted edits), ``uncommitted_in_pskv``, the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from _procs import install_sigterm_handler  # noqa: E402
from bench_hosts import REPO_DIR, git_commit  # noqa: E402

from pskv.testing.jobs import JobError, Process, ProcessGroup, child_env, start_launch  # noqa: E402

WORKER = BENCH_DIR / "_elastic_worker.py"
CASES = ("kill", "hang", "join", "drain")
REMOVAL_BAR_S = 5.0
DEADLINE = 90.0
WALL_OFFSET = time.time() - time.monotonic()  # the driver's monotonic line times -> time.time()


# -- the record: lines -> events (pure) ------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """One timestamped thing in a job (``t``: ``time.time()`` seconds)."""

    t: float
    kind: str  # start joined pulled step commit restore kill drained view waits left started drain_asked ...
    slot: int = -1
    step: int = -1  # a step, or a view's epoch
    members: tuple[int, ...] = ()
    text: str = ""  # a view's cause, a pid, a pull's seconds, a note's wording


_T = r"t (?P<t>\d+\.\d+)"
_WORKER_LINES: list[tuple[str, re.Pattern[str]]] = [
    ("start", re.compile(r"ev start slot (?P<slot>\d+) pid (?P<text>\d+) " + _T)),
    ("joined", re.compile(r"ev joined slot (?P<slot>\d+) rank \d+ of \d+ cause (?P<text>\w+) " + _T)),
    ("pulled", re.compile(r"ev pulled slot (?P<slot>\d+) " + _T + r" dt (?P<text>[\d.]+)")),
    ("step", re.compile(r"ev step (?P<step>\d+) slot (?P<slot>\d+) " + _T)),
    ("commit", re.compile(r"committed step (?P<step>\d+) members (?P<members>[\d,]+) slot (?P<slot>\d+) " + _T)),
    ("restore", re.compile(r"restore at step (?P<step>\d+) slot (?P<slot>\d+) " + _T)),
    ("kill", re.compile(r"ev kill slot (?P<slot>\d+) step (?P<step>\d+) " + _T)),
    ("drained", re.compile(r"ev drained slot (?P<slot>\d+) " + _T)),
]
_LOGGED = re.compile(r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \w+ \[scheduler\] pskv\.scheduler: scheduler: "
                     r"(?:view (?P<epoch>\d+): slots (?P<members>[\d,]+|none) \(W=\d+\) from commit \d+ \((?P<cause>\w+)"
                     r"|worker slot (?P<waits>\d+) waits to join)")
_NOTES: list[tuple[str, re.Pattern[str]]] = [  # the launcher's lines: timed when the driver read them
    ("left", re.compile(r"pskv launch: worker slot (?P<slot>\d+) on \S+ (?P<text>.+?): it left the job")),
    ("started", re.compile(r"pskv launch: started worker slot (?P<slot>\d+) ")),
    ("drain_asked", re.compile(r"has fewer slots now: worker slot (?P<slot>\d+) is drained")),
    ("drain_left", re.compile(r"pskv launch: worker slot (?P<slot>\d+) on \S+ was drained")),
]


def parse_line(read_at: float, line: str) -> Event | None:
    """The event of one line of the launcher's output (``read_at``: when the driver read it), or None."""
    for kind, pattern in _WORKER_LINES:
        if m := pattern.search(line):
            found = m.groupdict()
            members = tuple(int(s) for s in found["members"].split(",")) if found.get("members") else ()
            return Event(float(found["t"]), kind, int(found.get("slot") or -1), int(found.get("step") or -1),
                         members, found.get("text") or "")
    if m := _LOGGED.search(line):
        when = datetime.strptime(m["date"], "%Y-%m-%d %H:%M:%S.%f").timestamp()  # local time, as logged
        if m["waits"] is not None:
            return Event(when, "waits", int(m["waits"]))
        members = () if m["members"] == "none" else tuple(int(s) for s in m["members"].split(","))
        return Event(when, "view", -1, int(m["epoch"]), members, m["cause"])
    for kind, pattern in _NOTES:
        if m := pattern.search(line):
            return Event(read_at, kind, int(m["slot"]), text=m.groupdict().get("text") or "")
    return None


def parse_events(lines: Iterable[tuple[float, str]]) -> list[Event]:
    """Every event of ``(read_at, line)`` pairs, in time order."""
    return sorted((e for e in (parse_line(t, line) for t, line in lines) if e is not None), key=lambda e: e.t)


def first(events: Sequence[Event], kind: str, pred: Callable[[Event], bool] = lambda e: True,
          after: float = -math.inf) -> Event | None:
    """The first event of ``kind`` after time ``after`` for which ``pred`` holds."""
    return next((e for e in events if e.kind == kind and e.t > after and pred(e)), None)


def commits(events: Sequence[Event], slot: int) -> list[Event]:
    """``slot``'s commit events in time order (redone steps included)."""
    return [e for e in events if e.kind == "commit" and e.slot == slot]


def median_interval(events: Sequence[Event], slots: Iterable[int]) -> float:
    """The median time between consecutive commits of ``slots`` (each worker's own intervals)."""
    gaps = [b.t - a.t for s in slots for a, b in zip(commits(events, s), commits(events, s)[1:], strict=False)]
    return statistics.median(gaps) if gaps else math.nan


def stall(own: Sequence[Event], since: float, until: Callable[[Event], bool], every: int, interval: float) -> float:
    """The extra time of one worker's commits ``own`` across a change: from its last commit before time ``since``
    to its first commit after it for which ``until`` holds, less ``interval`` for each commit interval of progress
    in that window (at least one)."""
    before = [e for e in own if e.t < since]
    b = next((e for e in own if e.t >= since and until(e)), None)
    if not before or b is None:
        return math.nan
    a = before[-1]
    return (b.t - a.t) - max(1.0, (b.step - a.step) / every) * interval


# -- the metrics of one run (pure) -----------------------------------------------------------------
def removal_metrics(events: Sequence[Event], cause: Event, every: int) -> dict[str, float]:
    """A kill's or a hang's cost: ``cause`` is the kill (or the driver's SIGSTOP) of the departing slot."""
    view = first(events, "view", lambda e: e.text == "failure", after=cause.t - 1.0)
    survivors = [s for s in (view.members if view else ()) if s != cause.slot]
    interval = median_interval(events, survivors)
    out: dict[str, float] = {"interval": interval, "detect": view.t - cause.t if view else math.nan}
    note = first(events, "left", lambda e: e.slot == cause.slot, after=cause.t - 1.0)
    out["note"] = note.t - cause.t if note and cause.kind == "kill" else math.nan
    stalls, to_restore, redo = [], [], []
    for slot in survivors:
        restore = first(events, "restore", _of(slot), after=cause.t - 1.0)
        if restore is None:
            continue
        again = first(events, "commit", _of(slot), after=restore.t)
        to_restore.append(restore.t - view.t if view else math.nan)
        redo.append(again.t - restore.t if again else math.nan)
        stalls.append(stall(commits(events, slot), cause.t, _later_than(restore.t), every, interval))
    out.update(stall=_median(stalls), to_restore=_median(to_restore), redo=_median(redo))
    last = [e for e in commits(events, survivors[0]) if e.t < cause.t] if survivors else []
    out["voided_before"] = cause.t - last[-1].t if last else math.nan
    return out


def join_metrics(events: Sequence[Event], grown: float, every: int) -> dict[str, float]:
    """A join's cost: the hosts file grew at ``grown``; the joiner is the first slot started after it."""
    started = first(events, "started", after=grown - 1.0)
    if started is None:
        return {}
    slot = started.slot
    waits = first(events, "waits", lambda e: e.slot == slot)
    view = first(events, "view", lambda e: slot in e.members)
    pulled = first(events, "pulled", lambda e: e.slot == slot)
    own = first(events, "commit", lambda e: e.slot == slot)
    members = [s for s in (view.members if view else ()) if s != slot]
    interval = median_interval(events, members)
    out = {"interval": interval, "discover": started.t - grown,
           "register": waits.t - started.t if waits else math.nan,
           "wait_commit": view.t - waits.t if view and waits else math.nan,
           "pull": float(pulled.text) if pulled else math.nan,
           "start_to_first_commit": own.t - started.t if own else math.nan}
    if view and own:  # from the members' commit before the admitting one to their commit of the joiner's first step
        out["stall"] = _median([stall(commits(events, s), view.t, _step_from(own.step), every, interval)
                                for s in members])
    out["bar"] = interval + out["pull"]
    return out


def drain_metrics(events: Sequence[Event], shrunk: float, every: int) -> dict[str, float]:
    """A drain's cost: the hosts file shrank at ``shrunk``."""
    view = first(events, "view", lambda e: e.text == "drain", after=shrunk)
    asked = first(events, "drain_asked", after=shrunk)
    if view is None:
        return {}
    interval = median_interval(events, view.members)
    out = {"interval": interval, "to_view": view.t - shrunk, "asked": asked.t - shrunk if asked else math.nan}
    at = first(events, "commit", lambda e: e.slot in view.members, after=view.t)  # the drain's commit
    beyond = at.step + every if at else 0  # and the step after it, without the drained worker
    out["stall"] = _median([stall(commits(events, s), view.t, _step_from(beyond), every, interval)
                            for s in view.members])
    return out


def _of(slot: int) -> Callable[[Event], bool]:
    return lambda e: e.slot == slot


def _later_than(t: float) -> Callable[[Event], bool]:
    return lambda e: e.t > t


def _step_from(step: int) -> Callable[[Event], bool]:
    return lambda e: e.step >= step


def _median(values: Iterable[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def summary(runs: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per metric: the median, min and max over ``runs`` (NaNs left out)."""
    names = sorted({k for run in runs for k in run})
    out = {}
    for name in names:
        values = [run[name] for run in runs if name in run and not math.isnan(run[name])]
        if values:
            out[name] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
    return out


# -- running the jobs ------------------------------------------------------------------------------
@dataclass
class Job:
    """One launched job: its launcher process, its hosts and end files, and the driver's own marks."""

    case: str
    launcher: Process
    hosts: Path
    end: Path
    every: int
    marks: list[Event]

    def wait_for(self, kind: str, pred: Callable[[Event], bool] = lambda e: True, timeout: float = 60.0) -> Event:
        """The first event of ``kind`` (a line of the launcher's output) for which ``pred`` holds, waiting for it.

        Raises:
            JobError: none within ``timeout`` s, or the launcher ended first.
        """
        found: list[Event] = []

        def match(line: str) -> bool:
            event = parse_line(time.time(), line)
            if event is not None and event.kind == kind and pred(event):
                found.append(event)
                return True
            return False

        if self.launcher.find(match, timeout) is None:
            raise JobError(f"{self.case}: no {kind} event within {timeout:g} s; the job's last lines:\n"
                           + "\n".join(self.launcher.text()[-30:]))
        return found[0]

    def mark(self, kind: str, slot: int = -1, text: str = "") -> Event:
        """A driver action, timed now."""
        event = Event(time.time(), kind, slot, text=text)
        self.marks.append(event)
        return event

    def set_hosts(self, slots: int, kind: str) -> Event:
        """Rewrite the discovery file (atomically) to ``slots`` slots on 127.0.0.1."""
        tmp = self.hosts.with_suffix(".tmp")
        tmp.write_text(f"127.0.0.1:{slots}\n", encoding="utf-8")
        tmp.replace(self.hosts)
        return self.mark(kind, text=str(slots))

    def end_after(self, step: int, after: int) -> None:
        """End the job ``after`` steps past ``step`` (rounded up to a commit)."""
        last = math.ceil((step + after) / self.every) * self.every
        tmp = self.end.with_suffix(".tmp")
        tmp.write_text(str(last), encoding="utf-8")
        tmp.replace(self.end)


def launch_args(case: str, hosts: Path) -> tuple[list[str], int]:
    """``pskv launch`` options of a case, and the discovery file's first slot count."""
    bounds, first_slots = {"join": ("2:3", 2), "timeline": ("2:4", 3)}.get(case, ("2:3", 3))
    return ["-n", bounds, "-s", "2", "--host-discovery-script", f"cat {hosts}", "--discovery-interval", "0.1",
            "--respawn-cooldown", "3600", "--timeout", str(int(DEADLINE))], first_slots


def run_job(case: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one job of ``case`` to its end; its events (the launcher's lines and the driver's marks) and exit code."""
    hosts, end = workdir / "hosts", workdir / "end"
    end.unlink(missing_ok=True)
    options, first_slots = launch_args(case, hosts)
    hosts.write_text(f"127.0.0.1:{first_slots}\n", encoding="utf-8")
    floats = int(args.model_mb * 2**20 / 4)
    env = child_env({"BENCH_EL_STEPS": "100000", "BENCH_EL_END_FILE": str(end), "BENCH_EL_FLOATS": str(floats),
                     "BENCH_EL_KEYS": str(args.keys), "BENCH_EL_COMMIT_EVERY": str(args.commit_every),
                     "BENCH_EL_COMPUTE_MS": str(args.compute_ms), "PSKV_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
                     "BENCH_EL_KILL": f"1:{args.change_step}" if case in ("kill", "timeline") else ""})
    started = time.time()
    with ProcessGroup(f"elastic {case}") as group:
        launcher = start_launch(group, [*options, "--", sys.executable, str(WORKER)], workdir, env)
        job = Job(case, launcher, hosts, end, args.commit_every, [])
        DRIVE[case](job, args)
        code = launcher.wait(DEADLINE)
        if code is None:
            raise JobError(f"{case}: the job did not end within {DEADLINE:g} s:\n" + "\n".join(launcher.text()[-30:]))
        lines = [(t + WALL_OFFSET, line) for t, line in launcher.lines]
    events = sorted([*parse_events(lines), *job.marks], key=lambda e: e.t)
    errors = [line for _, line in lines if re.search(r"Traceback|ERROR|Error:", line)]
    return {"case": case, "code": code, "started": started, "wall_s": time.time() - started,
            "events": [asdict(e) for e in events], "error_lines": errors[:40]}


def drive_kill(job: Job, args: argparse.Namespace) -> None:
    """Slot 1 kills itself (the worker's BENCH_EL_KILL); end the job once a survivor committed after its restore."""
    restore = job.wait_for("restore")
    again = job.wait_for("commit", lambda e: e.t > restore.t)
    job.end_after(again.step, args.after)


def drive_hang(job: Job, args: argparse.Namespace) -> None:
    """SIGSTOP slot 1 mid-job; SIGKILL it once the survivors went on without it."""
    pid = int(job.wait_for("start", lambda e: e.slot == 1).text)
    job.wait_for("step", lambda e: e.slot == 1 and e.step >= args.change_step)
    os.kill(pid, signal.SIGSTOP)
    job.mark("stop", 1)
    restore = job.wait_for("restore", timeout=30.0)
    again = job.wait_for("commit", lambda e: e.t > restore.t)
    os.kill(pid, signal.SIGKILL)  # a stopped process dies at once; the launcher's report finds it gone already
    job.mark("sigkill", 1)
    job.end_after(again.step, args.after)


def drive_join(job: Job, args: argparse.Namespace) -> None:
    """Grow the hosts file by one slot; end the job once the joiner committed a step."""
    job.wait_for("commit", lambda e: e.step >= args.change_step)
    job.set_hosts(3, "grow")
    own = job.wait_for("commit", lambda e: e.slot == 2)
    job.end_after(own.step, args.after)


def drive_drain(job: Job, args: argparse.Namespace) -> None:
    """Shrink the hosts file by one slot; end the job once the drained worker left."""
    job.wait_for("commit", lambda e: e.step >= args.change_step)
    job.set_hosts(2, "shrink")
    gone = job.wait_for("drained", timeout=30.0)
    again = job.wait_for("commit", lambda e: e.t > gone.t)
    job.end_after(again.step, args.after)


def drive_timeline(job: Job, args: argparse.Namespace) -> None:
    """Slot 1 killed at the change step, then (``--after`` // 2 commits later) a fourth slot: slot 3 joins."""
    restore = job.wait_for("restore")
    again = job.wait_for("commit", lambda e: e.t > restore.t)
    job.wait_for("commit", lambda e: e.step >= again.step + max(2, args.after // 2))
    job.set_hosts(4, "grow")  # slot 1's place still cools: one new worker, slot 3
    own = job.wait_for("commit", lambda e: e.slot == 3)
    job.end_after(own.step, args.after)


DRIVE: dict[str, Callable[[Job, argparse.Namespace], None]] = {
    "kill": drive_kill, "hang": drive_hang, "join": drive_join, "drain": drive_drain, "timeline": drive_timeline}


def metrics_of(run: dict[str, Any], every: int) -> dict[str, float]:
    """The metrics of one run (see the module docstring)."""
    events = [Event(**{**e, "members": tuple(e["members"])}) for e in run["events"]]
    case = run["case"]
    if case in ("kill", "hang"):
        cause = first(events, "kill" if case == "kill" else "stop", lambda e: e.slot == 1)
        return removal_metrics(events, cause, every) if cause else {}
    if case == "join":
        grown = first(events, "grow")
        return join_metrics(events, grown.t, every) if grown else {}
    if case == "drain":
        shrunk = first(events, "shrink")
        return drain_metrics(events, shrunk.t, every) if shrunk else {}
    kill, grown = first(events, "kill"), first(events, "grow")
    out = {f"kill_{k}": v for k, v in (removal_metrics(events, kill, every) if kill else {}).items()}
    out.update({f"join_{k}": v for k, v in (join_metrics(events, grown.t, every) if grown else {}).items()})
    return out


# -- the report ------------------------------------------------------------------------------------
SHOWN = {  # per case: (metric, what it is) in the table's order
    "kill": [("stall", "survivors' stall"), ("detect", "kill -> failure view"), ("note", "kill -> launcher's line"),
             ("to_restore", "view -> survivors' restore"), ("redo", "restore -> next commit"),
             ("voided_before", "last commit -> kill (voided)"), ("interval", "commit interval (median)")],
    "hang": [("stall", "survivors' stall"), ("detect", "SIGSTOP -> failure view"),
             ("to_restore", "view -> survivors' restore"), ("redo", "restore -> next commit"),
             ("interval", "commit interval (median)")],
    "join": [("stall", "members' stall at admission"), ("bar", "bar: interval + pull"),
             ("start_to_first_commit", "joiner: start -> 1st commit"), ("discover", "hosts file -> started"),
             ("register", "started -> held by scheduler"), ("wait_commit", "held -> grow view"),
             ("pull", "joiner's pull of the model"), ("interval", "commit interval (median)")],
    "drain": [("stall", "members' stall"), ("to_view", "hosts file -> drain view"),
              ("interval", "commit interval (median)")],
}


def table(summaries: dict[str, dict[str, dict[str, float]]]) -> str:
    """The printed table: per case and metric, the median and the range over the runs, in seconds."""
    rows = [f"{'case':<6} {'metric':<30} {'median s':>9} {'min .. max s':>18} {'n':>2}"]
    for case, shown in SHOWN.items():
        for name, label in shown:
            m = summaries.get(case, {}).get(name)
            if m:
                rows.append(f"{case:<6} {label:<30} {m['median']:9.3f} {m['min']:8.3f} .. {m['max']:<7.3f} {m['n']:2d}")
    return "\n".join(rows)


def bars(per_case: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Issue 24's bars over every run: a removal's stall <= 5 s; a join's stall <= one interval + the pull."""
    removals = [r["stall"] for c in ("kill", "hang") for r in per_case.get(c, []) if not math.isnan(r.get("stall", math.nan))]
    joins = [(r["stall"], r["bar"]) for r in per_case.get("join", []) if not math.isnan(r.get("stall", math.nan))]
    return {"removal_max_stall_s": max(removals, default=math.nan), "removal_bar_s": REMOVAL_BAR_S,
            "removal_met": max(removals) <= REMOVAL_BAR_S if removals else None,  # None: not measured
            "join_runs_within_bar": sum(1 for s, b in joins if s <= b), "join_runs": len(joins),
            "join_met": all(s <= b for s, b in joins) if joins else None}


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "NOT met"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--repeats", type=int, default=3, help="jobs per case (default 3)")
    p.add_argument("--model-mb", type=float, default=4.0, help="the model's size in MB of float32 (default 4)")
    p.add_argument("--keys", type=int, default=4, help="keys the model is cut into (default 4)")
    p.add_argument("--commit-every", type=int, default=1, help="steps between commits (default 1)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="sleep per step for forward+backward (default 20)")
    p.add_argument("--change-step", type=int, default=10, help="the step the change comes at (default 10)")
    p.add_argument("--after", type=int, default=12, help="steps the job runs past the change (default 12)")
    p.add_argument("--no-timeline", action="store_true", help="skip the kill-then-join trace job")
    p.add_argument("--json", type=Path, default=None, help="write the results here (default: none)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the jobs (cases interleaved, so a drift of the shared machine hits each), print the table, write JSON."""
    args = parse_args(argv)
    install_sigterm_handler()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    stamp, load_before = datetime.now(timezone.utc), os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_elastic_") as tmp:
        plan = [c for _ in range(args.repeats) for c in cases] + ([] if args.no_timeline else ["timeline"])
        for i, case in enumerate(plan):
            run = run_job(case, args, Path(tmp))
            run["metrics"] = metrics_of(run, args.commit_every)
            runs.append(run)
            shown = ", ".join(f"{k} {v:.3f}" for k, v in run["metrics"].items() if k in ("stall", "detect", "kill_stall",
                                                                                      "join_stall"))
            print(f"[{i + 1}/{len(plan)}] {case}: exit {run['code']}, {run['wall_s']:.1f} s; {shown}", file=sys.stderr)
    per_case = {c: [r["metrics"] for r in runs if r["case"] == c] for c in [*cases, "timeline"]}
    summaries = {c: summary(m) for c, m in per_case.items() if m}
    verdict = bars(per_case)
    print(table(summaries))
    print(f"\nbars: removal stall <= {REMOVAL_BAR_S:g} s: {_verdict(verdict['removal_met'])} "
          f"(max {verdict['removal_max_stall_s']:.3f} s); join stall <= one interval + the pull: "
          f"{_verdict(verdict['join_met'])} ({verdict['join_runs_within_bar']}/{verdict['join_runs']} runs)")
    odd = sorted({re.sub(r"\d{4}-\d\d-\d\d [\d:.]+ ", "", line) for r in runs for line in r["error_lines"]})
    if odd:
        print(f"\n{len(odd)} distinct error lines in the jobs' output (each run's are in the JSON's error_lines):\n  "
              + "\n  ".join(odd[:12]), file=sys.stderr)
    if args.json is not None:
        payload = {"benchmark": "bench_elastic", "date_utc": stamp.isoformat(timespec="seconds"), "commit": git_commit(),
                   "uncommitted_in_pskv": subprocess.run(["git", "status", "--porcelain", "pskv"], cwd=REPO_DIR,
                                                         capture_output=True, text=True).stdout.splitlines(),
                   "argv": list(sys.argv[1:] if argv is None else argv), "settings": vars(args) | {"json": str(args.json)},
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                               "loadavg_1_5_15_before": load_before, "loadavg_1_5_15_after": os.getloadavg()},
                   "summaries": summaries, "bars": verdict, "runs": runs}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1, allow_nan=True), encoding="utf-8")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
