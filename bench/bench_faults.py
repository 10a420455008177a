#!/usr/bin/env python
"""Fault injection into real pskv jobs on 127.0.0.1: what the survivors see, how fast, and what is lost.

Every fault is injected into a job of real processes (``python -m pskv scheduler
--port-file F`` on a free port, ``python -m pskv server``, and this file run as the
worker script, or the same job under ``pskv launch``). Every child is reaped, whatever
happens, and every wait has a hard deadline: a fault that makes something hang shows up
as a HANG in the table, never as a hung benchmark.

    python bench/bench_faults.py                    # all faults, 3 runs each: ~3 min on 2 cores
    python bench/bench_faults.py --pskv-commit HEAD # pskv/ as committed, not the working tree
    python bench/bench_faults.py --only kill_server,fuzz --repeats 1
    python bench/bench_faults.py --only replace_worker,replace_server --json bench/results/faults_replacement.json

Rows (see docs/reliability.md for the discussion):

* kill_server / kill_worker / kill_scheduler: SIGKILL one node of a hand-started job
  (scheduler, 2 servers, 2 workers pushing and pulling 4 keys, two of them split over
  both servers), with the default heartbeat (1 s / 10 s) and a short one (0.5 s / 2 s); the survivors must raise ``NodeFailedError`` naming it. One more run
  of each under ``pskv launch`` gives the launcher's exit code and root-cause line.
* restart: SIGKILL server 0 under ``pskv launch --checkpoint-dir D --max-restarts 1``
  while the workers checkpoint every 4 steps; the final values must equal a crash-free
  run's bit for bit.
* replace_worker: SIGKILL worker 1 under ``pskv launch --restart-workers 1 --recovery-timeout 30``
  while it waits before pushing step 6 (it wrote the step to a file; its replacement, with
  ``kv.is_recovery``, goes on from there); replace_server: SIGKILL server 0 under ``pskv launch
  --restart-servers 1 --checkpoint-dir D --recovery-timeout 30`` after worker 0's step 5 (workers
  checkpoint every 4 steps and send the replacement their pushes since). Both: the time from the
  kill to the launcher's restart line, the replacement's first line, the scheduler's "rejoined"
  line and the first step completed after the kill; the launcher's lines; the final values must
  equal a crash-free run with the same options bit for bit.
* stop_worker: SIGSTOP worker 1 (it hangs without dying): the servers' stall report
  (``PSKV_STALL_REPORT`` 2 s, or 0.5 s with the short heartbeat) names it, then the
  heartbeat timeout ends the job; SIGCONT afterwards shows what the resumed worker sees.
* uneven: worker 0 has 3 batches, worker 1 has 5: without a mechanism worker 1 blocks
  (stall report, then ``OperationTimeoutError`` with ``PSKV_REQUEST_TIMEOUT=5``); with
  ``kv.join()`` or ``Trainer.fit(uneven=True)`` every epoch completes.
* fuzz: malformed messages (random bytes, truncated frames, bad dtype codes, shapes that
  do not match the data, huge declared sizes, bad fields, requests for keys the job does
  not use) sent to a live server from a plain ZeroMQ socket; the workers' results must
  stay exact; also how long one 14 MB header holds the server up. forged: one
  well-formed message claiming worker 0's id per run (a PUSH of the job's key with a
  wrong dtype or shape, a data-less PUSH naming the key in its shared-memory list, a
  JOIN): pskv does not authenticate peers without CURVE.

Acknowledged updates: the training workers use ``SGD(learning_rate=1)`` on the servers
and push ``-v``, so every completed round adds the sum of the pushes exactly (small
integers in float32); each worker checks every pulled value against the sum of all
rounds it saw acknowledged so far. "lost" counts rounds whose pulled values differ.

Output: a markdown table on stdout (progress on stderr) and ``bench/results/faults.json``.
The repeats of a row run at the same time as independent jobs (``--parallel``, default
3): most of a fault run is waiting for a heartbeat timeout, and the workers are paced
(50 steps/s) so the machine stays mostly idle. ``--parallel 1`` runs them one by one.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import functools
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# the directory whose pskv/ is measured: this checkout, or an export of --pskv-commit (passed to
# every child process in PSKV_BENCH_SOURCE and first on its PYTHONPATH)
SOURCE = Path(os.environ.get("PSKV_BENCH_SOURCE") or REPO)
if str(SOURCE) not in sys.path:
    sys.path.insert(0, str(SOURCE))
THIS = Path(__file__).resolve()
EVENT = "@@ "  # worker event lines: "@@ {json}"

DEFAULT_HB = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}
SHORT_HB = {"PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "2"}
# the training workers' keys: int keys are used as they are; with the big-array bound at
# 1000 the last two are split over every server, so each server holds part of the model
KEYS = [100, 101, 102, 103]
SIZES = [16, 256, 1000, 4096]
# the stall report must come before the heartbeat timeout: it is checked every min(limit, 5) s
STOP_DEFAULT = {**DEFAULT_HB, "PSKV_STALL_REPORT": "2"}
STOP_SHORT = {**SHORT_HB, "PSKV_STALL_REPORT": "0.5"}
EXTRA_STEPS = 60  # fuzz runs: steps every worker makes after the last hostile message (at least)
COMMON_ENV = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000", "PSKV_STARTUP_TIMEOUT": "60", "PSKV_STALL_REPORT": "2"}
CONTRACT_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
                 "DMLC_NODE_HOST", "DMLC_WORKER_ID", "PSKV_LOCAL_RANK", "PSKV_SERVER_RANK", "PSKV_RESUME_FROM",
                 "PSKV_RESTART_COUNT", "PSKV_CHECKPOINT_DIR", "PSKV_JOB_ID", "DMLC_INTERFACE")


# ===========================================================================================
# worker side: `python bench/bench_faults.py _worker SPEC.json`
# ===========================================================================================
def emit(ev: str, **fields: Any) -> None:
    """One event line on stdout: ``@@ {"ev": ..., "t": time.monotonic(), ...}``.

    On Linux ``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process of the
    machine, so the driver subtracts its own injection time from a worker's ``t``.
    """
    sys.stdout.write(EVENT + json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def _close(kv: Any) -> None:
    start = time.monotonic()
    try:
        kv.close()
        emit("closed", seconds=round(time.monotonic() - start, 3))
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        emit("close_error", type=type(exc).__name__, msg=str(exc)[:300], seconds=round(time.monotonic() - start, 3))


def _error_event(exc: BaseException, **fields: Any) -> None:
    import pskv

    emit("error", type=type(exc).__name__, typed=isinstance(exc, pskv.KVStoreError),
         node=getattr(exc, "node", None), msg=str(exc)[:400], **fields)


def worker_train(spec: dict[str, Any]) -> int:
    """Push/pull the 4 keys until an error, ``max_steps``, or the step number written into ``stop_file``."""
    import numpy as np

    import pskv
    from pskv.optimizer import SGD

    kv = pskv.create("dist_sync")
    rank, nw = kv.rank, kv.num_workers
    kv.set_optimizer(SGD(learning_rate=1.0))  # w -= 1 * g: a push of -v adds v, exactly
    w0 = [np.full(n, float(i + 1), np.float32) for i, n in enumerate(SIZES)]
    kv.init(KEYS, w0)
    expected = [a.copy() for a in w0]
    outs = [np.empty_like(a) for a in w0]
    stop_file = spec.get("stop_file")
    max_steps, pace = int(spec.get("max_steps", 10**6)), float(spec.get("pace", 0.02))
    step = mismatches = 0
    stop_at: int | None = None
    try:
        while step < max_steps:
            c = float(1 + step % 5)
            kv.push(KEYS, [np.full(n, -(rank + 1) * c, np.float32) for n in SIZES])
            kv.pull(KEYS, out=outs)  # waits for the round this worker's push joined
            add = c * nw * (nw + 1) / 2  # every worker's push of this round, once
            for e in expected:
                e += add
            bad = [k for k, o, e in zip(KEYS, outs, expected) if not np.array_equal(o, e)]
            if bad:
                mismatches += 1
                if mismatches <= 3:
                    i = KEYS.index(bad[0])
                    emit("mismatch", step=step, keys=bad, got=float(outs[i][0]), want=float(expected[i][0]))
                expected = [o.copy() for o in outs]  # count later rounds on their own
            step += 1
            if step == 3:
                emit("ready", rank=rank, pskv=os.path.dirname(pskv.__file__))
            if step % 10 == 0:
                emit("step", rank=rank, step=step)
            if stop_file and stop_at is None and os.path.exists(stop_file):
                text = Path(stop_file).read_text(encoding="ascii").strip()
                stop_at = int(text) if text else None  # the same step for every worker: rounds stay paired
            if stop_at is not None and step >= stop_at:
                break
            time.sleep(pace)
    except Exception as exc:  # noqa: BLE001 - reported with its type: typed or not
        _error_event(exc, rank=rank, steps=step, mismatches=mismatches)
        _close(kv)
        return 1
    emit("done", rank=rank, steps=step, mismatches=mismatches)
    _close(kv)
    return 0


def worker_restart(spec: dict[str, Any]) -> int:
    """Deterministic training with SGD + momentum on the servers, a checkpoint every ``every`` steps (0: none).

    ``pause`` (``{"rank", "step", "marker", "max_s"}``): that rank writes ``step`` to the marker
    file before pushing it and waits up to ``max_s`` s to be killed, so the kill falls on a step
    boundary that the replacement (``kv.is_recovery``) reads back: it goes on from there.
    """
    import numpy as np

    import pskv
    from pskv.optimizer import SGD

    steps, every, pace = int(spec["steps"]), int(spec["every"]), float(spec["pace"])
    pause = spec.get("pause")
    kv = pskv.create("dist_sync")
    rank = kv.rank
    recovery = bool(getattr(kv, "is_recovery", False))
    kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=0.01))  # keeps restored state
    names = ["w", "b"]
    kv.init(names, [np.linspace(-1, 1, 4096, dtype=np.float32), np.linspace(0, 1, 64, dtype=np.float32)])
    start = 0
    if recovery:  # a replacement of a killed worker: go on from the step it had not pushed
        start = int(Path(pause["marker"]).read_text(encoding="ascii")) if pause else 0
        print(f"rejoined at step {start}", flush=True)
        emit("rejoined", rank=rank, step=start)
    elif kv.resumed is not None:
        start = int(kv.resumed["meta"]["step"]) + 1
        print(f"resumed at step {start}", flush=True)
        emit("resumed", rank=rank, step=start)
    outs: list[Any] = []
    for step in range(start, steps):
        if pause and not recovery and rank == int(pause["rank"]) and step == int(pause["step"]):
            Path(pause["marker"]).write_text(str(step), encoding="ascii")
            emit("paused", rank=rank, step=step)  # the driver SIGKILLs this process now
            time.sleep(float(pause.get("max_s", 60)))  # bounded: not killed, it simply goes on
        grads = [np.sin(np.arange(4096, dtype=np.float32) * (step + 1) + rank),
                 np.cos(np.arange(64, dtype=np.float32) * (step + 1) + rank)]
        kv.push(names, grads)
        outs = kv.pull(names)
        emit("step", rank=rank, step=step)
        if every and step % every == every - 1:
            kv.save_checkpoint(meta={"step": step})
        time.sleep(pace)
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest()
    emit("final", rank=rank, sha=digest, sum=float(sum(o.astype(np.float64).sum() for o in outs)))
    kv.close()
    return 0


def _uneven_expected(batches: Sequence[int], epoch: int, batch: int) -> float:
    """The key's value after round ``batch`` of ``epoch`` when worker r pushes (r+1)*(b+1) at batch b."""
    per_epoch = sum((r + 1) * (b + 1) for r, n in enumerate(batches) for b in range(n))
    upto = sum((r + 1) * (b + 1) for r, n in enumerate(batches) for b in range(min(n, batch + 1)))
    return float(epoch * per_epoch + upto)


def worker_uneven(spec: dict[str, Any]) -> int:
    """Worker 0 has 3 batches, worker 1 has 5; ``join``: kv.join() after every epoch."""
    import numpy as np

    import pskv
    from pskv.optimizer import SGD

    join, epochs, batches = bool(spec["join"]), int(spec["epochs"]), [3, 5]
    kv = pskv.create("dist_sync")
    rank = kv.rank
    kv.set_optimizer(SGD(learning_rate=1.0))
    kv.init(200, np.zeros(8, np.float32))
    mismatches = 0
    out = np.empty(8, np.float32)
    try:
        for epoch in range(epochs):
            for b in range(batches[rank]):
                started = time.monotonic()
                try:
                    kv.pushpull(200, np.full(8, -(rank + 1) * (b + 1), np.float32), out=out)
                except Exception as exc:  # noqa: BLE001
                    _error_event(exc, rank=rank, epoch=epoch, batch=b, call_started=started,
                                 blocked_s=round(time.monotonic() - started, 3))
                    _close(kv)
                    return 1
                want = _uneven_expected(batches, epoch, b)
                if not np.all(out == want):
                    mismatches += 1
                emit("step", rank=rank, epoch=epoch, batch=b, value=float(out[0]), want=want)
            emit("epoch_data_done", rank=rank, epoch=epoch)
            if join:
                kv.join(timeout=30)
        final = kv.pull(200) if join else out
        want = _uneven_expected(batches, epochs - 1, max(batches) - 1)
        emit("done", rank=rank, final=float(final[0]), want=want, exact=bool(np.all(final == want)),
             mismatches=mismatches)
    except Exception as exc:  # noqa: BLE001
        _error_event(exc, rank=rank)
        _close(kv)
        return 1
    _close(kv)
    return 0


def worker_fit(spec: dict[str, Any]) -> int:
    """Trainer.fit(uneven=True) with 3 vs 5 batches per epoch (the case of tests/parallel/test_fit.py)."""
    import numpy as np
    import torch

    import pskv
    from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 128)
    x = rng.normal(size=(128, 5)) + np.eye(3, 5)[y] * 2.5
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).double()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.4)
    kv = pskv.create("dist_sync")
    rank = kv.rank
    try:
        group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
        trainer = Trainer(group, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv, update_on_kvstore=True)
        lo, hi = (0, 48) if rank == 0 else (48, 128)
        data = NDArrayIter(x[lo:hi], y[lo:hi], batch_size=16)
        steps: list[Any] = []
        history = trainer.fit(data, num_epoch=int(spec["epochs"]), progress=False, uneven=True,
                              batch_end_callback=lambda s: steps.append((s["epoch"], s["step"])))
        trainer.close()
        params = group.get_params()[0]
        digest = hashlib.sha256(b"".join(params[k].detach().cpu().numpy().tobytes() for k in sorted(params)))
        emit("done", rank=rank, epochs=[h["epoch"] for h in history], steps=len(steps), sha=digest.hexdigest())
    except Exception as exc:  # noqa: BLE001
        _error_event(exc, rank=rank)
        _close(kv)
        return 1
    _close(kv)
    return 0


WORKERS: dict[str, Callable[[dict[str, Any]], int]] = {
    "train": worker_train, "restart": worker_restart, "uneven": worker_uneven, "fit": worker_fit}


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    return WORKERS[spec["mode"]](spec)


# ===========================================================================================
# driver side: processes with timestamped output, always reaped
# ===========================================================================================
_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


def log(msg: str) -> None:
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


def _send(pid: int, sig: signal.Signals) -> float:
    """Send ``sig`` to ``pid``; returns the monotonic time of the injection."""
    t = time.monotonic()
    os.kill(pid, sig)
    return t


def base_env(job_id: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS and not k.startswith("PS_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(SOURCE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "PSKV_BENCH_SOURCE": str(SOURCE),
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
            self.procs[f"worker {w}"] = Proc(f"worker {w}", [sys.executable, str(THIS), "_worker", str(spec_path)],
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
        args += ["--", sys.executable, str(THIS), "_worker", str(spec_path)]
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
def _reap_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for item in live:
        try:
            item.reap()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# ===========================================================================================
# the faults
# ===========================================================================================
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
        t0 = _send(job.procs[victim].pid, sig)
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
            tc = _send(job.procs[victim].pid, signal.SIGCONT)
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
        t0 = _send(pid, sig)
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


RESTART_SPEC = {"mode": "restart", "steps": 16, "every": 4, "pace": 0.15}


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
            t0 = _send(launch.child("server", 0), signal.SIGKILL)
            steps_before = {w: max([e["step"] for e in p.events(f"[worker {w}]") if e["ev"] == "step"], default=-1)
                            for w in (0, 1)}
            root = p.find(lambda s: s.startswith("pskv launch: "), 30)
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


REPLACE_WORKER_STEP = 6  # worker 1 is killed before pushing this step (16 steps, no checkpoints)
REPLACE_SERVER_STEP = 5  # server 0 is killed after worker 0's step 5 (checkpoints after steps 3, 7, 11, 15)
RECOVERY_TIMEOUT = "30"


def _first_after(p: Proc, after: float, pred: Callable[[str], bool]) -> tuple[float, str] | None:
    """The first line received after monotonic time ``after`` for which ``pred`` holds."""
    with p.cond:
        lines = list(p.lines)
    return next(((t, line) for t, line in lines if t > after and pred(line)), None)


def trial_replace(tmp: Path, role: str, kill: bool) -> dict[str, Any]:
    """Replacement of one process in the running job: ``role`` "worker" (``--restart-workers 1``) or
    "server" (``--restart-servers 1 --checkpoint-dir``); ``kill`` False: the crash-free reference run.

    Worker: worker 1 stops before pushing step REPLACE_WORKER_STEP (it writes the step to a marker
    file first), is SIGKILLed, and its replacement goes on from that step. Server: server 0 is
    SIGKILLed after worker 0's step REPLACE_SERVER_STEP, at no particular point of a round.
    """
    ckpts = tmp / "ckpts"
    spec: dict[str, Any] = dict(RESTART_SPEC)  # the restart row's computation: the crash-free finals agree
    if role == "worker":
        spec["every"] = 0
        options = ["--restart-workers", "1", "--recovery-timeout", RECOVERY_TIMEOUT]
        if kill:
            spec["pause"] = {"rank": 1, "step": REPLACE_WORKER_STEP, "marker": str(tmp / "worker1-step"), "max_s": 60}
    else:
        options = ["--restart-servers", "1", "--checkpoint-dir", str(ckpts), "--recovery-timeout", RECOVERY_TIMEOUT]
    launch = Launch(tmp, 2, 2, spec, DEFAULT_HB, options)
    victim = "worker 1" if role == "worker" else "server 0"
    result: dict[str, Any] = {"role": role, "kill": kill, "options": options}
    try:
        p = launch.proc
        if kill:
            if role == "worker":
                ready = p.wait_event("paused", 90, "[worker 1]")
            else:
                ready = p.wait_event("step", 90, "[worker 0]", lambda e: e["step"] >= REPLACE_SERVER_STEP)
            if ready is None:
                raise RuntimeError("no training progress: " + " | ".join(p.text()[-6:]))
            t0 = _send(launch.child(role, 1 if role == "worker" else 0), signal.SIGKILL)
            before = {w: max([e["step"] for e in p.events(f"[worker {w}]") if e["ev"] == "step" and e["t"] < t0],
                             default=-1) for w in (0, 1)}
            result["steps_done_before_kill"] = before
            last = max(before.values())
            # progress: a step beyond every step finished before the kill; it needs the replacement
            progress = p.wait_event("step", 90, None, lambda e: e["t"] > t0 and e["step"] > last)
            restart = p.find(lambda s: s.startswith("pskv launch: ") and "starting it again" in s, 5)
            result["launcher_noticed_s"] = round(restart[0] - t0, 3) if restart else None
            result["restart_line"] = restart[1] if restart else None
            first = _first_after(p, restart[0] if restart else t0, lambda s: s.startswith(f"[{victim}]"))
            result["replacement_first_line_s"] = round(first[0] - t0, 3) if first else None
            result["replacement_first_line"] = first[1][:200] if first else None
            rejoined = _first_after(p, t0, lambda s: f"{victim} rejoined" in s)
            result["scheduler_rejoined_s"] = round(rejoined[0] - t0, 3) if rejoined else None
            result["progress_s"] = round(progress["t"] - t0, 3) if progress else None
            result["progress_step"] = {"step": progress["step"], "src": progress["src"]} if progress else None
            if role == "worker":
                ev = p.wait_event("rejoined", 5, "[worker 1]")
                result["rejoined_at_step"] = ev["step"] if ev else None
                result["rejoined_s"] = round(ev["t"] - t0, 3) if ev else None
            else:
                restored = _first_after(p, t0, lambda s: "server 0: restored" in s)
                result["restored_line"] = _strip_log(restored[1]) if restored else None
                with p.cond:
                    replays = [(t, line) for t, line in p.lines if t > t0 and "server 0 replaced: sending it" in line]
                result["replay_lines"] = [_strip_log(line) for _, line in replays]
                result["replay_s"] = round(replays[0][0] - t0, 3) if replays else None
                result["pushes_replayed"] = [int(m.group(1)) for _, line in replays
                                             if (m := re.search(r"sending it (\d+) push", line))]
        rc = p.wait(120)
        result["exit_code"] = rc
        result["launcher_lines"] = launch.launcher_lines()
        result["finals"] = {e["rank"]: e["sha"] for e in p.events() if e["ev"] == "final"}
        result["checkpoints"] = sorted(d.name for d in ckpts.iterdir()) if ckpts.exists() else []
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


# -- hostile messages --------------------------------------------------------------------------
def _pack(fields: list[Any]) -> bytes:
    import msgpack

    return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]


def hostile_messages(rng: random.Random, n: int) -> list[tuple[str, list[bytes]]]:
    """``n`` malformed or unwelcome messages, a mix of kinds; keys 0..40 are not the job's."""
    from pskv.protocol import Command
    from pskv.protocol.messages import PROTOCOL_VERSION

    v = PROTOCOL_VERSION
    push, pull, init, pushpull = int(Command.PUSH), int(Command.PULL), int(Command.INIT), int(Command.PUSHPULL)
    f32 = 2  # float32's code in the allow-list (checked below)
    bodies = ["", "{}", '{"overwrite": true}', '{"parts": [[1, 0, 0]]}', '{"parts": "x"}', '{"shm": [[1, 0]]}',
              "not json", '{"rounds": [1e308]}', "[" * 1000]

    def valid(cmd: int, key: int, count: int, sender: int, body: str = "") -> list[bytes]:
        data = b"\0" * (4 * count)
        return [_pack([v, cmd, rng.randrange(2**31), sender, 0, body, [[key, f32, [count], 0, 0]]]), data]

    out: list[tuple[str, list[bytes]]] = []
    kinds = ["random bytes", "truncated frames", "bad dtype", "shape vs data mismatch", "huge declared size",
             "bad fields", "unused keys / odd senders / bad bodies"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "random bytes":
            frames = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 4))]
        elif kind == "truncated frames":
            frames = valid(push, rng.randint(0, 40), rng.randint(1, 16), 9)
            j = rng.randrange(2)
            frames[j] = frames[j][: rng.randrange(max(1, len(frames[j])))]
        elif kind == "bad dtype":
            code = rng.choice([-1, 6, 7, 99, 2**40, "float32", None, 2.5])
            frames = [_pack([v, push, 1, 9, 0, "", [[rng.randint(0, 40), code, [4], 0, 0]]]), b"\0" * 16]
        elif kind == "shape vs data mismatch":
            count = rng.randint(1, 64)
            frames = [_pack([v, rng.choice([push, init, pushpull]), 1, rng.choice([9, 11]), 0, "",
                             [[rng.randint(0, 40), f32, [count, rng.randint(2, 5)], 0, 0]]]),
                      b"\0" * (4 * count + rng.choice([-4, -1, 1, 3]) if count > 1 else 3)]
        elif kind == "huge declared size":
            choice = rng.randrange(5)
            if choice == 0:
                frames = [_pack([v, push, 1, 9, 0, "", [[5, f32, [2**40], 0, 0]]]), b"\0" * 8]
            elif choice == 1:
                frames = [_pack([v, init, 1, 9, 0, "", [[5, f32, [2**31, 2**31, 2**31], 0, 0]]]), b"\0" * 8]
            elif choice == 2:
                frames = [_pack([v, push, 1, 9, 0, "", [[5, f32, [4], 0, 0]] * 200_001]), b"\0" * 16]
            elif choice == 3:
                frames = [_pack([v, push, 1, 9, 0, "", [[5, f32, [2] * 17, 0, 0]]]), b"\0" * (4 * 2**17)]
            else:
                frames = [_pack([v, push, 1, 9, 0, "x" * (1 << 20), [[5, f32, [2], 2**62, 2**62]]]), b"\0" * 8]
        elif kind == "bad fields":
            fields: list[Any] = [v, push, 1, 9, 0, "", []]
            j = rng.randrange(7)
            fields[j] = rng.choice([None, "x", -1, 2**63, 1.5, [], [1, 2], v + 1, 999])
            frames = [_pack(fields if rng.random() < 0.9 else fields[:5])]
        else:
            cmd = rng.choice([push, pull, init, pushpull, int(Command.HELLO), int(Command.ERROR)])
            frames = valid(cmd, rng.randint(0, 40), rng.randint(0, 8), rng.choice([9, 11, 13, 8, 1, -1, 2**40]),
                           rng.choice(bodies))
        out.append((kind, frames))
    return out


FORGED = {
    "dtype": "PUSH of key 100 as float64 (the key is float32)",
    "shape": "PUSH of key 100 with 3 elements too many",
    "shm": 'PUSH without data naming key 100 in its shared-memory list (body {"shm": [[100, 0]]})',
    "join": "JOIN (no data left)",
}


def forged_messages(variant: str) -> list[tuple[str, list[bytes]]]:
    """One well-formed message claiming worker 0's id (9) that acts on the job's own key 100 / its rounds."""
    from pskv.protocol import Command
    from pskv.protocol.messages import PROTOCOL_VERSION

    v, push, f64, f32, n = PROTOCOL_VERSION, int(Command.PUSH), 3, 2, SIZES[0]
    frames = {
        "dtype": [_pack([v, push, 7, 9, 0, "", [[100, f64, [n], 0, 0]]]), b"\0" * (8 * n)],
        "shape": [_pack([v, push, 8, 9, 0, "", [[100, f32, [n + 3], 0, 0]]]), b"\0" * (4 * (n + 3))],
        "shm": [_pack([v, push, 9, 9, 0, '{"shm": [[100, 0]]}', []])],
        "join": [_pack([v, int(Command.JOIN), 10, 9, 0, "", []])],
    }[variant]
    return [(FORGED[variant], frames)]


def _check_codes() -> None:
    from pskv.arrays.dtypes import SUPPORTED_DTYPES

    assert SUPPORTED_DTYPES[2] == "float32" and SUPPORTED_DTYPES[3] == "float64", SUPPORTED_DTYPES


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


@functools.lru_cache(maxsize=1)
def big_header() -> tuple[bytes, bytes]:
    """A PUSH header declaring 2,000,000 arrays (14 MB, under the 16 MB header limit)."""
    from pskv.protocol import Command
    from pskv.protocol.messages import PROTOCOL_VERSION

    return _pack([PROTOCOL_VERSION, int(Command.PUSH), 1, 9, 0, "", [[5, 2, [4], 0, 0]] * 2_000_000]), b"\0" * 16


def _probe(sock: Any, before: list[bytes]) -> float | None:
    """Seconds until the server answers a PULL of an unknown key sent right after ``before`` (if any)."""
    from pskv.protocol import Command
    from pskv.protocol.messages import PROTOCOL_VERSION

    while sock.poll(0):
        sock.recv_multipart()
    start = time.monotonic()
    if before:
        sock.send_multipart(before)
    sock.send_multipart([_pack([PROTOCOL_VERSION, int(Command.PULL), 424242, 9, 0, "", [[7, 2, [0], 0, 0]]]), b""])
    deadline = start + 30
    while time.monotonic() < deadline:
        if sock.poll(100) and _is_reply_to(sock.recv_multipart()[0], 424242):
            return round(time.monotonic() - start, 3)
    return None


def _is_reply_to(head: bytes, request: int) -> bool:
    import msgpack

    try:
        fields = msgpack.unpackb(head, raw=False)
        return bool(fields[2] == request)
    except Exception:  # noqa: BLE001
        return False


def _max_gap(events: list[dict[str, Any]], start: float, end: float) -> float | None:
    """The longest time between consecutive step events (every 10 steps) overlapping [start, end]."""
    ts = sorted(e["t"] for e in events if e["ev"] == "step")
    gaps = [b - a for a, b in zip(ts, ts[1:]) if b >= start and a <= end]
    return round(max(gaps), 3) if gaps else None


def trial_fuzz(tmp: Path, forged: str | None, count: int, seed: int) -> dict[str, Any]:
    """Hostile messages to the live server of a 1-server, 2-worker job while the workers train and check."""
    import zmq

    _check_codes()
    stop_file = tmp / "fuzz-done"
    job = Job(tmp, 1, 2, {"mode": "train", "pace": 0.02, "stop_file": str(stop_file)},
              {**DEFAULT_HB, "PSKV_REQUEST_TIMEOUT": "15"})
    result: dict[str, Any] = {"forged": forged}
    try:
        job.wait_ready(["worker 0", "worker 1"])
        line = job.procs["server 0"].find(lambda s: "serving on tcp://" in s, 10)
        if line is None:
            raise RuntimeError("no server address in its log")
        address = "tcp://" + line[1].split("serving on tcp://")[1].split()[0]
        rng = random.Random(seed)
        messages = forged_messages(forged) if forged else hostile_messages(rng, count)
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
        if not forged:  # the workers' longest pause (step events every 10 steps) while the stream was handled
            time.sleep(1.0)
            ev0 = job.procs["worker 0"].events()
            result["step_gap_before_s"] = _max_gap(ev0, start - 3, start - 0.5)
            result["step_gap_during_s"] = _max_gap(ev0, start, backlog_done)
        result["kinds"] = sorted({k for k, _ in messages})
        result["replies"] = replies
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
    finally:
        job.reap()
    return result


# ===========================================================================================
# plan, run, report
# ===========================================================================================
class Trial:
    def __init__(self, row: str, label: str, fn: Callable[[Path], dict[str, Any]], weight: float) -> None:
        self.row, self.label, self.fn, self.weight = row, label, fn, weight


ROWS = ["kill_server", "kill_server_short", "kill_worker", "kill_worker_short", "kill_scheduler",
        "kill_scheduler_short", "restart", "replace_worker", "replace_server", "stop_worker", "stop_worker_short",
        "uneven_none", "uneven_join", "uneven_fit", "fuzz", "forged"]
GROUPS = {"kill_server": ["kill_server", "kill_server_short"], "kill_worker": ["kill_worker", "kill_worker_short"],
          "kill_scheduler": ["kill_scheduler", "kill_scheduler_short"], "restart": ["restart"],
          "replace_worker": ["replace_worker"], "replace_server": ["replace_server"],
          "stop_worker": ["stop_worker", "stop_worker_short"], "uneven": ["uneven_none", "uneven_join", "uneven_fit"],
          "fuzz": ["fuzz"], "forged": ["forged"]}


def plan(rows: list[str], repeats: int, fuzz_count: int) -> list[Trial]:
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


# -- summaries -------------------------------------------------------------------------------
def stat(values: list[float]) -> dict[str, Any] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2),
            "n": len(vals), "samples": vals}


def fmt_stat(s: dict[str, Any] | None, of: int, digits: int = 1) -> str:
    if s is None:
        return "none"
    text = f"{s['median']:.{digits}f} s ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
    return text + (f", {s['n']} of {of} runs" if s["n"] != of else "")


def _err_summary(errs: list[dict[str, Any] | None], expect_node: str) -> str:
    got = [e for e in errs if e]
    if not got:
        return "no error"
    kinds = sorted({f"{e['type']}" + ("" if e.get("typed") else " (UNTYPED)") for e in got})
    named = sum(1 for e in got if expect_node in (e.get("node") or "") or f"{expect_node} " in e["msg"]
                or f"{expect_node} failed" in e["msg"])
    sample = got[0]["msg"].split("\n")[0][:110]
    return f"{'/'.join(kinds)} naming {expect_node} in {named}/{len(got)} (`{sample}`)"


def _exit_codes(rs: list[dict[str, Any]], names: list[str]) -> str:
    parts = []
    for n in names:
        codes = sorted({r["exit_codes"].get(n) for r in rs if "exit_codes" in r}, key=str)
        parts.append(f"{n} exit {'/'.join('hung' if c is None else str(c) for c in codes)}")
    return ", ".join(parts)


def summarize(results: list[dict[str, Any]], repeats: int) -> tuple[list[dict[str, Any]], list[str]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["label"].split("#")[0], []).append(r)
    rows: list[dict[str, Any]] = []
    defects: list[str] = []

    def hb_text(short: bool) -> str:
        hb = SHORT_HB if short else DEFAULT_HB
        return f"heartbeat {hb['PS_HEARTBEAT_INTERVAL']} s / timeout {hb['PS_HEARTBEAT_TIMEOUT']} s"

    for base, victim in (("kill_server", "server 1"), ("kill_worker", "worker 1"), ("kill_scheduler", "scheduler")):
        for short in (False, True):
            row = base + ("_short" if short else "")
            rs = [r for r in by.get(row, []) if r["ok"]]
            failed = [r for r in by.get(row, []) if not r["ok"]]
            if not rs and not failed:
                continue
            survivors = [n for n in ("scheduler", "server 0", "server 1", "worker 0", "worker 1") if n != victim]
            werrs = [r["survivors"][w].get("error") for r in rs for w in survivors if w.startswith("worker")]
            outcome = [f"surviving workers: {_err_summary(werrs, victim)}"]
            others = [n for n in survivors if not n.startswith("worker")]
            for n in others:
                lines = [r["survivors"][n].get("line") for r in rs]
                seen = next((x for x in lines if x), None)
                outcome.append(f"{n}: " + (f"logs `{_strip_log(seen)}`" if seen else "no log line naming it"))
            outcome.append(_exit_codes(rs, survivors))
            lv = by.get(row + ":launch", [])
            if lv and lv[0]["ok"]:
                outcome.append(f"under `pskv launch`: exit {lv[0]['exit_code']}, `{lv[0]['root_cause']}`")
            hangs = [h for r in rs for h in r.get("hang", [])]
            lost = sum(r["survivors"][w].get("mismatches", 0) for r in rs for w in survivors if w.startswith("worker"))
            checked = sum(r["survivors"][w].get("rounds_checked", 0) for r in rs for w in survivors
                          if w.startswith("worker"))
            notes = []
            if hangs:
                notes.append(f"HANG: {', '.join(hangs)} got no error within 2x timeout + 20 s")
                defects.append(f"{row}: survivors hung: {hangs}")
            if failed:
                notes.append(f"{len(failed)} run(s) failed to run: {failed[0]['failure'][:150]}")
            if any(e and not e.get("typed") for e in werrs):
                defects.append(f"{row}: an untyped error reached a worker")
            notes.append("the bench's worker script exits 1 after printing the error")
            if base == "kill_server":
                notes.append("without replacement the dead server's shard is gone with it: see the restart and "
                             "replace_server rows")
            if base == "kill_scheduler":
                notes.append("servers stop when they lose the scheduler")
            detect = stat([r.get("detect_s") for r in rs])
            rows.append({"row": row, "fault": f"SIGKILL {victim} mid-training ({hb_text(short)})",
                         "how": "`os.kill(pid, SIGKILL)` on a hand-started job (scheduler, 2 servers, 2 workers "
                                "pushing+pulling 4 keys, 50 steps/s)",
                         "outcome": "; ".join(outcome), "detect": detect,
                         "detect_text": fmt_stat(detect, repeats),
                         "lost": lost, "lost_text": f"{lost} ({checked} rounds checked before the failure)",
                         "notes": "; ".join(notes)})

    rs = [r for r in by.get("restart", []) if r["ok"]]
    ref = (by.get("restart:reference") or [{}])[0]
    if rs or by.get("restart"):
        reference = ref.get("finals", {}) if ref.get("ok") else {}
        equal = [bool(reference) and r.get("finals") == reference and len(reference) == 2 for r in rs]
        again = stat([r.get("running_again_s") for r in rs])
        notice = stat([r.get("root_cause_after_s") for r in rs])
        replayed = sorted({r.get("rounds_replayed") for r in rs}, key=str)
        resumed = sorted({s for r in rs for s in r.get("resumed_at", [])})
        outcome = (f"launcher: `{rs[0]['root_cause'] if rs else '?'}`, then `{_short_restart(rs)}`; "
                   f"workers resumed at step {'/'.join(map(str, resumed))}, rounds replayed "
                   f"{'/'.join(map(str, replayed))}; final exit {'/'.join(str(r.get('exit_code')) for r in rs)}; "
                   f"final values bitwise equal to a crash-free run in {sum(equal)}/{len(rs)}")
        lost = len(rs) - sum(equal)
        if lost:
            defects.append("restart: final values differ from the crash-free run")
        rows.append({"row": "restart", "fault": "SIGKILL server 0 under `pskv launch --checkpoint-dir D "
                     "--max-restarts 1` (checkpoint every 4 steps, 16 steps)",
                     "how": "`os.kill(pid, SIGKILL)` on the launcher's server 0 after worker 0's step 5",
                     "outcome": outcome, "detect": again,
                     "detect_text": f"running again after {fmt_stat(again, repeats)}; launcher noticed after "
                                    f"{fmt_stat(notice, repeats)}",
                     "lost": lost, "lost_text": f"{lost} (final values == crash-free run: {sum(equal)}/{len(rs)})",
                     "notes": "a whole-job restart; the rounds after the newest checkpoint are computed again; "
                              "time includes starting 5 fresh processes"})

    for role in ("worker", "server"):
        row = f"replace_{role}"
        rs = [r for r in by.get(row, []) if r["ok"]]
        failed = [r for r in by.get(row, []) if not r["ok"]]
        if not rs and not failed:
            continue
        ref = (by.get(f"{row}:reference") or [{}])[0]
        reference = ref.get("finals", {}) if ref.get("ok") and ref.get("exit_code") == 0 else {}
        equal = [len(reference) == 2 and len(set(reference.values())) == 1 and r.get("finals") == reference
                 for r in rs]
        restart_ref = (by.get("restart:reference") or [{}])[0].get("finals")
        noticed = stat([r.get("launcher_noticed_s") for r in rs])
        first = stat([r.get("replacement_first_line_s") for r in rs])
        rejoined = stat([r.get("scheduler_rejoined_s") for r in rs])
        progress = stat([r.get("progress_s") for r in rs])
        line = next((r["restart_line"] for r in rs if r.get("restart_line")), None) or "no restart line"
        line = re.sub(r"checkpoint \S*/(ckpt-\d+)", r"checkpoint .../\1", line)
        others = sorted({ln for r in rs for ln in r.get("launcher_lines", []) if "starting it again" not in ln})
        outcome = [f"launcher: `{line}`" + (f"; other launcher lines: {'; '.join(f'`{o}`' for o in others[:3])}"
                                           if others else "; no other launcher line")]
        first_line = next((r["replacement_first_line"] for r in rs if r.get("replacement_first_line")), None)
        if first_line:
            first_line = re.sub(r"from \S*/(ckpt-\d+)", r"from .../\1", _strip_log(first_line.split("] ", 1)[-1]))
            outcome.append(f"the replacement's first line: `{first_line}`")
        if role == "worker":
            at = sorted({r.get("rejoined_at_step") for r in rs}, key=str)
            outcome.append(f"the replacement has `kv.is_recovery` and goes on at step {'/'.join(map(str, at))}; "
                           "worker 0 waited in round 6 meanwhile")
        else:
            restored = next((r.get("restored_line") for r in rs if r.get("restored_line")), None)
            restored = re.sub(r"from \S*/(ckpt-\d+)", r"from .../\1", restored) if restored else None
            replayed = sorted({tuple(sorted(r.get("pushes_replayed", []))) for r in rs})
            replay = stat([r.get("replay_s") for r in rs])
            if restored != first_line:
                outcome.append(f"replacement: `{restored}`" if restored else "replacement: no 'restored' line")
            outcome.append("pushes sent again per worker: " + " / ".join("+".join(map(str, x)) for x in replayed)
                           + f" (workers started sending them {fmt_stat(replay, repeats, 2)} after the kill)")
        outcome.append(f"exit {'/'.join(str(r.get('exit_code')) for r in rs)}; final values bitwise equal to a "
                       f"crash-free run with the same options in {sum(equal)}/{len(rs)} (SHA-256 of both keys)")
        if reference and restart_ref:
            outcome.append("the crash-free run's values equal the restart row's: "
                           + ("yes" if reference == restart_ref else "NO"))
        lost = len(rs) - sum(equal)
        if lost or not reference:
            defects.append(f"{row}: final values differ from the crash-free run in {lost}/{len(rs)}"
                           + ("" if reference else " (no crash-free reference)"))
        notes = ["one process restarted; the others keep running",
                 "killed on a step boundary the replacement reads back (as in tests/fault/test_worker_recovery.py)"
                 if role == "worker" else "pushes since the newest checkpoint are kept by the workers and sent "
                                         "again; no shared memory with --restart-servers"]
        if failed:
            notes.append(f"{len(failed)} run(s) failed to run: {failed[0]['failure'][:150]}")
        fault = (f"SIGKILL worker 1 under `pskv launch --restart-workers 1 --recovery-timeout {RECOVERY_TIMEOUT}` "
                 "(16 steps, SGD + momentum, no checkpoints)" if role == "worker" else
                 f"SIGKILL server 0 under `pskv launch --restart-servers 1 --checkpoint-dir D --recovery-timeout "
                 f"{RECOVERY_TIMEOUT}` (checkpoint every 4 of 16 steps, SGD + momentum)")
        how = ("`os.kill(pid, SIGKILL)` on the launcher's worker 1 while it waits before pushing step "
               f"{REPLACE_WORKER_STEP} (it wrote the step to a file, which its replacement reads)"
               if role == "worker" else
               f"`os.kill(pid, SIGKILL)` on the launcher's server 0 right after worker 0's step {REPLACE_SERVER_STEP}")
        rows.append({"row": row, "fault": fault, "how": how, "outcome": "; ".join(outcome),
                     "detect": {"launcher": noticed, "first_line": first, "rejoined": rejoined, "progress": progress},
                     "detect_text": f"launcher started it again after {fmt_stat(noticed, repeats, 2)}; "
                                    f"replacement's first line {fmt_stat(first, repeats, 2)}; scheduler logs it "
                                    f"rejoined {fmt_stat(rejoined, repeats, 2)}; **first step completed after the "
                                    f"kill {fmt_stat(progress, repeats, 2)}**",
                     "lost": lost, "lost_text": f"{lost} (final values == crash-free run: {sum(equal)}/{len(rs)})",
                     "notes": "; ".join(notes)})

    for short in (False, True):
        row = "stop_worker" + ("_short" if short else "")
        rs = [r for r in by.get(row, []) if r["ok"]]
        if not rs and not by.get(row):
            continue
        stall = stat([r.get("stall_s") for r in rs])
        detect = stat([r.get("detect_s") for r in rs])
        werrs = [r["survivors"]["worker 0"].get("error") for r in rs]
        sl = next((r.get("stall_line") for r in rs if r.get("stall_line")), None)
        outcome = [f"server: `{_strip_log(sl)}`" if sl else "server: NO stall report",
                   f"worker 0: {_err_summary(werrs, 'worker 1')}"]
        conts = [r.get("after_cont") for r in rs]
        got = [c for c in conts if c]
        outcome.append("worker 1 after SIGCONT: " + (
            f"{got[0]['type']} after {got[0]['after_s']:.1f} s (`{got[0]['msg'][:90]}`)" if got
            else "no error within 2x timeout + 5 s (killed)") + (f" in {len(got)}/{len(conts)}" if got else ""))
        outcome.append(_exit_codes(rs, ["scheduler", "server 0", "server 1", "worker 0"]))
        lv = by.get(row + ":launch", [])
        if lv and lv[0]["ok"]:
            outcome.append(f"under `pskv launch`: exit {lv[0]['exit_code']}, `{lv[0]['root_cause']}`")
        hangs = [h for r in rs for h in r.get("hang", [])]
        lost = sum(r["survivors"]["worker 0"].get("mismatches", 0) for r in rs)
        checked = sum(r["survivors"]["worker 0"].get("rounds_checked", 0) for r in rs)
        notes = [f"PSKV_STALL_REPORT={(STOP_SHORT if short else STOP_DEFAULT)['PSKV_STALL_REPORT']} s"]
        if hangs:
            notes.append(f"HANG: {hangs}")
            defects.append(f"{row}: survivors hung: {hangs}")
        if lv and lv[0]["ok"] and lv[0]["root_cause"] and "worker 1" not in lv[0]["root_cause"]:
            notes.append("the launcher names a survivor as root cause: a hung process never exits, so it "
                         "cannot be the first failure it sees")
        rows.append({"row": row, "fault": f"worker 1 hangs (SIGSTOP) mid-training ({hb_text(short)})",
                     "how": "`os.kill(pid, SIGSTOP)`; SIGCONT after the survivors' error, SIGKILL if still there",
                     "outcome": "; ".join(outcome), "detect": {"stall": stall, "error": detect},
                     "detect_text": f"stall report {fmt_stat(stall, repeats)}; NodeFailedError {fmt_stat(detect, repeats)}",
                     "lost": lost, "lost_text": f"{lost} ({checked} rounds checked)", "notes": "; ".join(notes)})

    rs = [r for r in by.get("uneven_none", []) if r["ok"]]
    if rs or by.get("uneven_none"):
        stall = stat([r.get("stall_s") for r in rs])
        err = stat([r.get("error_s") for r in rs])
        e1 = [r["worker 1"]["error"] for r in rs]
        sl = next((r.get("stall_line") for r in rs if r.get("stall_line")), None)
        w0 = rs[0]["worker 0"] if rs else {}
        outcome = (f"worker 1's 4th pushpull blocks; server: `{_strip_log(sl)}`; worker 1: "
                   f"{_err_summary(e1, 'server 0')}; worker 0 (out of data, in close()): "
                   f"{_close_text(w0.get('close'))}; " + _exit_codes(rs, ["worker 0", "worker 1", "server 0", "scheduler"]))
        hangs = [h for r in rs for h in r.get("hang", [])]
        if hangs:
            defects.append(f"uneven_none: hung {hangs}")
        lost = sum(r[w].get("mismatches", 0) for r in rs for w in ("worker 0", "worker 1"))
        rows.append({"row": "uneven_none", "fault": "uneven data, no mechanism (worker 0: 3 batches, worker 1: 5)",
                     "how": "each worker pushpulls its own batches, then close(); PSKV_REQUEST_TIMEOUT=5, "
                            "PSKV_STALL_REPORT=2",
                     "outcome": outcome, "detect": {"stall": stall, "error": err},
                     "detect_text": f"stall report {fmt_stat(stall, repeats)}; OperationTimeoutError "
                                    f"{fmt_stat(err, repeats)} after the call started",
                     "lost": lost, "lost_text": f"{lost} (rounds 0-2 exact; round 3 never completes)",
                     "notes": "a timeout, not a hang; without PSKV_REQUEST_TIMEOUT the wait is 300 s"})
    for variant in ("join", "fit"):
        row = f"uneven_{variant}"
        rs = [r for r in by.get(row, []) if r["ok"]]
        if not rs and not by.get(row):
            continue
        dones = [r[w]["done"] for r in rs for w in ("worker 0", "worker 1")]
        completed = sum(1 for d in dones if d)
        errors = [r[w]["error"] for r in rs for w in ("worker 0", "worker 1") if r[w]["error"]]
        if variant == "join":
            exact = sum(1 for d in dones if d and d.get("exact") and d.get("mismatches") == 0)
            lost = len(dones) - exact
            detail = (f"every epoch completes on both workers ({completed}/{len(dones)} workers done); every "
                      f"pushpull and the final value equal the sum of all pushes ({exact}/{len(dones)})")
            lost_text = f"{lost} (checked every round and the final value)"
        else:
            shas = [{d["sha"] for d in (r["worker 0"]["done"], r["worker 1"]["done"]) if d} for r in rs]
            same = sum(1 for s in shas if len(s) == 1)
            steps = sorted({d["steps"] for d in dones if d})
            detail = (f"3 epochs complete on both workers (steps per worker: {'/'.join(map(str, steps))}); "
                      f"parameters bitwise identical on both workers in {same}/{len(rs)}")
            lost = len(rs) - same
            lost_text = f"{lost} (identical parameters; every step applied on both)"
        if errors:
            detail += f"; errors: {errors[0]['type']}: {errors[0]['msg'][:100]}"
            defects.append(f"{row}: {errors[0]['type']}")
        rows.append({"row": row, "fault": "uneven data with " + ("`kv.join()` after each epoch (2 epochs)"
                                                                  if variant == "join" else "`Trainer.fit(uneven=True)`"),
                     "how": "worker 0: 3 batches per epoch, worker 1: 5",
                     "outcome": detail + "; " + _exit_codes(rs, ["worker 0", "worker 1", "server 0", "scheduler"]),
                     "detect": None, "detect_text": "n/a (completes)", "lost": lost, "lost_text": lost_text,
                     "notes": "" if variant == "join" else "1 run (PyTorch start-up)"})

    rs = [r for r in by.get("fuzz", []) if r["ok"]]
    if rs or by.get("fuzz"):
        sent = sum(r["sent"] for r in rs)
        rej = sum(r["server_rejected_logged"] for r in rs)
        err_replies = sum(r["replies"]["error"] for r in rs)
        tracebacks = sum(r["server_tracebacks"] for r in rs)
        failures: dict[str, int] = {}
        for r in rs:
            for k, v in r["server_handler_failures"].items():
                exc = k.split(" failed: ", 1)[-1].split(" at ")[0].split(" while decoding")[0]
                exc = re.sub(r"-?\d+$", "N", exc).lstrip(": ")
                failures[exc] = failures.get(exc, 0) + v
        mism = sum(r["mismatches"] for r in rs)
        checked = sum(r["rounds_checked"] for r in rs)
        werrs = [r[w]["error"] for r in rs for w in ("worker 0", "worker 1") if r[w]["error"]]
        backlog = stat([r.get("backlog_s") for r in rs])
        big = stat([r.get("probe_after_big_header_s") for r in rs])
        probe = stat([r.get("probe_s") for r in rs])
        gap_before = stat([r.get("step_gap_before_s") for r in rs])
        gap_during = stat([r.get("step_gap_during_s") for r in rs])
        send = stat([r.get("send_s") for r in rs])
        dropped = sum(r.get("server_dropped_replies", 0) for r in rs)
        outcome = (f"{sent} messages in {len(rs)} runs: {rej} rejected by the decoder and logged (no reply), "
                   f"{err_replies} answered with an error reply (+{sum(r['replies']['other'] for r in rs)} plain "
                   f"replies; {dropped} replies to the still-connected fuzzing socket dropped as 'reply to vanished "
                   f"peer'); {tracebacks} logged with a traceback as untyped "
                   "handler errors" + (" (" + "; ".join(f"{n}x {k}" for k, n in failures.items()) + ")" if failures
                                       else "")
                   + "; the server kept serving: " + _exit_codes(rs, ["server 0", "scheduler", "worker 0", "worker 1"]))
        if werrs:
            outcome += f"; workers: {werrs[0]['type']}: `{werrs[0]['msg'][:140]}`"
        if big:
            outcome += (f"; one {rs[0]['big_header_mb']} MB header (2,000,000 declared arrays, under the 16 MB limit) "
                        f"held the server for {big['median']:.1f} s (probe without it: "
                        f"{probe['median'] if probe else '?'} s)")
        if mism or werrs:
            defects.append(f"fuzz: {mism} wrong rounds, worker errors {[e['type'] for e in werrs]}")
        if tracebacks:
            defects.append("fuzz: untyped handler errors on hostile input: " + "; ".join(failures))
        rows.append({"row": "fuzz", "fault": "malformed / hostile messages to a live server",
                     "how": (f"{rs[0]['sent'] if rs else '?'} messages per run from a plain ZeroMQ DEALER to the server's "
                             "port while 2 workers train: " + ", ".join(rs[0]["kinds"]) if rs else ""),
                     "outcome": outcome, "detect": {"backlog": backlog, "big_header": big},
                     "detect_text": f"n/a (nothing fails). Stream sent in {fmt_stat(send, repeats)}; server still "
                                    f"busy with it {fmt_stat(backlog, repeats)} after the last message; workers' "
                                    f"longest pause meanwhile {fmt_stat(gap_during, repeats)} (before: "
                                    f"{fmt_stat(gap_before, repeats)})",
                     "lost": mism, "lost_text": f"{mism} ({checked} rounds checked, >= {EXTRA_STEPS} per worker after "
                                                "the last message)",
                     "notes": "messages name keys the job does not use or senders that are not its workers"})
    forged = {k.split("_", 1)[1]: v for k, v in by.items() if k.startswith("forged_")}
    if forged:
        parts, lost, checked = [], 0, 0
        for variant, runs in forged.items():
            r = runs[0]
            if not r["ok"]:
                parts.append(f"{variant}: run failed ({r['failure'][:100]})")
                continue
            werrs = [r[w]["error"] for w in ("worker 0", "worker 1") if r[w]["error"]]
            reply = "error reply" if r["replies"]["error"] else ("ok reply" if r["replies"]["other"] else "no reply")
            text = f"**{variant}** ({FORGED[variant]}): server sent an {reply}; "
            if r["mismatches"] or werrs:
                text += (f"{r['mismatches']} rounds with wrong values on the workers"
                         + (f", {werrs[0]['type']} on {werrs[0].get('src')}: `{werrs[0]['msg'][:80]}`" if werrs else ""))
                defects.append(f"forged {variant}: one forged message as worker 0 -> {r['mismatches']} wrong rounds, "
                               f"worker errors {[e['type'] for e in werrs]}")
            else:
                text += "job unaffected, every round exact"
            parts.append(text)
            lost += r["mismatches"]
            checked += r["rounds_checked"]
        rows.append({"row": "forged", "fault": "one well-formed message claiming worker 0's id (node 9), acting on "
                                               "the job's key 100 or its rounds",
                     "how": "sent mid-training from a plain ZeroMQ DEALER to the server's port; one run per message",
                     "outcome": "; ".join(parts), "detect": None, "detect_text": "n/a", "lost": lost,
                     "lost_text": f"{lost} wrong rounds ({checked} rounds checked)",
                     "notes": "no authentication without CURVE (docs/security.md): a peer that reaches the port is "
                              "trusted; with `--secure` / `--curve-key` it cannot connect"})
    return rows, defects


def _strip_log(line: str | None) -> str:
    """A log line without the time stamp and logger prefix."""
    if not line:
        return ""
    for marker in ("pskv.scheduler: ", "pskv.server: ", "pskv.membership: ", "pskv.cluster.membership: ",
                   "pskv.kvstore.dist: "):
        if marker in line:
            return line.split(marker, 1)[1][:160]
    return line[-160:]


def _short_restart(rs: list[dict[str, Any]]) -> str:
    line = next((r.get("restart_line") for r in rs if r.get("restart_line")), "") or ""
    return line.split(" from checkpoint ")[0] + (" from checkpoint .../ckpt-1" if "ckpt-1" in line else "")


def _close_text(ev: dict[str, Any] | None) -> str:
    if not ev:
        return "no close event"
    if ev["ev"] == "closed":
        return f"close() returned after {ev['seconds']:.1f} s"
    return f"close() raised {ev['type']} after {ev['seconds']:.1f} s"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| fault injected | how injected | outcome | time to detection (median, min-max) | "
            "acknowledged updates lost | notes |\n|---|---|---|---|---|---|\n")
    body = "".join(f"| {r['fault']} | {r['how']} | {r['outcome'].replace('|', '/')} | {r['detect_text']} | "
                   f"{r['lost_text']} | {r['notes']} |\n" for r in rows)
    return head + body


def _git(*args: str, check: bool = False) -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30,
                              check=check).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        if check:
            raise
        return ""


def environment() -> dict[str, Any]:
    git = _git

    import numpy
    import zmq

    import pskv

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "numpy": numpy.__version__, "pyzmq": zmq.__version__,
            "pskv": getattr(pskv, "__version__", "?"), "git_commit": git("rev-parse", "HEAD"),
            "pskv_dirty": bool(git("status", "--porcelain", "--", "pskv")), "cpu": cpu, "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "platform": platform.platform()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per row (default 3)")
    ap.add_argument("--parallel", type=int, default=3, help="jobs at the same time (default 3)")
    ap.add_argument("--only", default="", help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("--fuzz-count", type=int, default=1400, help="hostile messages per fuzz run")
    ap.add_argument("--pskv-commit", default=None, metavar="REV",
                    help="measure pskv/ as committed in REV (git archive to a temporary directory); default: the checkout")
    ap.add_argument("--deadline", type=float, default=900.0, help="hard limit for the whole run in seconds")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "faults.json"))
    args = ap.parse_args(argv)
    rows = ROWS if not args.only else [r for g in args.only.split(",") for r in GROUPS[g.strip()]]

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    global SOURCE
    root = Path(tempfile.mkdtemp(prefix="pskv-bench-faults-"))
    measured = "pskv/ of this checkout" + (" (with uncommitted changes)" if _git("status", "--porcelain", "--", "pskv")
                                           else "")
    if args.pskv_commit:
        try:
            commit = _git("rev-parse", "--verify", f"{args.pskv_commit}^{{commit}}", check=True)
            archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "pskv"],
                                     capture_output=True, check=True, timeout=60).stdout
            (root / "src").mkdir()
            subprocess.run(["tar", "-x", "-C", str(root / "src")], input=archive, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"--pskv-commit {args.pskv_commit}: {exc}")
            shutil.rmtree(root, ignore_errors=True)
            return 2
        SOURCE = root / "src"
        os.environ["PSKV_BENCH_SOURCE"] = str(SOURCE)
        sys.path.insert(0, str(SOURCE))
        measured = f"pskv/ of commit {commit} (--pskv-commit {args.pskv_commit})"
        log(f"measuring {measured}")
    env = environment()
    env["pskv_measured"] = measured
    import pskv

    env["pskv_imported_from"] = str(Path(pskv.__file__).parent)
    trials = plan(rows, args.repeats, args.fuzz_count)
    log(f"{len(trials)} runs, {args.parallel} at a time")
    start = time.monotonic()
    try:
        pool = ThreadPoolExecutor(max(1, args.parallel))
        futures = [pool.submit(run_trial, tr, root) for tr in trials]
        _, late = wait(futures, timeout=args.deadline)
        if late:  # a hard limit for the whole run: stop every process still running, so every wait ends
            log(f"--deadline {args.deadline:.0f} s passed with {len(late)} runs unfinished; stopping them")
            for f in late:
                f.cancel()
            _reap_all()
        pool.shutdown(wait=True, cancel_futures=True)
        results = [f.result() if f.done() and not f.cancelled() else
                   {"ok": False, "label": tr.label, "failure": "not run: --deadline passed", "wall_s": 0.0}
                   for f, tr in zip(futures, trials)]
    finally:
        _reap_all()
        shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - start
    env["loadavg_end"] = os.getloadavg()
    table_rows, defects = summarize(results, args.repeats)
    table = markdown(table_rows)
    print(table)
    print(f"total wall time {wall:.0f} s; {len(trials)} runs, {args.parallel} at a time")
    if defects:
        print("\nDEFECTS:\n" + "\n".join(f"- {d}" for d in defects))
    out = {"settings": {"repeats": args.repeats, "parallel": args.parallel, "rows": rows, "fuzz_count": args.fuzz_count,
                        "default_heartbeat": DEFAULT_HB, "short_heartbeat": SHORT_HB, "common_env": COMMON_ENV,
                        "wall_s": round(wall, 1)},
           "environment": env, "rows": table_rows, "defects": defects, "table_markdown": table, "runs": results}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_worker":
        sys.exit(worker_main(sys.argv[2]))
    sys.exit(main())
