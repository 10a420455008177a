"""Mismatched step counts fail within seconds on every rank, naming the worker that is ahead.

Real jobs through ``pskv launch``, with the default timeouts (a request waits 300 s): worker
1 runs one ``pushpull`` more than worker 0, which has gone on to a barrier, another
collective, ``close()``, or the end of its script. The round of the extra step can never
complete (:mod:`pskv.server.steps`, :class:`pskv.server.liveness.DeadWorkers`): every worker
that waits raises at once, the error names worker 1 as ahead, the key, the round and the fix,
and the launcher's root-cause line names worker 1. A job whose steps match, with pushes still
in flight at its barriers, runs to its end.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pskv.partition import server_key
from tests.integration.test_launcher import run_launcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds the job's processes through /proc")

WITHIN = 10.0  # seconds every waiting worker may take to raise (the bar; about 0.1 s when idle)

UNEVEN = """
import sys, time
import numpy as np
import pskv

after = sys.argv[1]
kv = pskv.create("dist_sync")
kv.init("w", np.zeros(4, np.float32))
out = np.zeros(4, np.float32)
if after == "even":  # the same steps everywhere, non-blocking pushes and pulls in flight at each barrier
    for epoch in range(3):
        for _ in range(4):
            kv.push("w", np.ones(4, np.float32), block=False)
            kv.pull("w", out=out, block=False)
        kv.barrier()
    kv.wait()
    print(f"even {out[0]:g}", flush=True)
    kv.close()
    sys.exit(0)
if after == "late":  # worker 0 is slow, not at a meeting: worker 1's request times out
    try:
        if kv.rank == 0:
            time.sleep(3)
        kv.pushpull("w", np.ones(4, np.float32), out=out)
    except pskv.OperationTimeoutError as exc:
        print(f"timed out: {exc}", flush=True)
    kv.set_barrier_before_exit(False)
    kv.close()
    sys.exit(0)
try:
    for _ in range(3 + kv.rank):  # worker 1 has one batch more
        if after == "barrier_nb":  # non-blocking steps: still in flight when the loop ends
            kv.push("w", np.ones(4, np.float32), block=False)
            kv.pull("w", out=out, block=False)
        else:
            kv.pushpull("w", np.ones(4, np.float32), out=out)
    print(f"done at {time.time():.6f}", flush=True)
    if after in ("barrier", "barrier_nb"):
        kv.barrier()
    elif after == "set_optimizer":
        kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.1))
    elif after == "close":
        kv.close()
    print("no error", flush=True)
except pskv.KVStoreError as exc:
    print(f"raised at {time.time():.6f}: {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
"""


def launch(tag: str, tmp_path: Path, after: str, *extra: str) -> tuple[int, str]:
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    return run_launcher(["-n", "2", "-s", "1", "--stop-grace", "2", *extra, "--", sys.executable, str(script), after],
                        tag, tmp_path)


def raised(out: str, rank: int) -> tuple[float, str, str] | None:
    """(when, error class, message) of worker ``rank``'s error, if it printed one."""
    m = re.search(rf"^\[worker {rank}\] raised at ([\d.]+): (\w+): (.*)$", out, flags=re.M)
    return None if m is None else (float(m.group(1)), m.group(2), m.group(3))


def check_names_the_step(message: str) -> None:
    assert (f"mismatched step counts: worker 1 is ahead: it pushed key 'w' (server key {server_key('w')}) for sync "
            "round 4") in message, message
    assert "kv.join()" in message and "fit(uneven=True)" in message, message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("after", ["barrier", "barrier_nb", "set_optimizer"])
def test_extra_pushpull_fails_fast_on_every_rank(after, tag, tmp_path):
    code, out = launch(tag, tmp_path, after)
    assert code == 1, out
    done = re.search(r"^\[worker 0\] done at ([\d.]+)", out, flags=re.M)
    assert done, out
    for rank in (0, 1):  # the worker in the collective, and the worker ahead in its extra round
        seen = raised(out, rank)
        assert seen is not None, out
        when, kind, message = seen
        assert kind == "CollectiveMismatchError", out
        check_names_the_step(message)
        assert f"before {after.removesuffix('_nb')}#" in message, message
        assert when - float(done.group(1)) < WITHIN, out
    cause = re.search(r"^pskv launch: (.*); stopping the job$", out, flags=re.M)
    assert cause and cause.group(1).startswith(("worker 1 is ahead (mismatched step counts",
                                                "worker 1 on 127.0.0.1 exited with code 1 after its error said it "
                                                "is ahead")), out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("after", ["close", "exit"])
def test_the_worker_ahead_of_one_that_left_raises_at_once(after, tag, tmp_path):
    code, out = launch(tag, tmp_path, after)
    assert code == 1, out
    done = re.search(r"^\[worker 0\] done at ([\d.]+)", out, flags=re.M)
    seen = raised(out, 1)
    assert done and seen, out
    when, kind, message = seen
    assert kind == "NodeFailedError" and message.startswith("worker 0 failed: left the job"), out
    check_names_the_step(message)
    assert when - float(done.group(1)) < WITHIN, out
    assert raised(out, 0) is None, out  # it closed (or ended) normally; it waits for nothing
    assert ("pskv launch: worker 1 on 127.0.0.1 exited with code 1 after its NodeFailedError said worker 0 left "
            "the job early") in out, out


@pytest.mark.timeout(60)
def test_matching_steps_with_pushes_in_flight_at_barriers_run_to_their_end(tag, tmp_path):
    code, out = launch(tag, tmp_path, "even")
    assert code == 0, out
    assert out.count("even 2") == 2, out  # the last of 12 rounds: the sum of both pushes (no optimizer)
    assert "mismatched" not in out, out


@pytest.mark.timeout(60)
def test_a_request_timeout_names_the_timeout_given_not_the_time_left(tag, tmp_path):
    # a blocking call that reads its own reply on a local connection used to say "within 0.0 s"
    code, out = launch(tag, tmp_path, "late", "--env", "PSKV_REQUEST_TIMEOUT=1.5")
    assert code == 0, out
    assert "[worker 1] timed out: pushpull to server 0 got no reply within 1.5 s" in out, out


# Worker 0 raises first (it is in the barrier, not ahead) and says worker 1 is ahead; worker 1 is slower to end.
SAYS_AHEAD = """
import os, sys, time
if os.environ["DMLC_WORKER_ID"] == "0":
    print("pskv.errors.CollectiveMismatchError: mismatched step counts: worker 1 is ahead: it pushed key 0 "
          "for sync round 4, which worker 0 will not push before barrier#4; ...", flush=True)
    sys.exit(1)
time.sleep(30)
"""


@pytest.mark.timeout(60)
def test_the_launcher_names_the_worker_ahead_as_the_root_cause_even_when_another_fails_first(tag, tmp_path):
    script = tmp_path / "says_ahead.py"
    script.write_text(SAYS_AHEAD)
    code, out = run_launcher(["-n", "2", "-s", "1", "--stop-grace", "1", "--", sys.executable, str(script)],
                             tag, tmp_path)
    assert code == 1, out
    assert ("pskv launch: worker 1 is ahead (mismatched step counts: with uneven data see kv.join() or "
            "fit(uneven=True)): worker 0 on 127.0.0.1 exited with code 1 after its error said so; stopping the job"
            ) in out, out
