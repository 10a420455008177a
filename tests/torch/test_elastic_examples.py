"""Horovod's elastic examples run on pskv with their import line changed (issue 24), a worker removed and one
added while they run.

``examples/torch/pytorch_synthetic_benchmark_elastic.py`` and ``pytorch_mnist_elastic.py`` are Horovod's, with
``import pskv.torch as hvd`` for Horovod's import and torchvision's models and data replaced by small synthetic
stand-ins (each file's header lists its changed lines). Each runs under ``pskv launch -n 1:3`` on the two slots
a discovery file names. Once the program trains, the test holds every worker before its next local optimizer
step (a ``sitecustomize`` of the test's: the program is not changed), SIGKILLs worker slot 1, names a third
slot in the discovery file, waits until the new worker waits to join, and lets the others go on: they restore
after the departure, admit the new worker at their next commit, and the job ends with exit code 0.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from pskv.testing.jobs import ProcessGroup, child_env, start_launch, tagged_pids
from tests.torch.test_peer_examples import check_changed_lines

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "torch"
DEADLINE = 120.0
PROGRAMS = {  # example -> (its arguments, small sizes through its own flags; a line it prints once it trains;
    # what it prints at its end after the new worker trained)
    "pytorch_synthetic_benchmark_elastic.py": (
        ["--no-cuda", "--model", "small_cnn", "--batch-size", "4", "--num-warmup-batches", "2",
         "--num-batches-per-iter", "2", "--num-iters", "6"], "Running benchmark...", r"\[worker 0\] Total img/sec on 2 CPU"),
    "pytorch_mnist_elastic.py": (["--no-cuda", "--epochs", "1", "--batch-size", "16", "--log-interval", "1"],
                                 "Train Epoch: 1 [16/", r"\[worker 2\] Train Epoch: 1 \[.*\n(.*\n)*\[worker 0\] Test set: Average loss"),
}
# held before each local optimizer step while the file $ELASTIC_HOLD exists (workers only; the servers and the
# scheduler never import torch for it)
HOLD = '''
import os
if os.environ.get("DMLC_ROLE") == "worker" and os.environ.get("ELASTIC_HOLD"):
    import time
    import torch.optim

    _step = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        while os.path.exists(os.environ["ELASTIC_HOLD"]):
            time.sleep(0.02)
        return _step(self, *args, **kwargs)

    torch.optim.SGD.step = step
'''


@pytest.mark.parametrize("example", list(PROGRAMS))
def test_each_elastic_example_lists_exactly_its_changed_lines(example: str) -> None:
    check_changed_lines(EXAMPLES / example)


def worker_pid(tag: str, slot: int) -> int:
    """The pid of worker ``slot``'s program (not its guard) among the job's processes."""
    for pid in tagged_pids(tag):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"DMLC_WORKER_ID={slot}".encode() in environ and b"elastic.py" in cmdline and b"-S" not in cmdline:
            return pid
    raise AssertionError(f"no process of worker slot {slot}")


@pytest.mark.parametrize("example", list(PROGRAMS))
def test_a_horovod_elastic_example_goes_on_when_a_worker_is_killed_and_one_is_added(example: str, tmp_path: Path):
    args, training, ended = PROGRAMS[example]
    hosts, hold = tmp_path / "hosts", tmp_path / "hold"
    (tmp_path / "sitecustomize.py").write_text(HOLD)
    hosts.write_text("127.0.0.1:2\n")
    tag = f"elastic-{os.getpid()}-{tmp_path.name}"
    env = child_env({"ELASTIC_HOLD": str(hold), "PSKV_LOG_LEVEL": "INFO", "OMP_NUM_THREADS": "1",
                     "HOME": str(tmp_path)}, paths=[tmp_path, EXAMPLES])
    with ProcessGroup("elastic example") as group:
        launcher = start_launch(group, ["-n", "1:3", "-s", "1", "--host-discovery-script", f"cat {hosts}",
                                        "--discovery-interval", "0.1", "--respawn-cooldown", "3600",
                                        "--timeout", str(int(DEADLINE)), "--", sys.executable,
                                        str(EXAMPLES / example), *args], tmp_path, env, tag=tag)
        launcher.expect(training, DEADLINE)
        hold.write_text("")  # every worker waits before its next optimizer step
        os.kill(worker_pid(tag, 1), signal.SIGKILL)
        launcher.expect("worker slot 1 on 127.0.0.1 was killed by SIGKILL: it left the job; 1 workers go on", DEADLINE)
        hosts.write_text("127.0.0.1:3\n")  # one more slot: a new worker (slot 1's place still cools)
        launcher.expect("worker slot 2 waits to join at the next commit", DEADLINE)
        hold.unlink()
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 0, text
    assert "started worker slot 2 on 127.0.0.1: it joins at the next commit" in text, text
    assert re.search(r"scheduler: view \d+: slots 0 \(W=1\) from commit \d+ \(failure: slot 1 ", text), text
    assert re.search(r"scheduler: view \d+: slots 0,2 \(W=2\) from commit \d+ \(grow: slot 2\)", text), text
    assert re.search(ended, text), text  # the new worker took part (rank 1 of 2 at the end)
    assert tagged_pids(tag) == []
