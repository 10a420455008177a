"""Elastic jobs through ``pskv launch -n MIN:MAX`` (issue 24): a worker killed mid-job, a worker added.

Three workers train one key split over two servers (SGD on the servers, a commit after every step).
Slot 1 SIGKILLs itself at a given step, before or after its push: the launcher reports its exit to the
scheduler, the others restore to the last commit, go on with two workers, and nothing is restarted
(``--respawn-cooldown`` keeps its place unused). Later the discovery script names a fourth slot: one
new worker starts, is admitted at the next commit and takes part from the step after. The final values
must equal a replay of the record the workers printed (the members of every committed step) bit for
bit: the gradients are small integers and the learning rate a power of two, so a push counted twice,
lost or counted half would move some element by a multiple of the learning rate.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pskv.testing.jobs import ProcessGroup, child_env, start_launch

LR = 2.0 ** -6
N = 8
DEADLINE = 90.0

TRAIN = '''
import os, signal, sys, time
import numpy as np
import pskv
from pskv.errors import MembershipChangedError
from pskv.optimizer import SGD

LR, N = 2.0 ** -6, 8
STEPS = int(os.environ["ELASTIC_STEPS"])
KILL_SLOT, KILL_STEP, WHEN = os.environ["ELASTIC_KILL"].split(":")
GROW_STEP, GO = int(os.environ["ELASTIC_GROW_STEP"]), os.environ["ELASTIC_GO"]
EVERY = int(os.environ.get("ELASTIC_COMMIT_EVERY", "1"))  # steps between commits


def gradient(slot, step):
    return np.array([((slot * 7 + step + i) % 13) - 6 for i in range(N)], np.float32)


kv = pskv.create(os.environ["ELASTIC_STORE"])
slot = kv.view.members[kv.rank]
kv.init("w", np.zeros(N, np.float32))
kv.init("step", np.zeros(1, np.float32))
kv.set_optimizer(SGD(learning_rate=LR))  # a joiner keeps the servers' (and their state)
out, at = np.zeros(N, np.float32), np.zeros(1, np.float32)
if kv.view.cause == "start":
    kv.commit()  # the optimizer is part of the state a departure rolls back to
    done = 0
else:  # joined a running job: rank 0 says which step it is
    kv.broadcast("step", at, out=at)
    done = int(at[0])
print(f"slot {slot} pid {os.getpid()} starts at step {done} as rank {kv.rank} of {kv.num_workers}", flush=True)
committed, since = done, []  # the last commit's step; the steps since, with their members
while done < STEPS:
    try:
        if (slot, done) == (int(KILL_SLOT), int(KILL_STEP)) and WHEN == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if done == GROW_STEP and kv.rank == 0:  # the test lets a new worker register first
            print(f"waiting at step {done}", flush=True)
            deadline = time.monotonic() + 60
            while not os.path.exists(GO) and time.monotonic() < deadline:
                time.sleep(0.02)
        members = kv.view.members
        kv.push("w", gradient(slot, done))
        if (slot, done) == (int(KILL_SLOT), int(KILL_STEP)) and WHEN == "after":
            kv.pull("w", out=out)  # the push is in (its round may not be complete yet)
            os.kill(os.getpid(), signal.SIGKILL)
        kv.pull("w", out=out)
        done += 1
        since.append((done, members))
        if done % EVERY and done < STEPS:
            continue
        view = kv.commit()
        for step, members in since:
            print(f"committed step {step} members {','.join(map(str, members))}", flush=True)
        committed, since = done, []
        if view is not None:  # workers admitted: they learn the step from rank 0
            kv.broadcast("step", np.full(1, done, np.float32), out=at)
    except MembershipChangedError as exc:
        print(f"restore at step {done}: {exc}", flush=True)
        kv.restore()
        done, since = committed, []  # the program's state back to its last commit: redo from there
kv.pull("w", out=out)
kv.barrier()  # everyone read the final value before anyone leaves
print("final", slot, kv.rank, kv.num_workers, ",".join(repr(float(x)) for x in out), flush=True)
kv.close()
'''


def gradient(slot: int, step: int) -> np.ndarray:
    return np.array([((slot * 7 + step + i) % 13) - 6 for i in range(N)], np.float32)


def replay(record: dict[int, tuple[int, ...]]) -> np.ndarray:
    """The value after the committed steps: each step's gradients summed over the members it ran with."""
    w = np.zeros(N, np.float32)
    for step in sorted(record):
        w -= np.float32(LR) * sum((gradient(s, step - 1) for s in record[step]), np.zeros(N, np.float32))
    return w


def check_job(text: str, members: list[tuple[int, ...]], finals: list[tuple[int, int, int]]) -> None:
    """The job's output: every worker saw the same members at each committed step, which are ``members`` (step 1
    on); the workers that finished are ``finals`` (slot, rank, size), each with the replay's values bit for bit."""
    record: dict[int, tuple[int, ...]] = {}
    for step, listed in re.findall(r"committed step (\d+) members ([\d,]+)", text):
        seen = tuple(int(s) for s in listed.split(","))
        assert record.setdefault(int(step), seen) == seen, (step, listed)  # every worker saw the same members
    assert [record[s] for s in sorted(record)] == members, record
    ended = re.findall(r"\] final (\d+) (\d+) (\d+) (\S+)", text)
    assert sorted((int(slot), int(rank), int(size)) for slot, rank, size, _ in ended) == sorted(finals), text
    want = replay(record)
    for *_, values in ended:
        np.testing.assert_array_equal(np.array([float(v) for v in values.split(",")], np.float32), want)


@pytest.mark.parametrize("store,when,every,killed,kill,grow,steps", [
    ("dist_sync", "before", 1, 1, 3, 6, 10),
    ("dist_async", "after", 1, 1, 3, 6, 10),
    ("dist_sync_device", "before", 3, 0, 4, 7, 11),  # rank 0 killed inside a commit window of 3 steps
])
def test_a_killed_worker_leaves_the_job_and_an_added_one_joins_with_every_gradient_counted_once(
        tmp_path: Path, store, when, every, killed, kill, grow, steps):
    script, hosts, go = tmp_path / "train.py", tmp_path / "hosts", tmp_path / "go"
    script.write_text(TRAIN)
    hosts.write_text("127.0.0.1:3\n")
    env = child_env({"ELASTIC_STORE": store, "ELASTIC_STEPS": str(steps), "ELASTIC_KILL": f"{killed}:{kill}:{when}",
                     "ELASTIC_COMMIT_EVERY": str(every), "ELASTIC_GROW_STEP": str(grow), "ELASTIC_GO": str(go),
                     "MXNET_KVSTORE_BIGARRAY_BOUND": "4", "PSKV_LOG_LEVEL": "INFO"})
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["-n", "2:4", "-s", "2", "--host-discovery-script", f"cat {hosts}",
                                        "--discovery-interval", "0.1", "--respawn-cooldown", "3600", "--timeout", "80",
                                        "--", sys.executable, str(script)], tmp_path, env)
        launcher.expect(f"waiting at step {grow}", DEADLINE)
        hosts.write_text("127.0.0.1:4\n")  # room for one more worker: slot 3 (the killed one's place still cools)
        launcher.expect("worker slot 3 waits to join at the next commit", DEADLINE)
        go.write_text("")
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 0, text
    assert f"worker slot {killed} on 127.0.0.1 was killed by SIGKILL: it left the job; 2 workers go on" in text, text
    assert "started worker slot 3 on 127.0.0.1" in text and "started worker slot 4" not in text, text
    # the steps since the last commit before the kill were voided and redone without it; slot 3 registered while
    # rank 0 waited before step grow + 1: admitted at the first commit after that step
    voided_from, admitted = kill // every * every, -(-(grow + 1) // every) * every
    survivors = tuple(s for s in (0, 1, 2) if s != killed)
    check_job(text, [(0, 1, 2)] * voided_from + [survivors] * (admitted - voided_from)
              + [(*survivors, 3)] * (steps - admitted), [(slot, rank, 3) for rank, slot in enumerate((*survivors, 3))])


def test_a_host_that_shrinks_has_a_worker_drained_at_a_commit_without_voiding_any_work(tmp_path: Path):
    script, hosts, go = tmp_path / "train.py", tmp_path / "hosts", tmp_path / "go"
    script.write_text(TRAIN)
    hosts.write_text("127.0.0.1:3\n")
    steps, shrink = 8, 4
    env = child_env({"ELASTIC_STORE": "dist_sync", "ELASTIC_STEPS": str(steps), "ELASTIC_KILL": "9:0:before",
                     "ELASTIC_GROW_STEP": str(shrink), "ELASTIC_GO": str(go), "MXNET_KVSTORE_BIGARRAY_BOUND": "4"})
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["-n", "2:3", "-s", "2", "--host-discovery-script", f"cat {hosts}",
                                        "--discovery-interval", "0.1", "--timeout", "60",
                                        "--", sys.executable, str(script)], tmp_path, env)
        launcher.expect(f"waiting at step {shrink}", DEADLINE)
        hosts.write_text("127.0.0.1:2\n")
        launcher.expect("127.0.0.1 has fewer slots now: worker slot 2 is drained at the next commit", DEADLINE)
        go.write_text("")
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 0, text
    assert "worker slot 2 on 127.0.0.1 was drained: it left the job at a commit;" in text, text  # the others may be done
    assert "restore at step" not in text, text  # a drain voids nothing
    check_job(text, [(0, 1, 2)] * (shrink + 1) + [(0, 1)] * (steps - shrink - 1), [(0, 0, 2), (1, 1, 2)])

def test_below_min_workers_for_the_elastic_timeout_the_job_fails_with_the_reason(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = child_env({"ELASTIC_STORE": "dist_sync", "ELASTIC_STEPS": "1000", "ELASTIC_KILL": "1:2:before", "ELASTIC_GROW_STEP": "-1",
                     "ELASTIC_GO": str(tmp_path / "go")})
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["-n", "2:3", "-s", "1", "--host-discovery-script", "echo 127.0.0.1:2",
                                        "--respawn-cooldown", "3600", "--elastic-timeout", "1", "--timeout", "60",
                                        "--", sys.executable, str(script)], tmp_path, env)
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 1, text
    assert "worker slot 1 on 127.0.0.1 was killed by SIGKILL: it left the job; 1 workers go on (MIN 2, MAX 3)" in text
    reason = "the elastic job failed: only 1 of at least 2 workers for 1 s (PSKV_ELASTIC_TIMEOUT; pskv launch --elastic-timeout)"
    assert f"[worker 0] pskv.errors.NodeFailedError: {reason}" in text, text  # the worker's own error says why
    assert f"[scheduler] pskv.errors.NodeFailedError: {reason}" in text, text  # and the scheduler's
    # the launcher's line names the first to exit (the scheduler or worker 0) and the reason
    assert re.search(rf"pskv launch: (worker 0|scheduler) on 127\.0\.0\.1 exited with code 1: {re.escape(reason)}; "
                     "stopping the job", text), text


BYTEPS = '''
import os, signal
import numpy as np
import pskv
from pskv.errors import MembershipChangedError

LR, N, STEPS = 2.0 ** -6, 8, 6


def gradient(slot, step):
    return np.array([((slot * 7 + step + i) % 13) - 6 for i in range(N)], np.float32)


kv = pskv.create("byteps")  # the servers sum; the program keeps the weights and commits them with the job
slot = kv.view.members[kv.rank]
w = np.zeros(N, np.float32)
kv.commit()
saved, done = w.copy(), 0
while done < STEPS:
    try:
        if (slot, done) == (1, 3):
            os.kill(os.getpid(), signal.SIGKILL)
        members = kv.view.members
        g = gradient(slot, done)
        kv.pushpull("g", g, out=g)
        w -= np.float32(LR) * g
        kv.commit()
        done, saved = done + 1, w.copy()
        print(f"committed step {done} members {','.join(map(str, members))}", flush=True)
    except MembershipChangedError:
        kv.restore()
        w = saved.copy()
kv.barrier()
print("final", slot, kv.rank, kv.num_workers, ",".join(repr(float(x)) for x in w), flush=True)
kv.close()
'''


def test_a_byteps_jobs_workers_keep_their_weights_through_a_departure(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(BYTEPS)
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["-n", "2:3", "-s", "2", "--respawn-cooldown", "3600", "--timeout", "60",
                                        "--", sys.executable, str(script)], tmp_path, child_env())
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 0, text
    check_job(text, [(0, 1, 2)] * 3 + [(0, 2)] * 3, [(0, 0, 2), (2, 1, 2)])


def test_an_elastic_job_over_ssh_goes_on_without_a_killed_worker_and_never_starts_one_where_pskv_cannot_run(
        tmp_path: Path):
    # the ssh launcher's processes through a stand-in ssh that runs the remote command here (a real sshd
    # is not on these machines): each worker one ssh session, a departure reported as locally. Mid-job the
    # discovery script names a host ssh cannot reach: its preflight fails, it is named once, no worker goes there
    from pskv.testing.jobs import free_port
    from tests.integration.test_launcher import FAKE_SSH

    script, bindir, found, go = tmp_path / "train.py", tmp_path / "bin", tmp_path / "found", tmp_path / "go"
    script.write_text(TRAIN)
    bindir.mkdir()
    unreachable = '[ "$host" = nopskv ] && { echo "ssh: Could not resolve hostname nopskv" >&2; exit 255; }\nexec '
    (bindir / "ssh").write_text(FAKE_SSH.replace("exec ", unreachable))  # each call logged, then nopskv's fails
    (bindir / "ssh").chmod(0o755)
    (tmp_path / "hosts").write_text("127.0.0.1 3\n")
    found.write_text("127.0.0.1:3\n")
    env = child_env({"ELASTIC_STORE": "dist_sync", "ELASTIC_STEPS": "6", "ELASTIC_KILL": "1:3:after",
                     "ELASTIC_GROW_STEP": "4", "ELASTIC_GO": str(go), "MXNET_KVSTORE_BIGARRAY_BOUND": "4",
                     "PATH": f"{bindir}:{child_env()['PATH']}", "FAKE_SSH_LOG": str(tmp_path / "ssh.log")})
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--port", str(free_port()),
                                        "-n", "2:3", "-s", "1", "--respawn-cooldown", "3600", "--timeout", "60",
                                        "--host-discovery-script", f"cat {found}", "--discovery-interval", "0.1",
                                        "--", sys.executable, str(script)], tmp_path, env)
        launcher.expect("waiting at step 4", DEADLINE)  # after slot 1's departure at step 3
        found.write_text("127.0.0.1:3\nnopskv:1\n")
        launcher.expect("host nopskv: cannot run pskv: ssh exited with code 255", DEADLINE)
        go.write_text("")
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 0, text
    assert "worker slot 1 on 127.0.0.1 was killed by SIGKILL: it left the job; 2 workers go on (MIN 2, MAX 3)" in text
    assert re.search(r"host nopskv: cannot run pskv: ssh exited with code 255 .*: ssh: Could not resolve hostname "
                     r"nopskv; its slots take no worker\n", text), text
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    assert len(calls) == 1 + 2 + 3 + 1, calls  # the preflight, the roles, the workers, nopskv's preflight
    assert [c.split()[0] for c in calls].count("nopskv") == 1, calls  # no worker was started there
    check_job(text, [(0, 1, 2)] * 3 + [(0, 2)] * 3, [(0, 0, 2), (2, 1, 2)])


def test_a_first_discovered_host_where_pskv_cannot_run_stops_the_launch_before_anything_starts(tmp_path: Path):
    # the discovery script's first answer is checked with the hostfile's hosts, as a fixed job's hosts are
    from tests.integration.test_launcher import FAKE_SSH

    bindir = tmp_path / "bin"
    bindir.mkdir()
    unreachable = '[ "$host" = nopskv ] && { echo "ssh: Could not resolve hostname nopskv" >&2; exit 255; }\nexec '
    (bindir / "ssh").write_text(FAKE_SSH.replace("exec ", unreachable))
    (bindir / "ssh").chmod(0o755)
    (tmp_path / "hosts").write_text("127.0.0.1 2\n")
    env = child_env({"PATH": f"{bindir}:{child_env()['PATH']}", "FAKE_SSH_LOG": str(tmp_path / "ssh.log")})
    with ProcessGroup("elastic") as group:
        launcher = start_launch(group, ["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "-n", "2:3", "-s", "1",
                                        "--host-discovery-script", "echo 127.0.0.1:2; echo nopskv:1", "--timeout", "60",
                                        "--", sys.executable, "-c", "pass"], tmp_path, env)
        code = launcher.wait(DEADLINE)
        text = launcher.output()
    assert code == 1, text
    assert "host nopskv: cannot run pskv: ssh exited with code 255" in text, text
    assert "the preflight failed on 1 of 2 host(s)" in text and "nothing was started" in text, text
    assert len((tmp_path / "ssh.log").read_text().splitlines()) == 2  # the two preflights, nothing else
