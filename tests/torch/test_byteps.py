"""BytePS's PyTorch tests, ported: ``import pskv.torch as bps`` on 2 ranks under ``pskv launch -n 2 -s 1``
(``dist_sync``) and ``-s 0`` (the all-reduce store).

tests/torch/job_byteps.py runs once per store kind, in the shared jobs of tests/torch/launched.py;
each test reads one case's outcome on both ranks. Ported from the semantics (no code copied)
of bytedance/byteps. Its master branch has no PyTorch test (its ``tests/`` are MXNet's and
TensorFlow's); they are on its ``bccl-github`` branch (``tests/torch/``, ``tests/``), its
``Espresso`` branch (``byteps/torch/test_*.py``) and its ``add-sync-bn`` branch. Every case found:

Ported (case names are BytePS's test names):

* ``tests/torch/test_torch.py::test_byteps_push_pull`` (20 sums of ten names reused), with
  Espresso's ``byteps/torch/test_torch.py::test_byteps_push_pull`` (``byteps_push_pull``: in
  place, averaged) in the same case.
* ``tests/torch/test_torch_broadcast_object.py::test_broadcast_object``.
* ``tests/torch/test_torch_allgather.py``: ``test_byteps_allgather``,
  ``test_byteps_allgather_with_output``, ``test_byteps_mix_allgather_allreduce``,
  ``test_allgather_autograd``; bool and float32, 1 to 3 dims, ``same_shape`` True and False,
  2 iterations instead of 250. ``output`` is passed by keyword (pskv's second positional
  argument is Horovod's ``name``).
* ``tests/torch/test_pipeline.py``, ``test_pipeline_gradacc.py`` (``backward_passes_per_step=2``)
  and ``test_pipeline_ddp.py`` (on ``bps.DistributedDataParallel`` instead of torch's with NCCL):
  a linear regression whose weights and gradients match the closed-form model (utils.py's
  ``LinearRegression``) at every step, to 1e-5. Without BytePS's ``staleness=1`` (PipeSGD:
  not offered, pskv's optimizer is synchronous), so the reference uses no stale gradient; each
  rank's input is scaled by its rank, so only averaged gradients match (BytePS's ranks all see
  the same input).
* ``tests/test_torch_tensor_fusion.py``: a plain optimizer and ``DistributedOptimizer`` on the
  same data stay equal, bit for bit (SGD with momentum and weight decay, Adam, Adagrad, as its
  shell script runs them; 3 steps of LeNet-5 instead of 1000). BytePS's ``model=`` argument
  (its fusion's bucket probing) is not taken.
* ``tests/torch/test_torch_tensor_fusion_ddp.py``: DDP with ``bucket_cap_mb=0`` and with the
  default buckets stay equal, bit for bit, on ``bps.DistributedDataParallel`` (data differing
  between ranks, where BytePS's is the same).
* ``example/pytorch/benchmark_cross_barrier_byteps.py`` (master; it acts as a test of
  ``CrossBarrier``): its calls through ``import pskv.torch.cross_barrier`` on a small model;
  the ranks end equal on ``dist_sync``, and the all-reduce store refuses it naming
  ``update_on_kvstore=False`` (the servers run the optimizer).
* ``tests/torch/test_torch_p2p.py::test_send_recv``: point to point is not offered;
  ``send_async``, ``recv_async`` (and the elastic ``suspend``, ``resume`` of
  ``example/pytorch/elastic_benchmark_byteps.py``) raise ``NotSupportedError`` naming themselves.

Not ported:

* ``tests/torch/test_pipeline_apex.py``, ``test_pipeline_ckpt.py``: apex's amp, a GPU and
  PipeSGD's stale states (``prepare_stale_states``); the AMP path is tested with
  ``torch.cuda.amp.GradScaler`` in tests/torch/test_optimizer.py.
* ``tests/torch/test_fusion_pipeline.py``, ``test_fusion_pipeline_ddp.py``: BytePS's bucket
  probing (``BYTEPS_BUCKET_PROBE_STEPS``) and staleness, internals; otherwise as the
  ``test_pipeline*`` cases above.
* ``tests/torch/test_c10d_byteps.py`` (``test_c10d_all_reduce``, ``_allgather``,
  ``_allgather_autograd``, ``_barrier``, ``_reduce``): a ``torch.distributed`` backend; pskv
  offers none (torchrun jobs use Gloo under pskv's all-reduce store).
* ``tests/torch/test_sync_batch_norm.py::test_byteps_sync_batch_norm`` and ``add-sync-bn``'s
  ``tests/test_bps_torch_syncbn.py::test_horovod_sync_batch_norm``: ``SyncBatchNorm`` is not
  offered (and both need a GPU).
* ``tests/torch/test_torch_batched_ops.py`` (``batched_fuse_``, ``batched_unfuse_``,
  ``batched_zero_``), ``test_dc_op.py`` (``test_dc_cpu_fp32``, ``test_dc_gpu_fp32``,
  ``test_dc_gpu_fp16``), ``test_dc_adam.py`` (``test_dc_adam_fp32``, ``_fp16``): BytePS's
  fusion and delay-compensation kernels, internals (mostly CUDA).
* Espresso's ``byteps/torch/test_torch.py``: ``test_byteps_intra_gather``, ``_intra_broadcast``,
  ``_intra_reducescatter``, ``_intra_allgather``, ``_intra_alltoall``, ``_intra_reduce``,
  ``_inter_compress``, ``_cpu_compress``, ``_goodput``, and ``test_ddp_*``; its
  ``byteps/torch/test_ddp.py`` (``test_intra_*``, ``test_inter_*``, ``test_allreduce``,
  ``test_global_allgather``, ``test_ddp_goodput``); ``example/pytorch/test_bytecomp_pytorch.py``;
  ``byteps/torch/examples/test_compressor_cpu.py``: that research branch's intra-/inter-node
  collectives and its mergeComp compressors, internals without assertions.
* master's ``example/pytorch/benchmark_byteps.py`` and ``train_mnist_byteps.py``: in
  tests/torch/test_peer_examples.py. ``benchmark_byteps_ddp.py``: imports
  ``byteps.torch.parallel`` (pskv's DDP is ``pskv.torch.DistributedDataParallel``);
  ``elastic_benchmark_byteps.py``: suspend/resume (above); ``train_imagenet_*``: ImageNet and
  torchvision; ``mnist-distributed.py``: torch.distributed only.
* master's and the branches' ``tests/test_mxnet.py``, ``test_onebit.py``, ``test_topk.py``,
  ``test_randomk.py``, ``test_dithering.py`` (MXNet) and ``tests/tensorflow/*``,
  ``test_tensorflow_keras.py``: not PyTorch.

Fixed in pskv.torch for these cases: ``init(lazy=False)`` is accepted; ``byteps_push_pull``
exists; ``allgather`` is differentiable (the output's gradient averaged, at this rank's rows,
as BytePS's and Horovod's) and takes BytePS's ``output=`` and ``same_shape=``;
``pskv.torch.cross_barrier`` re-exports what BytePS's module does and ``CrossBarrier`` takes its
``named_parameters=``, ``compression=`` and ``backward_passes_per_step=``; ``send_async``,
``recv_async``, ``suspend`` and ``resume`` raise ``NotSupportedError``.
"""

from __future__ import annotations

import pytest

from tests.torch.launched import Outcomes, assert_case, shared_jobs

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)

STORES = {"dist_sync": 1, "allreduce": 0}  # store kind -> pskv launch -s

CASES = ["test_byteps_push_pull", "test_broadcast_object", "test_byteps_allgather", "test_byteps_allgather_with_output",
         "test_byteps_mix_allgather_allreduce", "test_allgather_autograd", "test_pipeline", "test_pipeline_gradacc",
         "test_pipeline_ddp", "test_torch_tensor_fusion", "test_torch_tensor_fusion_ddp",
         "benchmark_cross_barrier_byteps", "test_send_recv"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcomes]:
    """job_byteps.py under ``pskv launch -n 2 -s 1`` and ``-s 0`` (in the shared jobs); each store kind's ranks'
    outcomes."""
    shared = shared_jobs(tmp_path_factory)
    return {kind: shared[kind]["byteps"] for kind in STORES}


@pytest.fixture(params=list(STORES))
def job(request: pytest.FixtureRequest, jobs: dict[str, Outcomes]) -> Outcomes:
    return jobs[request.param]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_every_case_of_the_job_is_asserted(jobs: dict[str, Outcomes]) -> None:
    ran = {k for k, v in jobs["dist_sync"][0].items() if k.startswith(("test_", "benchmark_"))}
    assert ran == set(CASES)


def test_each_store_ran_the_cross_barrier_example_or_refused_it(jobs: dict[str, Outcomes]) -> None:
    """The servers run CrossBarrier's optimizer; the all-reduce store has none to run it."""
    for kind, store, outcome in (("dist_sync", "dist_sync", "ran"), ("allreduce", "horovod", "refused")):
        assert [(r["store"], r["cross_barrier_store"]) for r in jobs[kind].values()] == [(store, outcome)] * 2
