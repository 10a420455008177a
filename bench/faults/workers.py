"""The worker side: what ``bench_faults.py _worker SPEC.json`` runs in every worker process of a job.

``SPEC["mode"]`` picks the entry point (:data:`WORKERS`). Every entry point reports by
event lines on stdout (:func:`emit`), which the driver parses (:meth:`.harness.Proc.events`),
and returns the process's exit status. ``pskv`` is imported inside the functions, after
:mod:`.settings` put the measured ``pskv/`` first on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .settings import EVENT, KEYS, SIZES


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


def _hog(info: Any, spec: dict[str, Any]) -> None:
    """A member that never reads: a connection of this worker (HELLO with its own token) that asks
    server 0 for ``spec["pulls"]`` pulls of ``spec["copies"]`` copies of key 103 and reads nothing."""
    import threading

    import zmq

    def run() -> None:
        from pskv.protocol import Command, Header, encode
        from pskv.protocol.bodies import Hello
        from pskv.testing import fuzz

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.connect(info.servers[0])
        sent = 0
        try:
            sock.send_multipart(encode(Header(Command.HELLO, 1, info.node_id,
                                              body=Hello("00000000000000a7", info.token).encode())))
            for i in range(int(spec["pulls"])):
                sock.send_multipart(fuzz.pull_of(KEYS[3], SIZES[3], copies=int(spec["copies"]), sender=info.node_id,
                                                 request=10 + i))
                sent += 1
                if i % 500 == 499:
                    time.sleep(0.01)
            emit("hog", sent=sent)
            time.sleep(float(spec.get("linger", 4.0)))
        finally:
            sock.close(0)
            ctx.term()

    threading.Thread(target=run, name="bench-hog", daemon=True).start()


def _grow(info: Any, spec: dict[str, Any]) -> None:
    """A member that makes a server keep state for it: ``spec["connections"]`` connections each opened
    with HELLO (its token) under a new send-only socket name, ``spec["ids"]`` requests with distinct
    ids, ``spec["parked"]`` pulls after push 10^9 (they would wait forever); counts the replies."""
    import threading

    import zmq

    def run() -> None:
        from pskv.protocol import Command, Header, encode
        from pskv.protocol.bodies import Hello
        from pskv.testing import fuzz

        ctx = zmq.Context()
        replies = {"error": 0, "other": 0, "bound": 0}

        def hello(sock: Any, tx: int | None) -> None:
            name = f"{tx:016x}" if tx is not None else ""  # no send-only socket: answered on this one
            sock.send_multipart(encode(Header(Command.HELLO, 1, info.node_id, body=Hello(name, info.token).encode())))

        def drain(sock: Any, wait_ms: int) -> None:
            while sock.poll(wait_ms):
                head = sock.recv_multipart()[0]
                replies["error" if b"Error" in head else "other"] += 1
                replies["bound"] += b"would pass the bound" in head
                wait_ms = min(wait_ms, 200)

        try:
            total = int(spec["connections"])
            for batch in range(0, total, 50):
                socks = [ctx.socket(zmq.DEALER) for _ in range(min(50, total - batch))]
                for i, sock in enumerate(socks):
                    sock.linger = 0
                    sock.connect(info.servers[0])
                    hello(sock, 0xB000 + batch + i)
                for sock in socks:
                    drain(sock, 2000)
                    sock.close(0)
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(info.servers[0])
            hello(sock, None)
            for i in range(int(spec["ids"])):
                sock.send_multipart(fuzz.probe_pull(100 + i, key=KEYS[0], sender=info.node_id))
                if i % 500 == 499:
                    drain(sock, 0)
            for i in range(int(spec["parked"])):
                sock.send_multipart(fuzz.pull_of(KEYS[0], SIZES[0], push=10**9, sender=info.node_id,
                                                 request=10**6 + i))
            drain(sock, 2000)
            sock.close(0)
            emit("grow", **replies)
        finally:
            ctx.term()

    threading.Thread(target=run, name="bench-grow", daemon=True).start()


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
                if spec.get("hog") and rank == 1:  # this worker also opens a connection that never reads
                    _hog(kv._worker.client.info, spec["hog"])
                if spec.get("grow") and rank == 1:  # ... or connections that make the server keep state
                    _grow(kv._worker.client.info, spec["grow"])
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
    boundary. A replacement (``kv.is_recovery``) goes on from ``kv.resume_step()`` (the steps of its
    rank whose pushes reached the servers; its pushes are refused until it asked), and reports the
    marker beside it. ``resume`` ``"servers"``: the same, wherever the kill fell.
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
        start = kv.resume_step()  # type: ignore[attr-defined]  # a replacement's pushes wait for it
        marked = int(Path(pause["marker"]).read_text(encoding="ascii")) if pause else start
        print(f"rejoined at step {start} (its own marker: {marked})", flush=True)
        emit("rejoined", rank=rank, step=start, marker=marked)
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
    if not outs:  # a replacement of a worker killed after its last push
        outs = kv.pull(names)
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
    """Run the entry point that the JSON file ``spec_path`` names; returns the exit status."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    return WORKERS[spec["mode"]](spec)
