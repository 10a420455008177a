"""The runs: one function per kind of trial, each starting a job, injecting its fault and returning what it saw.

Every ``trial_*`` function takes a fresh temporary directory, always reaps its job, and
returns a JSON-able dict that :mod:`.report` turns into a table row. :func:`plan` lists
the runs of the chosen rows; :func:`run_trial` runs one and records a failure instead
of raising. Hostile messages come from ``pskv.testing.fuzz`` of the measured ``pskv``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import random
import re
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import Job, Launch, Proc, first_after, log, send_signal, strip_log
from .settings import (
    DEFAULT_HB,
    EXTRA_STEPS,
    RECOVERY_TIMEOUT,
    REPLACE_SERVER_STEP,
    REPLACE_WORKER_STEP,
    REPO,
    RESTART_EXACT_SPEC,
    RESTART_EXACT_WINDOW,
    RESTART_SPEC,
    SHORT_HB,
    SIZES,
    STOP_DEFAULT,
    STOP_SHORT,
)


def _first_mention(lines: list[str], needle: str) -> str | None:
    """The first log line naming ``needle`` as dead or failed, else the first naming it at all."""
    for line in lines:
        if needle in line and ("dead" in line or "failed" in line or "Error" in line):
            return line.strip()[:220]
    return next((line.strip()[:220] for line in lines if needle in line and "serving on" not in line), None)


def _survivor_view(job: Job, victim: str, codes: dict[str, int | None]) -> dict[str, Any]:
    """What each surviving process saw: workers' error events, servers'/scheduler's log line and exit code."""
    view: dict[str, Any] = {}
    for name, p in job.procs.items():
        if name == victim:
            continue
        entry: dict[str, Any] = {"exit": codes.get(name)}
        if name.startswith("worker"):
            errs = [e for e in p.events() if e["ev"] == "error"]
            entry["error"] = errs[0] if errs else None
            entry["done"] = any(e["ev"] == "done" for e in p.events())
            entry["mismatches"] = max([e.get("mismatches", 0) for e in p.events() if e["ev"] in ("error", "done")],
                                      default=0)
            entry["rounds_checked"] = max([e.get("steps", 0) for e in p.events() if e["ev"] in ("error", "done")],
                                          default=0)
        else:
            entry["line"] = _first_mention(p.text(), victim)
        entry["tail"] = p.text()[-4:]
        view[name] = entry
    return view


def trial_kill(tmp: Path, victim: str, hb: dict[str, str], sig: signal.Signals = signal.SIGKILL) -> dict[str, Any]:
    """SIGKILL (or SIGSTOP) ``victim`` of a hand-started job (scheduler, 2 servers, 2 workers)."""
    timeout_hb = float(hb["PS_HEARTBEAT_TIMEOUT"])
    job = Job(tmp, 2, 2, {"mode": "train", "pace": 0.02}, hb)
    result: dict[str, Any] = {"victim": victim, "signal": sig.name}
    try:
        workers = ["worker 0", "worker 1"]
        job.wait_ready(workers)
        time.sleep(0.5)  # mid-training
        t0 = send_signal(job.procs[victim].pid, sig)
        survivors_w = [w for w in workers if w != victim]
        limit = timeout_hb * 2 + 20  # past this a survivor is hung
        if sig is signal.SIGSTOP:  # the stall report names the silent worker first
            stall = [job.procs[s].find(lambda s_: "has waited" in s_ and victim in s_, limit)
                     for s in ("server 0", "server 1")]
            times = [x[0] for x in stall if x is not None]
            result["stall_s"] = round(min(times) - t0, 3) if times else None
            result["stall_line"] = next((x[1].strip()[:220] for x in stall if x is not None), None)
        errs = {w: job.procs[w].wait_event("error", max(0.1, t0 + limit - time.monotonic())) for w in survivors_w}
        got = [e["t"] for e in errs.values() if e is not None]
        result["detect_s"] = round(min(got) - t0, 3) if got else None
        result["hang"] = [w for w, e in errs.items() if e is None]
        if sig is signal.SIGSTOP:  # let it go on: what does a worker declared dead see?
            time.sleep(0.2)
            tc = send_signal(job.procs[victim].pid, signal.SIGCONT)
            late = job.procs[victim].wait_event("error", timeout_hb * 2 + 5)
            result["after_cont"] = ({"type": late["type"], "node": late.get("node"), "msg": late["msg"],
                                     "after_s": round(late["t"] - tc, 3)} if late else None)
            result["after_cont_tail"] = job.procs[victim].text()[-3:]
        others = [n for n in job.procs if n != victim]
        codes = job.wait_exit(others, 30)
        if sig is signal.SIGSTOP:
            codes[victim] = job.procs[victim].wait(5)
        result["exit_codes"] = codes
        result["survivors"] = _survivor_view(job, victim, codes)
    finally:
        job.reap()
    return result


def trial_launch_view(tmp: Path, role: str, rank: int | None, sig: signal.Signals, hb: dict[str, str]) -> dict[str, Any]:
    """The same fault under ``pskv launch``: its exit code and root-cause line."""
    launch = Launch(tmp, 2, 2, {"mode": "train", "pace": 0.02}, hb)
    result: dict[str, Any] = {}
    try:
        for w in (0, 1):
            if launch.proc.wait_event("ready", 90, source=f"[worker {w}]") is None:
                raise RuntimeError("the launched job did not get ready: " + " | ".join(launch.proc.text()[-6:]))
        time.sleep(0.5)
        pid = launch.child(role, rank)
        t0 = send_signal(pid, sig)
        rc = launch.proc.wait(float(hb["PS_HEARTBEAT_TIMEOUT"]) * 2 + 40)
        result["exit_code"] = rc
        lines = launch.launcher_lines()
        result["launcher_lines"] = lines
        result["root_cause"] = lines[0] if lines else None
        first = launch.proc.find(lambda s: s.startswith("pskv launch: "), 0)
        result["root_cause_after_s"] = round(first[0] - t0, 3) if first else None
    finally:
        if sig is signal.SIGSTOP:
            for pid in launch.seen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        launch.reap()
    return result


def trial_restart(tmp: Path, kill_after_step: int | None) -> dict[str, Any]:
    """``pskv launch --checkpoint-dir --max-restarts 1``; SIGKILL server 0 after worker 0's step ``kill_after_step``."""
    ckpts = tmp / "ckpts"
    options = ["--checkpoint-dir", str(ckpts)]
    if kill_after_step is not None:
        options += ["--max-restarts", "1"]
    launch = Launch(tmp, 2, 2, RESTART_SPEC, DEFAULT_HB, options)
    result: dict[str, Any] = {}
    try:
        p = launch.proc
        if kill_after_step is not None:
            if p.wait_event("step", 90, "[worker 0]", lambda e: e["step"] >= kill_after_step) is None:
                raise RuntimeError("no training progress: " + " | ".join(p.text()[-6:]))
            t0 = send_signal(launch.child("server", 0), signal.SIGKILL)
            steps_before = {w: max([e["step"] for e in p.events(f"[worker {w}]") if e["ev"] == "step"], default=-1)
                            for w in (0, 1)}
            root = p.find(lambda s: s.startswith("pskv launch: server 0 "), 30)
            restart = p.find(lambda s: "restarting the job" in s, 30)
            resumed = p.find(lambda s: "resumed at step" in s, 90)
            result["root_cause"] = root[1] if root else None
            result["root_cause_after_s"] = round(root[0] - t0, 3) if root else None
            result["restart_line"] = restart[1] if restart else None
            result["running_again_s"] = round(resumed[0] - t0, 3) if resumed else None
            # steps finished before the restart (events received before the restart line)
            if restart:
                for w in (0, 1):
                    done = [e["step"] for e in p.events(f"[worker {w}]") if e["ev"] == "step" and e["recv"] < restart[0]]
                    steps_before[w] = max(done, default=-1)
            result["steps_done_before_kill"] = steps_before
        rc = p.wait(120)
        result["exit_code"] = rc
        result["launcher_lines"] = launch.launcher_lines()
        finals = {e["rank"]: e["sha"] for e in p.events() if e["ev"] == "final"}
        result["finals"] = finals
        resumed_ev = [e for e in p.events() if e["ev"] == "resumed"]
        result["resumed_at"] = sorted({e["step"] for e in resumed_ev})
        if kill_after_step is not None and resumed_ev:
            start = resumed_ev[0]["step"]
            result["rounds_replayed"] = max(result["steps_done_before_kill"].values()) - start + 1
        result["checkpoints"] = sorted(d.name for d in ckpts.iterdir()) if ckpts.exists() else []
    finally:
        launch.reap()
    return result


def _replace_options(tmp: Path, role: str, kill: bool) -> tuple[dict[str, Any], list[str]]:
    """The worker spec and the launcher options of a replace_<role> run."""
    spec: dict[str, Any] = dict(RESTART_SPEC)  # the restart row's computation: the crash-free finals agree
    if role == "worker":
        spec["every"] = 0
        options = ["--restart-workers", "1", "--recovery-timeout", RECOVERY_TIMEOUT]
        if kill:
            spec["pause"] = {"rank": 1, "step": REPLACE_WORKER_STEP, "marker": str(tmp / "worker1-step"), "max_s": 60}
    else:
        options = ["--restart-servers", "1", "--checkpoint-dir", str(tmp / "ckpts"), "--recovery-timeout",
                   RECOVERY_TIMEOUT]
    return spec, options


def _kill_and_watch_replacement(launch: Launch, role: str, victim: str, result: dict[str, Any]) -> None:
    """SIGKILL ``victim`` at its point of the run; record when the launcher, the replacement, the
    scheduler and the training noticed or went on."""
    p = launch.proc
    if role == "worker":
        ready = p.wait_event("paused", 90, "[worker 1]")
    else:
        ready = p.wait_event("step", 90, "[worker 0]", lambda e: e["step"] >= REPLACE_SERVER_STEP)
    if ready is None:
        raise RuntimeError("no training progress: " + " | ".join(p.text()[-6:]))
    t0 = send_signal(launch.child(role, 1 if role == "worker" else 0), signal.SIGKILL)
    before = {w: max([e["step"] for e in p.events(f"[worker {w}]") if e["ev"] == "step" and e["t"] < t0],
                     default=-1) for w in (0, 1)}
    result["steps_done_before_kill"] = before
    last = max(before.values())
    # progress: a step beyond every step finished before the kill; it needs the replacement
    progress = p.wait_event("step", 90, None, lambda e: e["t"] > t0 and e["step"] > last)
    restart = p.find(lambda s: s.startswith("pskv launch: ") and "starting it again" in s, 5)
    result["launcher_noticed_s"] = round(restart[0] - t0, 3) if restart else None
    result["restart_line"] = restart[1] if restart else None
    first = first_after(p, restart[0] if restart else t0, lambda s: s.startswith(f"[{victim}]"))
    result["replacement_first_line_s"] = round(first[0] - t0, 3) if first else None
    result["replacement_first_line"] = first[1][:200] if first else None
    rejoined = first_after(p, t0, lambda s: f"{victim} rejoined" in s)
    result["scheduler_rejoined_s"] = round(rejoined[0] - t0, 3) if rejoined else None
    result["progress_s"] = round(progress["t"] - t0, 3) if progress else None
    result["progress_step"] = {"step": progress["step"], "src": progress["src"]} if progress else None
    if role == "worker":
        ev = p.wait_event("rejoined", 5, "[worker 1]")
        result["rejoined_at_step"] = ev["step"] if ev else None
        result["rejoined_s"] = round(ev["t"] - t0, 3) if ev else None
    else:
        _watch_server_replay(p, t0, result)


def _watch_server_replay(p: Proc, t0: float, result: dict[str, Any]) -> None:
    """The replacement server's "restored" line and the workers' lines sending it their pushes again."""
    restored = first_after(p, t0, lambda s: "server 0: restored" in s)
    result["restored_line"] = strip_log(restored[1]) if restored else None
    with p.cond:
        replays = [(t, line) for t, line in p.lines if t > t0 and "server 0 replaced: sending it" in line]
    result["replay_lines"] = [strip_log(line) for _, line in replays]
    result["replay_s"] = round(replays[0][0] - t0, 3) if replays else None
    result["pushes_replayed"] = [int(m.group(1)) for _, line in replays
                                 if (m := re.search(r"sending it (\d+) push", line))]


def trial_replace(tmp: Path, role: str, kill: bool) -> dict[str, Any]:
    """Replacement of one process in the running job: ``role`` "worker" (``--restart-workers 1``) or
    "server" (``--restart-servers 1 --checkpoint-dir``); ``kill`` False: the crash-free reference run.

    Worker: worker 1 stops before pushing step REPLACE_WORKER_STEP (it writes the step to a marker
    file first), is SIGKILLed, and its replacement goes on from that step. Server: server 0 is
    SIGKILLed after worker 0's step REPLACE_SERVER_STEP, at no particular point of a round.
    """
    ckpts = tmp / "ckpts"
    spec, options = _replace_options(tmp, role, kill)
    launch = Launch(tmp, 2, 2, spec, DEFAULT_HB, options)
    victim = "worker 1" if role == "worker" else "server 0"
    result: dict[str, Any] = {"role": role, "kill": kill, "options": options}
    try:
        p = launch.proc
        if kill:
            _kill_and_watch_replacement(launch, role, victim, result)
        rc = p.wait(120)
        result["exit_code"] = rc
        result["launcher_lines"] = launch.launcher_lines()
        result["finals"] = {e["rank"]: e["sha"] for e in p.events() if e["ev"] == "final"}
        result["checkpoints"] = sorted(d.name for d in ckpts.iterdir()) if ckpts.exists() else []
        result["tail"] = p.text()[-6:]
    finally:
        launch.reap()
    return result


def trial_restart_exact(tmp: Path, seed: int | None) -> dict[str, Any]:
    """``--restart-workers 1``: worker 1 SIGKILLed at a random moment (``seed``; None: the crash-free reference).

    The kill falls uniformly within RESTART_EXACT_WINDOW s after worker 1's first step: before,
    during or right after a push, during a pull or between steps. The replacement goes on from
    ``kv.resume_step()`` (what the servers say of its rank's pushes). Recorded: the last step
    worker 1 finished before the kill, the step its replacement went on from (one more than
    that: the push after it had not landed; two more: it had), the exit code, and both
    workers' final values (SHA-256).
    """
    options = ["--restart-workers", "1", "--recovery-timeout", RECOVERY_TIMEOUT]
    launch = Launch(tmp, 2, 2, dict(RESTART_EXACT_SPEC), DEFAULT_HB, options)
    result: dict[str, Any] = {"seed": seed}
    t0 = 0.0
    try:
        p = launch.proc
        if seed is not None:
            if p.wait_event("step", 90, "[worker 1]") is None:
                raise RuntimeError("no training progress: " + " | ".join(p.text()[-6:]))
            delay = random.Random(seed).uniform(0.0, RESTART_EXACT_WINDOW)
            time.sleep(delay)
            t0 = send_signal(launch.child("worker", 1), signal.SIGKILL)
            result["delay_s"] = round(delay, 3)
            result["last_step_before_kill"] = max([e["step"] for e in p.events("[worker 1]")
                                                   if e["ev"] == "step" and e["t"] < t0], default=-1)
            finished = [e for e in p.events("[worker 1]") if e["ev"] == "final" and e["t"] < t0]
            result["killed_after_final"] = bool(finished)
            ev = p.wait_event("rejoined", 60, "[worker 1]")
            result["rejoined_at_step"] = ev["step"] if ev else None
            result["rejoined_s"] = round(ev["t"] - t0, 3) if ev else None
        rc = p.wait(120)
        result["exit_code"] = rc
        result["hang"] = rc is None
        if seed is not None and rc is not None:
            result["kill_to_exit_s"] = round(time.monotonic() - t0, 3)
        result["launcher_lines"] = launch.launcher_lines()
        result["finals"] = {e["rank"]: e["sha"] for e in p.events() if e["ev"] == "final"}  # each rank's last
        result["tail"] = p.text()[-6:]
    finally:
        launch.reap()
    return result


def trial_uneven(tmp: Path, variant: str) -> dict[str, Any]:
    """Worker 0: 3 batches, worker 1: 5. ``none``: no mechanism; ``join``: kv.join(); ``fit``: fit(uneven=True)."""
    if variant == "fit":
        spec: dict[str, Any] = {"mode": "fit", "epochs": 3}
    else:
        spec = {"mode": "uneven", "join": variant == "join", "epochs": 1 if variant == "none" else 2}
    job = Job(tmp, 1, 2, spec, {**DEFAULT_HB, "PSKV_REQUEST_TIMEOUT": "5"})
    result: dict[str, Any] = {"variant": variant}
    try:
        codes = job.wait_exit(["worker 0", "worker 1"], 90)
        codes.update(job.wait_exit(["server 0", "scheduler"], 30))
        result["exit_codes"] = codes
        result["hang"] = [n for n, c in codes.items() if c is None]
        for w in ("worker 0", "worker 1"):
            evs = job.procs[w].events()
            result[w] = {"error": next((e for e in evs if e["ev"] == "error"), None),
                         "done": next((e for e in evs if e["ev"] == "done"), None),
                         "close": next((e for e in evs if e["ev"] in ("closed", "close_error")), None),
                         "steps": sum(e["ev"] == "step" for e in evs)}
            if variant != "fit":
                result[w]["mismatches"] = sum(e["ev"] == "step" and e["value"] != e["want"] for e in evs)
        err = result["worker 1"]["error"]
        if variant == "none" and err is not None:
            started = err.get("call_started", err["t"])
            stall = job.procs["server 0"].find(lambda s: "has waited" in s, 0)
            result["stall_s"] = round(stall[0] - started, 3) if stall else None
            result["stall_line"] = stall[1].strip()[:220] if stall else None
            result["error_s"] = round(err["t"] - started, 3)
        result["server_tail"] = job.procs["server 0"].text()[-4:]
    finally:
        job.reap()
    return result


FORGED = {
    "dtype": "PUSH of key 100 as float64 (the key is float32)",
    "shape": "PUSH of key 100 with 3 elements too many",
    "shm": 'PUSH without data naming key 100 in its shared-memory list (body {"shm": [[100, 0]]})',
    "join": "JOIN (no data left)",
}


def fuzz_module() -> Any:
    """``pskv.testing.fuzz`` of the measured pskv; for a ``--pskv-commit`` older than that module,
    this checkout's copy (built on the measured ``pskv.protocol``)."""
    try:
        from pskv.testing import fuzz
    except ImportError:
        spec = importlib.util.spec_from_file_location("pskv_bench_fuzz", REPO / "pskv" / "testing" / "fuzz.py")
        assert spec is not None and spec.loader is not None
        fuzz = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fuzz)
    return fuzz


def forged_messages(variant: str) -> list[tuple[str, list[bytes]]]:
    """One well-formed message claiming worker 0's id (9) that acts on the job's own key 100 / its rounds."""
    return [(FORGED[variant], fuzz_module().forged_messages(100, SIZES[0], sender=9)[variant])]


@functools.lru_cache(maxsize=1)
def big_header() -> tuple[bytes, ...]:
    """A PUSH header declaring 2,000,000 arrays (14 MB, under the 16 MB header limit), and its data frame."""
    return tuple(fuzz_module().big_header(2_000_000))


def _probe(sock: Any, before: list[bytes]) -> float | None:
    """Seconds until the server answers a PULL of an unknown key sent right after ``before`` (if any)."""
    fuzz = fuzz_module()
    while sock.poll(0):
        sock.recv_multipart()
    start = time.monotonic()
    if before:
        sock.send_multipart(before)
    sock.send_multipart(fuzz.probe_pull(424242, key=7, sender=9))
    deadline = start + 30
    while time.monotonic() < deadline:
        if sock.poll(100) and fuzz.reply_request(sock.recv_multipart()[0]) == 424242:
            return round(time.monotonic() - start, 3)
    return None


def _tracebacks(lines: list[str]) -> dict[str, int]:
    """``{"<handler> failed: <exception line> at <last frame>": count}`` for every traceback in a log."""
    found: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.startswith("Traceback"):
            continue
        what = lines[i - 1].split("pskv.server: ", 1)[-1] if i else ""
        j, frame = i + 1, ""
        while j < len(lines) and (lines[j].startswith(" ") or lines[j].startswith("Traceback")):
            if lines[j].lstrip().startswith("File "):
                frame = lines[j].strip().replace(str(REPO) + "/", "")
            j += 1
        exc = lines[j] if j < len(lines) else "?"
        key = f"{what}: {exc[:160]} at {frame[:160]}"
        found[key] = found.get(key, 0) + 1
    return found


def _max_gap(events: list[dict[str, Any]], start: float, end: float) -> float | None:
    """The longest time between consecutive step events (every 10 steps) overlapping [start, end]."""
    ts = sorted(e["t"] for e in events if e["ev"] == "step")
    gaps = [b - a for a, b in zip(ts, ts[1:]) if b >= start and a <= end]
    return round(max(gaps), 3) if gaps else None


def _server_address(job: Job) -> str:
    line = job.procs["server 0"].find(lambda s: "serving on tcp://" in s, 10)
    if line is None:
        raise RuntimeError("no server address in its log")
    return "tcp://" + line[1].split("serving on tcp://")[1].split()[0]


def _send_stream(address: str, messages: list[tuple[str, list[bytes]]], forged: bool,
                 result: dict[str, Any]) -> tuple[float, float, dict[str, int]]:
    """Send ``messages`` from a plain DEALER, count the replies; without ``forged`` also probe how long
    the server takes to answer after the stream and after one big header.

    Returns:
        When sending started, when the server had worked through the stream, the replies by kind.
    """
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 5000
    replies = {"error": 0, "other": 0}
    sent = 0
    start = stream_end = backlog_done = time.monotonic()
    try:
        sock.connect(address)
        for _kind, frames in messages:
            sock.send_multipart(frames)
            sent += 1
            while sock.poll(0):
                replies["error" if b"Error" in sock.recv_multipart()[0] else "other"] += 1
            if forged:
                time.sleep(0.3)  # between the workers' steps
        stream_end = time.monotonic()
        end = stream_end + 1.0
        while time.monotonic() < end:
            if sock.poll(100):
                replies["error" if b"Error" in sock.recv_multipart()[0] else "other"] += 1
        if not forged:  # how long one big (still under the 16 MB limit) header holds the server up
            result["backlog_s"] = _probe(sock, [])  # until the server has worked through the stream
            backlog_done = time.monotonic()
            time.sleep(1.5)  # the workers step again before the next probe holds the server up
            result["probe_s"] = _probe(sock, [])
            result["big_header_mb"] = round(len(big_header()[0]) / 1e6, 1)
            result["probe_after_big_header_s"] = _probe(sock, list(big_header()))
    finally:
        sock.close(0)
        ctx.term()
    result["sent"] = sent
    result["send_s"] = round(stream_end - start, 3)
    return start, backlog_done, replies


def _stop_workers(job: Job, stop_file: Path, result: dict[str, Any]) -> None:
    """Tell the workers to stop EXTRA_STEPS after the newest step, and wait for the job to end."""
    last = max([e["step"] for w in ("worker 0", "worker 1") for e in job.procs[w].events() if e["ev"] == "step"],
               default=0)
    result["stop_step"] = last + EXTRA_STEPS
    tmp_stop = stop_file.with_suffix(".tmp")
    tmp_stop.write_text(str(last + EXTRA_STEPS), encoding="ascii")
    tmp_stop.replace(stop_file)  # atomic: a worker never reads half a number
    codes = job.wait_exit(["worker 0", "worker 1"], 60)
    codes.update(job.wait_exit(["server 0", "scheduler"], 30))
    result["exit_codes"] = codes
    result["hang"] = [n for n, c in codes.items() if c is None]


def _fuzz_outcome(job: Job, result: dict[str, Any]) -> None:
    """What the server logged and what the workers saw."""
    slog = job.procs["server 0"].text()
    result["server_rejected_logged"] = sum("rejected a malformed message" in s for s in slog)
    result["server_tracebacks"] = sum(s.startswith("Traceback") for s in slog)
    result["server_dropped_replies"] = sum("reply to vanished peer" in s for s in slog)
    result["server_handler_failures"] = _tracebacks(slog)
    for w in ("worker 0", "worker 1"):
        evs = job.procs[w].events()
        result[w] = {"error": next((e for e in evs if e["ev"] == "error"), None),
                     "done": next((e for e in evs if e["ev"] == "done"), None),
                     "mismatch_events": [e for e in evs if e["ev"] == "mismatch"][:3]}
    ends = [result[w]["done"] or result[w]["error"] or {} for w in ("worker 0", "worker 1")]
    result["mismatches"] = sum(int(e.get("mismatches", 0)) for e in ends)
    result["rounds_checked"] = sum(int(e.get("steps", 0)) for e in ends)


def trial_fuzz(tmp: Path, forged: str | None, count: int, seed: int) -> dict[str, Any]:
    """Hostile messages to the live server of a 1-server, 2-worker job while the workers train and check."""
    stop_file = tmp / "fuzz-done"
    job = Job(tmp, 1, 2, {"mode": "train", "pace": 0.02, "stop_file": str(stop_file)},
              {**DEFAULT_HB, "PSKV_REQUEST_TIMEOUT": "15"})
    result: dict[str, Any] = {"forged": forged}
    try:
        job.wait_ready(["worker 0", "worker 1"])
        address = _server_address(job)
        rng = random.Random(seed)
        messages = forged_messages(forged) if forged else fuzz_module().hostile_messages(rng, count)
        start, backlog_done, replies = _send_stream(address, messages, bool(forged), result)
        if not forged:  # the workers' longest pause (step events every 10 steps) while the stream was handled
            time.sleep(1.0)
            ev0 = job.procs["worker 0"].events()
            result["step_gap_before_s"] = _max_gap(ev0, start - 3, start - 0.5)
            result["step_gap_during_s"] = _max_gap(ev0, start, backlog_done)
        result["kinds"] = sorted({k for k, _ in messages})
        result["replies"] = replies
        _stop_workers(job, stop_file, result)
        _fuzz_outcome(job, result)
    finally:
        job.reap()
    return result


class Trial:
    """One run of a row: ``fn(tmp)`` returns its result; heavier runs (``weight``) start first."""

    def __init__(self, row: str, label: str, fn: Callable[[Path], dict[str, Any]], weight: float) -> None:
        self.row, self.label, self.fn, self.weight = row, label, fn, weight


ROWS = ["kill_server", "kill_server_short", "kill_worker", "kill_worker_short", "kill_scheduler",
        "kill_scheduler_short", "restart", "replace_worker", "replace_server", "restart_exact", "stop_worker",
        "stop_worker_short",
        "uneven_none", "uneven_join", "uneven_fit", "fuzz", "forged", "hostile"]
GROUPS = {"kill_server": ["kill_server", "kill_server_short"], "kill_worker": ["kill_worker", "kill_worker_short"],
          "kill_scheduler": ["kill_scheduler", "kill_scheduler_short"], "restart": ["restart"],
          "replace_worker": ["replace_worker"], "replace_server": ["replace_server"], "restart_exact": ["restart_exact"],
          "stop_worker": ["stop_worker", "stop_worker_short"], "uneven": ["uneven_none", "uneven_join", "uneven_fit"],
          "fuzz": ["fuzz"], "forged": ["forged"], "hostile": ["hostile"],
          **{f"hostile_{c}": [f"hostile_{c}"] for c in ("slow_reader", "many_frames", "oversize", "forged_sender",
                                                        "replay", "unix_junk", "state_growth", "chosen_paths", "slow_member",
                                                        "growth_member", "wide_push", "stranger_conns", "data_flood")}}


def _kill_trials(rows: list[str], repeats: int) -> list[Trial]:
    """The kill rows (server, worker, scheduler; default and short heartbeats), each with its launcher view."""
    trials: list[Trial] = []
    kills = {"kill_server": ("server 1", "server", 1), "kill_worker": ("worker 1", "worker", 1),
             "kill_scheduler": ("scheduler", "scheduler", None)}
    for base, (victim, role, rank) in kills.items():
        for short in (False, True):
            row = base + ("_short" if short else "")
            if row not in rows:
                continue
            hb = SHORT_HB if short else DEFAULT_HB
            for r in range(repeats):
                trials.append(Trial(row, f"{row}#{r}", lambda t, v=victim, h=hb: trial_kill(t, v, h), 22 if not short else 12))
            if not short:
                trials.append(Trial(row + ":launch", f"{row}:launch", lambda t, ro=role, ra=rank: trial_launch_view(
                    t, ro, ra, signal.SIGKILL, DEFAULT_HB), 10))
    return trials


def _stop_trials(rows: list[str], repeats: int) -> list[Trial]:
    """The stopped-worker rows (SIGSTOP; default and short heartbeats), the default one with its launcher view."""
    trials: list[Trial] = []
    for short in (False, True):
        row = "stop_worker" + ("_short" if short else "")
        if row in rows:
            hb = STOP_SHORT if short else STOP_DEFAULT
            for r in range(repeats):
                trials.append(Trial(row, f"{row}#{r}", lambda t, h=hb: trial_kill(t, "worker 1", h, signal.SIGSTOP),
                                    40 if not short else 16))
            if not short:
                trials.append(Trial(row + ":launch", f"{row}:launch", lambda t: trial_launch_view(
                    t, "worker", 1, signal.SIGSTOP, STOP_DEFAULT), 20))
    return trials


def _restart_trials(rows: list[str], repeats: int) -> list[Trial]:
    """The restart and replacement rows, each with its reference run."""
    trials: list[Trial] = []
    if "restart" in rows:
        trials.append(Trial("restart:reference", "restart:reference", lambda t: trial_restart(t, None), 12))
        for r in range(repeats):
            trials.append(Trial("restart", f"restart#{r}", lambda t: trial_restart(t, 5), 18))
    for role in ("worker", "server"):
        row = f"replace_{role}"
        if row in rows:
            trials.append(Trial(f"{row}:reference", f"{row}:reference", lambda t, ro=role: trial_replace(t, ro, False),
                                12))
            for r in range(repeats):
                trials.append(Trial(row, f"{row}#{r}", lambda t, ro=role: trial_replace(t, ro, True), 18))
    if "restart_exact" in rows:
        trials.append(Trial("restart_exact:reference", "restart_exact:reference",
                            lambda t: trial_restart_exact(t, None), 12))
        for r in range(repeats):
            trials.append(Trial("restart_exact", f"restart_exact#{r}", lambda t, s=r: trial_restart_exact(t, 4200 + s),
                                14))
    return trials


def _input_trials(rows: list[str], repeats: int, fuzz_count: int) -> list[Trial]:
    """The uneven-data, fuzz, forged-message and hostile-peer rows."""
    trials: list[Trial] = []
    for variant in ("none", "join", "fit"):
        row = f"uneven_{variant}"
        if row in rows:
            n = 1 if variant == "fit" else repeats
            for r in range(n):
                trials.append(Trial(row, f"{row}#{r}", lambda t, v=variant: trial_uneven(t, v), 12 if variant != "join" else 6))
    if "fuzz" in rows:
        for r in range(repeats):
            trials.append(Trial("fuzz", f"fuzz#{r}", lambda t, s=r: trial_fuzz(t, False, fuzz_count, 1000 + s), 8))
    if "forged" in rows:
        for variant in FORGED:
            trials.append(Trial("forged", f"forged_{variant}#0", lambda t, v=variant: trial_fuzz(t, v, 0, 7), 10))
    from .hostile import CATEGORIES, trial_hostile

    for category in CATEGORIES:
        if "hostile" in rows or f"hostile_{category}" in rows:
            for r in range(min(repeats, 2)):
                trials.append(Trial("hostile", f"hostile_{category}#{r}",
                                    lambda t, c=category: trial_hostile(t, c), 12))
    return trials


def plan(rows: list[str], repeats: int, fuzz_count: int) -> list[Trial]:
    """The trials of ``rows``, heaviest first."""
    trials = (_kill_trials(rows, repeats) + _stop_trials(rows, repeats) + _restart_trials(rows, repeats)
              + _input_trials(rows, repeats, fuzz_count))
    trials.sort(key=lambda tr: -tr.weight)  # longest first: the pool ends together
    return trials


def run_trial(trial: Trial, root: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=trial.label.replace("#", "-").replace(":", "-") + "-", dir=root))
    start = time.monotonic()
    log(f"start {trial.label}")
    try:
        out = trial.fn(tmp)
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a failed trial is reported, the others still run
        out = {"ok": False, "failure": f"{type(exc).__name__}: {exc}"[:1500]}
    out["wall_s"] = round(time.monotonic() - start, 2)
    out["label"] = trial.label
    log(f"end   {trial.label} in {out['wall_s']:.1f} s" + ("" if out["ok"] else f" FAILED: {out['failure'][:300]}"))
    return out
