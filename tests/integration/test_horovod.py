"""The ``horovod`` store in real processes: MXNet 2.0's horovod nightly test and Horovod's
torch broadcast tests through a thin ``hvd`` adapter, 2 ranks under torchrun (Gloo, CPU);
a rank that dies fails the other's call with an error naming it; a job under ``pskv launch``.

Ported from the semantics (no code copied) of apache/mxnet
``tests/nightly/dist_device_sync_kvstore_horovod.py`` (``test_type``, ``test_broadcast``,
``test_pushpull``) and horovod/horovod ``test/parallel/test_torch.py``
(``test_horovod_broadcast``, ``_inplace``, ``_error``, ``_type_error``, ``_rank_error``).
Not ported: ``_grad`` (a store's broadcast is not an autograd function) and
``_process_sets`` / ``_duplicate_name_error`` (no process sets; calls run one at a time).
Horovod's dtypes are narrowed to pskv's (float16, bfloat16, float32, float64, int32, int64).

The whole job runs once (a module fixture); each ported test reads its outcome on both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fault.launched import finals, launch_job

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 120  # seconds for the whole 2-rank job (it takes a few)

# The adapter: Horovod's torch API on a pskv store (what a Horovod script would import as hvd).
ADAPTER = textwrap.dedent(r'''
    import itertools
    import pskv

    class Hvd:
        """hvd.init / rank / size / local_rank / broadcast / broadcast_ / allreduce on pskv.create('horovod')."""

        def __init__(self):
            self.kv = None
            self._names = itertools.count()

        def init(self):
            if self.kv is None:
                self.kv = pskv.create("horovod")

        def rank(self):
            return self.kv.rank

        def size(self):
            return self.kv.num_workers

        def local_rank(self):
            return self.kv.local_rank

        def _name(self, op):  # Horovod names unnamed tensors by a counter, the same on every rank
            return f"hvd.{op}.{next(self._names)}"

        def broadcast(self, tensor, root_rank):
            out = torch.empty_like(tensor)
            self.kv.broadcast(self._name("broadcast"), tensor, out=out, root_rank=root_rank)
            return out

        def broadcast_(self, tensor, root_rank):
            self.kv.broadcast(self._name("broadcast"), tensor, root_rank=root_rank)
            return tensor

        def allreduce(self, tensor, average=False):
            out = torch.empty_like(tensor)
            self.kv.pushpull(self._name("allreduce"), tensor, out=out)
            return out / self.size() if average else out
''')

JOB = "import json, sys, time\nimport numpy as np\nimport torch\n" + ADAPTER + textwrap.dedent(r'''
    results = {}

    def case(fn):
        try:
            fn()
            results[fn.__name__] = "ok"
        except BaseException as exc:  # recorded, the next case runs
            results[fn.__name__] = f"{type(exc).__name__}: {exc}"
        return fn

    hvd = Hvd()
    hvd.init()
    kv = hvd.kv  # MXNet's test uses the store directly: kv = mx.kv.create('horovod')
    DTYPES = [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64]

    # -- MXNet 2.0: tests/nightly/dist_device_sync_kvstore_horovod.py -----------------------
    shape = (2, 3)

    @case
    def mxnet_type():
        assert kv.type == "horovod"

    @case
    def mxnet_broadcast():
        val = np.zeros(shape, np.float32)
        kv.broadcast("0", np.ones(shape, np.float32), out=val)
        assert np.array_equal(val, np.ones(shape)), (kv.rank, val)

    @case
    def mxnet_pushpull():
        tensor = np.ones(shape, np.float32) * (kv.rank + 1)
        kv.pushpull("3", tensor)
        expected = (kv.num_workers + 1) * kv.num_workers / 2
        assert np.array_equal(tensor, np.full(shape, expected)), (kv.rank, tensor)

    # -- Horovod: test/parallel/test_torch.py, broadcast -------------------------------------
    def broadcast_cases():
        """Horovod's grid: every dtype, 1-3 dims of 17, every root; this rank's and the root's tensors."""
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim, root in itertools.product(DTYPES, [1, 2, 3], range(size)):
            filled = [torch.ones(*([17] * dim), dtype=torch.float32).mul_(v).to(dtype) for v in (rank, root)]
            yield (dtype, dim, root), rank == root, *filled

    @case
    def horovod_broadcast():
        for where, is_root, tensor, root_tensor in broadcast_cases():
            got = hvd.broadcast(tensor, where[2])
            if not is_root:
                assert not bool((tensor == root_tensor).any()), ("source modified", where)
            assert bool((got == root_tensor).all()), ("wrong result", where)

    @case
    def horovod_broadcast_inplace():
        for where, _, tensor, root_tensor in broadcast_cases():
            got = hvd.broadcast_(tensor, where[2])
            assert bool((tensor == got).all()), ("not in place", where)
            assert bool((got == root_tensor).all()), ("wrong result", where)

    def refused(call, *names):
        """Horovod expects a RuntimeError on every rank; pskv's names each rank's call."""
        try:
            call()
        except pskv.CollectiveMismatchError as exc:
            assert isinstance(exc, RuntimeError)
            text = str(exc)
            assert all(n in text for n in names), text
            return
        raise AssertionError("the call did not fail")

    @case
    def horovod_broadcast_error():
        size = [17] * 3
        size[1] = 10 * (hvd.rank() + 1)
        refused(lambda: hvd.broadcast(torch.ones(*size).mul_(hvd.rank()), 0),
                "rank 0:", "(17, 10, 17)", "rank 1:", "(17, 20, 17)")

    @case
    def horovod_broadcast_type_error():
        tensor = torch.ones(17, 17, 17, dtype=torch.int32 if hvd.rank() % 2 == 0 else torch.float32)
        refused(lambda: hvd.broadcast(tensor, 0), "int32", "float32")

    @case
    def horovod_broadcast_rank_error():
        refused(lambda: hvd.broadcast(torch.ones(17, 17, 17), hvd.rank()), "root_rank 0", "root_rank 1")

    # -- beyond the references: root_rank, lists, NumPy, the group still works ---------------
    @case
    def a_refused_call_fails_every_rank_at_once():
        began = time.monotonic()
        out = torch.zeros(3 if kv.rank == 1 else 2)  # rank 1's out does not fit its value
        try:
            kv.pushpull("r", torch.ones(2), out=out)
            raise AssertionError("the call did not fail")
        except (pskv.ShapeMismatchError, pskv.CollectiveMismatchError) as exc:
            mine = pskv.ShapeMismatchError if kv.rank == 1 else pskv.CollectiveMismatchError
            assert type(exc) is mine, exc
            assert kv.rank == 1 or "refused on rank 1: ShapeMismatchError" in str(exc), exc
        assert time.monotonic() - began < 10, "not at once"
        kv.pushpull("r", torch.ones(2))  # the store goes on


    @case
    def lists_numpy_and_roots():
        rank, size = kv.rank, kv.num_workers
        for root in range(size):
            a, b = np.full(4, rank, np.int64), torch.full((2, 2), float(rank))
            kv.broadcast(["a", "b"], [a, b], root_rank=root)
            assert (a == root).all() and bool((b == root).all()), (root, a, b)
        # a key's list of values (devices) is summed on the rank, then over the ranks
        vals = [torch.ones(3) * (rank + 1), torch.ones(3)]
        outs = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
        kv.pushpull(["x", "y"], [vals, np.full(3, rank, np.float32)], out=[outs[0], outs[1]])
        assert (outs[0] == sum(r + 2 for r in range(size))).all(), outs[0]
        assert (outs[1] == sum(range(size))).all(), outs[1]
        handle = kv.pushpull("z", torch.ones(5), block=False)
        handle.wait()
        kv.barrier()

    @case
    def refuse_push_fails_the_others_call_and_the_store_goes_on():
        try:  # kv.refuse_push: rank 1 fails its share of the collective with its own error
            if kv.rank == 1:
                kv.refuse_push("rp", pskv.InvalidArgumentError("rank 1's own reason"), torch.ones(3))
            kv.pushpull("rp", torch.ones(2))
            raise AssertionError("the call did not fail")
        except (pskv.InvalidArgumentError, pskv.CollectiveMismatchError) as exc:
            mine = pskv.InvalidArgumentError if kv.rank == 1 else pskv.CollectiveMismatchError
            assert type(exc) is mine, exc
            assert kv.rank == 1 or "refused on rank 1: InvalidArgumentError: rank 1's own reason" in str(exc), exc
        t = torch.ones(2)
        kv.pushpull("rp", t)
        assert t.tolist() == [2.0, 2.0], t

    @case
    def pushpull_into_out_leaves_the_value():
        # the docstring's "into out (into value if out is None)": the value is the caller's, unchanged
        total = sum(r + 1 for r in range(kv.num_workers))
        for key, value, out in (("o.torch", torch.full((3,), kv.rank + 1.0), torch.zeros(3)),
                                ("o.numpy", np.full(3, kv.rank + 1, np.int64), np.zeros(3, np.int64))):
            kv.pushpull(key, value, out=out)
            assert (value == kv.rank + 1).all() and (out == total).all(), (key, value, out)

    @case
    def own_group_beside_torchs():
        # the script's own torch.distributed default group (torchrun's variables) and a second store
        torch.distributed.init_process_group("gloo")
        t = torch.ones(2)
        torch.distributed.all_reduce(t)
        with pskv.create("horovod") as kv2:
            v = torch.full((2,), float(kv2.rank))
            kv2.pushpull("v", v)
            kv.pushpull("t", t)
            assert v.tolist() == [1.0, 1.0] and t.tolist() == [4.0, 4.0], (v, t)
        torch.distributed.destroy_process_group()

    @case
    def trainer_on_the_store():
        # pskv's Trainer with kvstore='horovod': rank 0's weights reach everyone at the first forward,
        # the gradients are summed over the ranks and divided by the global batch (the optimizer runs here)
        from pskv.parallel import Trainer
        torch.manual_seed(0)
        start = torch.nn.Linear(3, 1, bias=False).weight.detach().clone()  # rank 0's initial weights
        torch.manual_seed(kv.rank)
        model = torch.nn.Linear(3, 1, bias=False)
        trainer = Trainer(model, "sgd", {"learning_rate": 0.5}, kvstore="horovod")
        model(torch.full((4, 3), float(kv.rank + 1))).sum().backward()  # gradient 4 * (rank + 1) per weight
        trainer.step(4)
        mean = sum(4 * (r + 1) for r in range(kv.num_workers)) / (4 * kv.num_workers)
        assert torch.allclose(model.weight.detach(), start - 0.5 * mean), (model.weight, start)

    results["rank"] = kv.rank
    results["size"] = kv.num_workers
    results["local_rank"] = kv.local_rank
    with open(f"{sys.argv[1]}/rank-{kv.rank}.json", "w") as f:
        json.dump(results, f)
    kv.close()
''')

CASES = ["mxnet_type", "mxnet_broadcast", "mxnet_pushpull", "horovod_broadcast", "horovod_broadcast_inplace",
         "horovod_broadcast_error", "horovod_broadcast_type_error", "horovod_broadcast_rank_error",
         "a_refused_call_fails_every_rank_at_once", "lists_numpy_and_roots", "refuse_push_fails_the_others_call_and_the_store_goes_on",
         "pushpull_into_out_leaves_the_value",
         "own_group_beside_torchs",
         "trainer_on_the_store"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "PSKV_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OMPI_", "PMI_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PSKV_DEFAULT_TIMEOUT"] = "30"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The job under torchrun (its own rendezvous on a free port): each rank's outcomes."""
    where = tmp_path_factory.mktemp("horovod")
    script = where / "job.py"
    script.write_text(JOB)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(where)]
    proc = subprocess.run(cmd, env=_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r: json.loads((where / f"rank-{r}.json").read_text()) for r in range(2)}


@pytest.mark.parametrize("name", CASES)
def test_reference_case_passes_on_both_ranks(torchrun_job: dict[int, dict[str, Any]], name: str) -> None:
    for rank, results in torchrun_job.items():
        assert results[name] == "ok", f"rank {rank}: {results[name]}"


def test_ranks_come_from_torchrun(torchrun_job: dict[int, dict[str, Any]]) -> None:
    assert [(r["rank"], r["size"], r["local_rank"]) for r in torchrun_job.values()] == [(0, 2, 0), (1, 2, 1)]


DYING = textwrap.dedent(r'''
    import json, os, sys, time
    import torch
    import pskv

    kv = pskv.create("horovod")
    t = torch.ones(1000)
    kv.pushpull("w", t)  # both ranks are in the group
    if kv.rank == 1:
        os._exit(7)  # dies without a word
    began = time.monotonic()
    try:
        kv.pushpull("w", t)
        outcome = {"error": None}
    except Exception as exc:
        outcome = {"error": type(exc).__name__, "node": getattr(exc, "node", None), "message": str(exc)}
    outcome["seconds"] = time.monotonic() - began
    try:  # the group stays failed: the next call raises the same error at once
        kv.pushpull("w", t)
    except Exception as exc:
        outcome["again"] = type(exc).__name__
    with open(sys.argv[1], "w") as f:
        json.dump(outcome, f)
''')


def test_a_rank_that_dies_fails_the_other_naming_it(tmp_path: Path) -> None:
    """Rank 1 exits between two pushpulls: rank 0 gets NodeFailedError('rank 1') well within its timeout."""
    script, report = tmp_path / "dying.py", tmp_path / "outcome.json"
    script.write_text(DYING)
    # the rendezvous store is this test's, on a port the system chose (rank 0 joins it as torchrun's ranks do)
    store = torch.distributed.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    timeout = 8  # the roll call after the failure waits a quarter of it for rank 1's answer
    procs = [subprocess.Popen([sys.executable, str(script), str(report)],
                              env=_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                                       PSKV_DEFAULT_TIMEOUT=str(timeout)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    began = time.monotonic()
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 7], outs
    outcome = json.loads(report.read_text())
    assert outcome["error"] == "NodeFailedError" and outcome["node"] == "rank 1", outcome
    assert "pushpull#2" in outcome["message"] and "failed on rank 0" in outcome["message"], outcome
    assert "rank 1 did not answer the roll call" in outcome["message"], outcome
    assert outcome["seconds"] < timeout, outcome
    assert outcome["again"] == "NodeFailedError", outcome
    assert time.monotonic() - began < 90


LAUNCHED = textwrap.dedent(r'''
    import numpy as np
    import pskv

    kv = pskv.create("horovod")
    g = np.full(3, kv.rank + 1.0, np.float32)
    kv.pushpull("g", g)
    w = np.full(2, float(kv.rank), np.float32)
    kv.broadcast("w", w, root_rank=1)
    print(f"final {kv.rank} size {kv.num_workers} local {kv.local_rank} sum {g.tolist()} root1 {w.tolist()}")
    kv.close()
''')


def test_started_by_pskv_launch(tmp_path: Path) -> None:
    """pskv launch gives each worker its rank and a rendezvous (MASTER_ADDR/PORT): the store needs nothing else."""
    code, out = launch_job(tmp_path, LAUNCHED, [], ["-s", "0"], deadline=90)
    assert code == 0, out
    assert finals(out) == {r: f"size 2 local {r} sum [3.0, 3.0, 3.0] root1 [1.0, 1.0]" for r in range(2)}, out


ON_GPUS = textwrap.dedent(r'''
    import numpy as np
    import torch
    import pskv

    for name in ("nccl", "horovod"):  # horovod: CUDA values through its NCCL group
        with pskv.create(name) as kv:
            dev = torch.device("cuda", kv.local_rank)
            g = torch.full((1000,), kv.rank + 1.0, device=dev)
            kv.pushpull("g", g)
            w = torch.full((3, 3), float(kv.rank), device=dev)
            kv.broadcast("w", w, root_rank=1)
            c = np.full(4, kv.rank + 1.0, np.float32)  # nccl: a CPU value staged on the GPU; horovod: Gloo
            kv.pushpull("c", c)
            assert bool((g == 3).all()) and bool((w == 1).all()) and (c == 3).all(), (name, g, w, c)
            print(f"final {kv.rank} {name} ok")
''')


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_nccl_store_on_two_gpus(tmp_path: Path) -> None:
    script = tmp_path / "gpus.py"
    script.write_text(ON_GPUS)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], env=_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 4, proc.stdout
