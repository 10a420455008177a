"""``pskv.torch`` in one process without a launcher (a job of one on the all-reduce store): the API's
rules that need no second rank — init and its errors, ops and their arguments, handles, autograd,
compression, the helpers, what is not offered. The 2-rank semantics are tests/torch/test_api.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
import pskv.torch as hvd  # noqa: E402
from pskv.torch import runtime  # noqa: E402


@pytest.fixture
def one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``hvd.init()`` in this process with no launcher's variables: the all-reduce store, a job of one."""
    for var in ("PSKV_TORCH_STORE", "DMLC_NUM_SERVER", "DMLC_ROLE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "DMLC_WORKER_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    hvd.init()
    yield
    hvd.shutdown()


def test_calls_before_init_name_init() -> None:
    assert not hvd.is_initialized()
    for call in (hvd.size, hvd.rank, lambda: hvd.allreduce(torch.ones(1))):
        with pytest.raises(ValueError, match=r"pskv.torch has not been initialized; use pskv.torch.init\(\)"):
            call()


def test_init_opens_the_allreduce_store_of_one_and_is_idempotent(one: None) -> None:
    store = hvd.store()
    hvd.init()
    assert hvd.store() is store and store.type == "horovod"
    assert (hvd.size(), hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_size(), hvd.cross_rank()) == \
        (1, 0, 0, 1, 1, 0)
    assert hvd.gloo_enabled() and hvd.gloo_built() and hvd.is_homogeneous()  # the build questions scripts ask
    assert not (hvd.mpi_built() or hvd.mpi_enabled() or hvd.mpi_threads_supported() or hvd.rocm_built())
    assert hvd.nccl_built() == hvd.cuda_built() == torch.cuda.is_available()
    hvd.shutdown()
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(pskv.StoreClosedError):  # the store init opened is closed
        store.pushpull("k", torch.ones(1))
    hvd.init()  # Horovod's re-init: a new all-reduce store
    assert hvd.store() is not store and torch.equal(hvd.allreduce(torch.ones(1)), torch.ones(1))


def test_the_store_is_chosen_by_argument_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.STORE_ENV, "dist_async")
    with pytest.raises(pskv.NotSupportedError, match="synchronous store"):
        hvd.init()
    with pytest.raises(pskv.NotSupportedError, match="store of the job's processes"):
        hvd.init("local")
    with pytest.raises(pskv.InvalidArgumentError):
        hvd.init(3)  # type: ignore[arg-type]
    assert not hvd.is_initialized()
    with pskv.create("horovod") as mine:  # a store the caller made: used, and left open by shutdown
        hvd.init(mine)
        assert hvd.store() is mine
        hvd.shutdown()
        mine.pushpull("k", torch.ones(1))


def test_allreduce_ops_and_scales(one: None) -> None:
    t = torch.tensor([3.0, -5.0])
    assert torch.equal(hvd.allreduce(t), t) and torch.equal(hvd.allreduce(t, op=hvd.Sum, name="s"), t)
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), t)
    ints = torch.tensor([5, -5], dtype=torch.int64)
    assert hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.5).tolist() == [2, -2]  # float64, toward zero
    assert hvd.allreduce_(ints, op=hvd.Sum, postscale_factor=0.3) is ints and ints.tolist() == [1, -1]
    with pytest.warns(DeprecationWarning, match="`average` has been replaced with `op`"):
        assert torch.equal(hvd.allreduce(t, average=False), t)
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(t, average=True, op=hvd.Sum)
    for op in (hvd.Adasum, hvd.Min, hvd.Max, hvd.Product):
        with pytest.raises(pskv.NotSupportedError, match=rf"allreduce\(op={op.name}\)"):
            hvd.allreduce(t, op=op)
    with pytest.raises(pskv.InvalidArgumentError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())


def test_handles_poll_and_synchronize(one: None) -> None:
    t = torch.ones(3)
    handle = hvd.allreduce_async_(t, op=hvd.Sum, name="h")
    assert isinstance(handle, int)
    assert hvd.synchronize(handle) is t
    assert hvd.synchronize(handle) is None  # Horovod: an unknown handle gives None
    with pytest.raises(pskv.InvalidArgumentError, match="not the handle"):
        hvd.poll(handle)
    grouped = hvd.grouped_allreduce_async([torch.ones(2), torch.zeros(3, dtype=torch.int32)])
    while not hvd.poll(grouped):
        pass
    assert [x.tolist() for x in hvd.synchronize(grouped)] == [[1.0, 1.0], [0, 0, 0]]
    out = hvd.synchronize(hvd.allreduce_async(t))
    assert out is not t and torch.equal(out, t)
    assert hvd.synchronize(hvd.broadcast_async(t, 0)) is not t
    assert hvd.synchronize(hvd.broadcast_async_(t, 0)) is t
    assert hvd.broadcast_(t, 0) is t and torch.equal(hvd.broadcast(t, 0), t)
    assert hvd.join() == -1


def test_byteps_names(one: None) -> None:
    t = torch.tensor([2.0, 4.0])
    assert torch.equal(hvd.push_pull(t, average=False, name="b", version=0, priority=-3), t)  # no DeprecationWarning
    handle = hvd.push_pull_async(t, True, "c")
    assert hvd.synchronize(handle) is not t
    assert hvd.synchronize(hvd.push_pull_async_inplace(t, priority=-1)) is t
    assert hvd.push_pull_inplace(t) is t and torch.equal(t, torch.tensor([2.0, 4.0]))
    assert hvd.declare("d") == 0 and hvd.declare(["e", "f"], [torch.ones(1), torch.ones(2)]) == 0


def test_allreduce_and_broadcast_are_differentiable(one: None) -> None:
    x = torch.ones(3, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * 2).sum().backward()
    assert x.grad.tolist() == [2.0] * 3
    y = torch.ones(2, requires_grad=True)
    hvd.broadcast(y, 0).sum().backward()
    assert y.grad.tolist() == [1.0, 1.0]
    parts = [torch.ones(2, requires_grad=True), torch.ones(1, requires_grad=True)]
    sum(s.sum() for s in hvd.grouped_allreduce(parts, op=hvd.Sum)).backward()
    assert [p.grad.tolist() for p in parts] == [[1.0, 1.0], [1.0]]


def test_fp16_compression(one: None) -> None:
    t = torch.tensor([1.5, 2.0], dtype=torch.float64)
    sent, ctx = hvd.Compression.fp16.compress(t)
    assert sent.dtype == torch.float16 and hvd.Compression.fp16.decompress(sent, ctx).dtype == torch.float64
    ints = torch.ones(2, dtype=torch.int32)
    assert hvd.Compression.fp16.compress(ints)[0] is ints
    assert hvd.Compression.none.compress(t) == (t, None)
    assert torch.equal(hvd.allreduce(t, compression=hvd.Compression.fp16), t)


def test_helpers_in_a_job_of_one(one: None) -> None:
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)  # a generator is taken too
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(pskv.InvalidArgumentError, match="invalid params"):
        hvd.broadcast_parameters(3, root_rank=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # a new optimizer's state is made first
    assert len(optimizer.state_dict()["state"]) == 2 and all(p.grad is None for p in model.parameters())
    with pytest.raises(pskv.NotSupportedError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)
    assert hvd.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
    assert hvd.allgather_object(("x", 1)) == [("x", 1)]
    assert torch.equal(hvd.allgather(torch.arange(6).reshape(3, 2)), torch.arange(6).reshape(3, 2))


@pytest.mark.parametrize("name", ["alltoall", "reducescatter", "grouped_reducescatter", "grouped_allgather",
                                  "allgather_async", "add_process_set"])
def test_not_offered_calls_name_themselves(name: str) -> None:
    with pytest.raises(pskv.NotSupportedError, match=rf"pskv.torch.{name} is not offered"):
        getattr(hvd, name)(torch.ones(1))


def test_the_allreduce_store_s_timeouts_name_the_callers_keys() -> None:
    """Every call holds the store's one engine key; a timeout and wait()'s listing name the call's keys."""
    import threading

    from pskv.kvstore.horovod import AllreduceStore

    with pskv.create("horovod") as kv:
        assert isinstance(kv, AllreduceStore)
        gate = threading.Event()
        kv._submit("hold", ["other"], 0, lambda: gate.wait(30), False, None)  # a call the next ones queue behind
        try:
            with pytest.raises(pskv.OperationTimeoutError, match=r"^pushpull on key\(s\) \['weight'\] did not finish"):
                kv.pushpull("weight", torch.ones(3), timeout=0.1)
            kv.pushpull("bias", torch.ones(3), block=False)
            with pytest.raises(pskv.OperationTimeoutError, match=r"<OpHandle pushpull keys=\['bias'\] priority=0"):
                kv.wait(timeout=0.1)
        finally:
            gate.set()
        kv.wait()
