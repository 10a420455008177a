"""The timeline file (``PSKV_TIMELINE``, :mod:`pskv.timeline`): trace-event format, lanes, bounds,
a killed writer, merging; the spans of an in-process job; nothing at all when it is off.

:func:`check_trace` is the trace-event format check the launched-job test uses too
(``tests/integration/test_timeline.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pskv
from pskv import cli
from pskv.optimizer import SGD
from pskv.testing import InProcessCluster
from pskv.timeline import Timeline, merge, open_timeline, trace_path
from pskv.timeline import load as load_timeline
from pskv.worker import spans as worker_spans

REPO = Path(__file__).resolve().parents[2]
PHASES = {"X", "B", "E", "M", "i", "I", "C"}


def check_trace(trace: Any) -> list[dict[str, Any]]:
    """Check ``trace`` against the trace-event format (the JSON object form); returns its events.

    Every event: ``name`` (str), ``ph``, integer ``pid`` and ``tid``; all but metadata: a
    number ``ts`` >= 0, ``X`` a ``dur`` >= 0; ``args`` an object. Per ``(pid, tid)``, in file
    order: ``ts`` never decreases, ``B``/``E`` pair up as a stack (same name), and an ``X``
    span starts after the previous one ended or lies inside it (they nest). Metadata name
    every process and thread that has events.
    """
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list), "not {'traceEvents': [...]}"
    events = trace["traceEvents"]
    named_processes, named_threads = set(), set()
    last_ts: dict[tuple[int, int], float] = {}
    stacks: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)  # open B, or X spans (name, end)
    for e in events:
        assert isinstance(e, dict) and isinstance(e.get("name"), str), e
        assert e.get("ph") in PHASES, e
        assert type(e.get("pid")) is int and type(e.get("tid")) is int, e
        assert isinstance(e.get("args", {}), dict), e
        where = (e["pid"], e["tid"])
        if e["ph"] == "M":
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add(where)
            continue
        ts = e.get("ts")
        assert isinstance(ts, (int, float)) and ts >= 0, e
        assert ts >= last_ts.get(where, 0), f"ts goes back on {where}: {e}"
        last_ts[where] = ts
        stack = stacks[where]
        while stack and stack[-1][1] <= ts and stack[-1][0] != "B":  # X spans that ended by now
            stack.pop()
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            end = ts + e["dur"]
            assert not stack or stack[-1][1] >= end, f"{e} overlaps the span before it on {where}"
            stack.append(("X", end))
        elif e["ph"] == "B":
            stack.append(("B", float("inf")))
        elif e["ph"] == "E":
            assert stack and stack[-1][0] == "B", f"E without B on {where}: {e}"
            stack.pop()
    for where, stack in stacks.items():
        assert not [s for s in stack if s[0] == "B"], f"B without E on {where}"
        assert where[0] in named_processes, f"process {where[0]} has no process_name"
        assert where in named_threads, f"thread {where} has no thread_name"
    return events


def spans(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and e["name"] == name]


def load(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return check_trace(json.load(f))


def test_spans_become_a_valid_file_with_named_tracks_and_lanes_for_overlaps(tmp_path):
    timeline = Timeline(tmp_path / "t.json", "worker 3")
    t0 = time.monotonic()
    timeline.span("push", "key 1", t0, t0 + 0.010, {"key": 1, "round": 1, "bytes": 64})
    timeline.span("push", "key 1", t0 + 0.005, t0 + 0.015, {"key": 1, "round": 2})  # overlaps: a second lane
    timeline.span("pull", "key 1", t0 + 0.010, t0 + 0.020)  # after the first: back on lane 1
    timeline.span("wait", "wait (MainThread)", t0, t0 + 0.001)
    timeline.close()
    events = load(tmp_path / "t.json")
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["key 1", "key 1 #2", "wait (MainThread)"]
    assert [(names[e["tid"]], e["name"]) for e in spans(events, "push") + spans(events, "pull")] == [
        ("key 1", "push"), ("key 1 #2", "push"), ("key 1", "pull")]
    assert {e["name"]: e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        "process_name": "worker 3"}
    first = spans(events, "push")[0]
    assert first["args"] == {"key": 1, "round": 1, "bytes": 64} and first["pid"] == os.getpid()
    assert 9_000 <= first["dur"] <= 11_000  # microseconds
    timeline.span("push", "key 1", t0, t0 + 1)  # closed: ignored
    timeline.close()  # idempotent
    assert len(load(tmp_path / "t.json")) == len(events)


def test_the_queue_is_bounded_and_drops_are_counted_in_the_file(tmp_path):
    timeline = Timeline(tmp_path / "t.json", "server 0", flush_interval=3600, max_buffered=10)
    t0 = time.monotonic()
    for i in range(100):
        timeline.span("merge", "key 1", t0 + i, t0 + i + 0.5)
    timeline.close()
    with open(tmp_path / "t.json", encoding="utf-8") as f:
        trace = json.load(f)
    check_trace(trace)
    kept = spans(trace["traceEvents"], "merge")
    assert len(kept) < 10 and trace["otherData"]["dropped_events"] == 100 - len(kept)


def test_the_file_is_valid_json_after_every_flush(tmp_path):
    timeline = Timeline(tmp_path / "t.json", "worker 0", flush_interval=3600)
    t0 = time.monotonic()
    for i in range(3):
        timeline.span("push", f"key {i}", t0, t0 + 0.001, {"key": f'a "quoted"\nkey {i}'})
        timeline.flush()
        assert len(spans(load(tmp_path / "t.json"), "push")) == i + 1
    timeline.close()


KILLED = textwrap.dedent("""
    import sys, time
    from pskv.timeline import Timeline
    timeline = Timeline(sys.argv[1], "worker 0", flush_interval=0.02)
    i = 0
    while True:  # until killed
        now = time.monotonic()
        timeline.span("push", "key %d" % (i % 4), now, now + 1e-6, {"key": i % 4, "round": i})
        i += 1
        time.sleep(0.0005)
""")


@pytest.mark.timeout(30)
def test_a_process_killed_while_writing_leaves_a_valid_file(tmp_path):
    path = tmp_path / "worker-0.json"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 20
        seen = 0
        while seen < 50:  # wait until some flushes have happened (never a sleep-and-hope)
            assert time.monotonic() < deadline and proc.poll() is None, "the writer made no events"
            time.sleep(0.02)
            try:  # a read may meet a write half done (reads do not wait for writes)
                seen = len(spans(load(path), "push"))
            except (OSError, ValueError, AssertionError):
                pass
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert len(spans(load(path), "push")) >= seen  # whole, and everything up to the last flush


FORKED = textwrap.dedent("""
    import os, sys, time
    from pskv.timeline import Timeline
    timeline = Timeline(sys.argv[1], "worker 0", flush_interval=3600)
    now = time.monotonic()
    timeline.span("push", "key 1", now, now + 0.001, {"by": "parent"})
    pid = os.fork()
    if pid == 0:  # a data-loading child: its copy of the timeline must write nothing, not even at exit
        timeline.span("push", "key 1", now + 1, now + 2, {"by": "child"})
        timeline.close()
        sys.exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    timeline.span("pull", "key 1", now + 1, now + 2, {"by": "parent"})
""")  # the parent's timeline is written at its exit


@pytest.mark.timeout(30)
def test_a_forked_child_writes_nothing_into_its_parents_file(tmp_path):
    path = tmp_path / "worker-0.json"
    subprocess.run([sys.executable, "-c", FORKED, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)},
                   check=True, timeout=20)
    events = load(path)
    assert [(e["name"], e["args"]["by"]) for e in events if e["ph"] == "X"] == [("push", "parent"), ("pull", "parent")]


def test_a_failed_write_stops_the_timeline_with_a_warning(tmp_path, monkeypatch, caplog):
    timeline = Timeline(tmp_path / "t.json", "worker 0", flush_interval=3600)
    now = time.monotonic()
    timeline.span("push", "key 1", now, now + 0.001)

    def full(*args: Any) -> int:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "pwrite", full)
    timeline.flush()
    assert "t.json: writing failed" in caplog.text and "No space left" in caplog.text
    monkeypatch.undo()
    timeline.span("push", "key 1", now + 1, now + 2)
    timeline.close()  # nothing more is written, nothing raised
    assert spans(load(tmp_path / "t.json"), "push") == []  # the file as it was before the failed write

    short = Timeline(tmp_path / "short.json", "worker 1", flush_interval=3600)
    short.span("push", "key 1", now, now + 0.001)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 1)  # a write cut short
    short.flush()
    assert "short.json: writing failed" in caplog.text and "1 of" in caplog.text
    monkeypatch.undo()
    short.close()


def test_file_names_and_a_directory_that_cannot_be_made(tmp_path):
    assert trace_path(tmp_path, "worker", 1) == tmp_path / "worker-1.json"
    assert trace_path(tmp_path, "server", 0, restart=2) == tmp_path / "server-0.restart2.json"
    assert trace_path(tmp_path, "worker", 0, replacement=True) == tmp_path / f"worker-0.pid{os.getpid()}.json"
    assert open_timeline("", "worker", 0) is None
    (tmp_path / "file").write_text("")
    with pytest.raises(pskv.InvalidArgumentError, match=r"PSKV_TIMELINE.*file/sub/worker-0\.json"):
        open_timeline(str(tmp_path / "file" / "sub"), "worker", 0)


def test_a_file_cut_short_inside_a_write_still_gives_its_whole_events(tmp_path, caplog, capsys):
    timeline = Timeline(tmp_path / "worker-0.json", "worker 0", flush_interval=3600)
    now = time.monotonic()
    for i in range(5):
        timeline.span("push", "key 1", now + i, now + i + 0.5, {"round": i + 1})
    timeline.close()
    text = (tmp_path / "worker-0.json").read_text()
    cut = text[: text.index('"round":5')]  # the last event and the closing never made it
    (tmp_path / "worker-0.json").write_text(cut)
    events = load_timeline([tmp_path / "worker-0.json"])
    assert [e["args"]["round"] for e in events if e["ph"] == "X"] == [1, 2, 3, 4]
    caplog.clear()
    assert cli.main(["timeline", str(tmp_path / "worker-0.json"), "-o", str(tmp_path / "job.json")]) == 0
    assert len([r for r in caplog.records if "was cut short" in r.getMessage()]) == 1  # read once, warned once
    (tmp_path / "other.json").write_text('{"something": [')
    with pytest.raises(pskv.InvalidArgumentError, match="other.json is not a timeline file"):
        load_timeline([tmp_path / "other.json"])


def test_merge_puts_a_job_into_one_file(tmp_path):
    for rank in (0, 1):
        timeline = open_timeline(str(tmp_path / "t"), "worker", rank)
        assert timeline is not None
        now = time.monotonic()
        timeline.span("push", "key 1", now, now + 0.001)
        timeline.close()
    assert merge(sorted((tmp_path / "t").glob("*.json")), tmp_path / "job.json") == 2 * 5  # per file: 2 process, 2 track metadata, 1 span
    events = load(tmp_path / "job.json")
    assert len(spans(events, "push")) == 2
    (tmp_path / "bad.json").write_text("[")
    with pytest.raises(pskv.InvalidArgumentError, match="bad.json"):
        merge([tmp_path / "bad.json"], tmp_path / "x.json")


def test_pskv_timeline_sums_up_and_merges_a_directory(tmp_path, capsys):
    for role, rank in (("worker", 0), ("server", 0)):
        timeline = open_timeline(str(tmp_path / "t"), role, rank)
        assert timeline is not None
        now = time.monotonic()
        for i in range(3):
            timeline.span("push" if role == "worker" else "merge", "key 1", now + i, now + i + 0.002)
        timeline.close()
    server = open_timeline(str(tmp_path / "t"), "server", 1)  # three rounds: worker 1 came last in two
    assert server is not None
    for pushes in ({"worker 0": 0, "worker 1": 1500}, {"worker 1": 0, "worker 0": 500}, {"worker 0": 0, "worker 1": 2000}):
        now = time.monotonic()
        server.span("merge", "key 2", now, now + 0.003, {"key": 2, "pushes": pushes})
    server.close()
    assert cli.main(["timeline", str(tmp_path / "t"), "-o", str(tmp_path / "job.json")]) == 0
    assert "worker 1 came last in 2 of 3 rounds (67%), 3.500 ms after" in capsys.readouterr().out
    assert cli.main(["timeline", str(tmp_path / "t"), "-o", str(tmp_path / "job.json")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"server 0\s+merge\s+3\s+6\.000", out) and "worker 0 came last in 1 of 3" in out and re.search(r"worker 0\s+push\s+3\s+6\.000", out), out
    assert len(spans(load(tmp_path / "job.json"), "push")) == 3
    # merged into the directory itself: later runs take its process files only, never a merged file again
    for name in ("job.json", "again.json", None):
        assert cli.main(["timeline", str(tmp_path / "t")] + (["-o", str(tmp_path / "t" / name)] if name else [])) == 0
        again = capsys.readouterr().out
        assert re.search(r"worker 0\s+push\s+3\s+6\.000", again) and "worker 0 came last in 1 of 3" in again, again
        assert name is None or f"of 3 file(s) written to {tmp_path / 't' / name}" in again, again
    assert json.loads((tmp_path / "t" / "again.json").read_text())["otherData"] == {"pskv_merged_files": 3}
    (tmp_path / "empty").mkdir()
    assert cli.main(["timeline", str(tmp_path / "empty")]) == 2
    assert "no timeline files" in capsys.readouterr().err
    assert cli.main(["timeline", str(tmp_path / "missing.json")]) == 2
    assert "missing.json is not a timeline file" in capsys.readouterr().err


def _job(config: Any) -> int:
    kv = pskv.create("dist_sync", cluster=config)
    kv.set_optimizer(SGD(learning_rate=0.1))
    kv.init(3, np.zeros(8, np.float32))
    kv.init(4, np.zeros(8, np.float32))
    for _ in range(2):
        kv.push([3, 4], [np.ones(8, np.float32)] * 2)
        kv.pull([3, 4], out=[np.zeros(8, np.float32)] * 2)
    rank = kv.rank
    kv.close()
    return rank


def _timeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pskv-timeline"]


@pytest.mark.timeout(60)
def test_an_in_process_job_traces_every_key_and_round(tmp_path):
    with InProcessCluster(1, 2, deadline=30, timeline=str(tmp_path)) as cluster:
        cluster.run_workers(_job)
    for server in cluster.servers:
        server.stop()  # closes its timeline (the job's servers stop at its end)
    for rank in (0, 1):
        events = load(tmp_path / f"worker-{rank}.json")
        got = {(e["name"], e["args"]["key"], e["args"]["round"]) for e in spans(events, "push") + spans(events, "pull")}
        assert got == {(op, key, r) for op in ("push", "pull") for key in (3, 4) for r in (1, 2)}
        assert spans(events, "wait")
    events = load(tmp_path / "server-0.json")
    sort = [e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"]
    assert sort == [10_000]  # after the workers (0, 1) in a merged view
    for name in ("merge", "update"):
        assert {(e["args"]["key"], e["args"]["round"]) for e in spans(events, name)} == {
            (key, r) for key in (3, 4) for r in (1, 2)}
        assert all(e["args"]["workers"] == 2 for e in spans(events, name))
    for e in spans(events, "merge"):  # when each worker's push joined the round, and who came last
        pushes = e["args"]["pushes"]
        assert sorted(pushes) == ["worker 0", "worker 1"] and min(pushes.values()) == 0
        assert e["args"]["last"] == max(pushes, key=pushes.get) and max(pushes.values()) <= e["dur"] + 2


def _rows_and_compression(config: Any) -> None:
    kv = pskv.create("dist_sync", cluster=config)
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "min_size": 500})  # not the 400-element table
    kv.init("dense", np.zeros(1000, np.float32))
    kv.init("emb", pskv.TableInit((100, 4), "float32", {"type": "zeros"}))
    kv.push("dense", np.ones(1000, np.float32))
    kv.push("emb", pskv.RowSparse(np.array([1, 70]), np.ones((2, 4), np.float32), (100, 4)))
    kv.row_sparse_pull("emb", row_ids=np.array([1, 2, 70]))
    kv.pull("dense")
    kv.close()


@pytest.mark.timeout(60)
def test_row_sparse_keys_and_compression_are_traced(tmp_path):
    with InProcessCluster(2, 2, deadline=30, timeline=str(tmp_path), shm=0) as cluster:
        cluster.run_workers(_rows_and_compression)
    for server in cluster.servers:
        server.stop()
    for rank in (0, 1):
        events = load(tmp_path / f"worker-{rank}.json")
        assert {(e["name"], e["args"]["key"]) for e in spans(events, "push") + spans(events, "pull")} == {
            (op, key) for op in ("push", "pull") for key in ("dense", "emb")}
        rows = [e for e in spans(events, "push") if e["args"]["key"] == "emb"]
        assert rows[0]["args"]["bytes"] == 2 * 8 + 2 * 4 * 4  # ids and rows
        assert spans(events, "compress")
    merged = [e for rank in (0, 1) for e in spans(load(tmp_path / f"server-{rank}.json"), "merge")]
    assert {e["args"]["key"] for e in merged} == {"dense", "emb"}  # str keys by name


@pytest.mark.timeout(60)
def test_off_no_file_no_thread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def called(*args: Any) -> None:
        raise AssertionError("a span was recorded with the timeline off")
    for name in ("watch", "waited", "compressed"):
        monkeypatch.setattr(worker_spans, name, called)
    monkeypatch.setattr(Timeline, "span", called)
    before = len(_timeline_threads())
    with InProcessCluster(1, 2, deadline=30) as cluster:
        cluster.run_workers(_job)
        assert len(_timeline_threads()) == before
        assert all(server._core.observer.timeline is None for server in cluster.servers)
    assert list(tmp_path.rglob("*")) == []
