"""``pskv.torch.DistributedOptimizer`` on 2 ranks under ``pskv launch``: ``-s 1`` (dist_sync, a server
sums) and ``-s 0`` (the all-reduce store), the way a Horovod script runs (``import pskv.torch as hvd``).

One job per store kind runs every case once (both jobs at once, in a module fixture); each rank
writes its outcomes and its final parameters, and the tests read them: parameters identical on both ranks and equal (to
1e-5) to one process training on the combined batch.

Ported from the semantics (no code copied) of horovod/horovod ``test/parallel/test_torch.py``:
``test_gradient_clipping``, ``test_synchronize_step_warning``, ``test_duplicate_names``,
``test_missing_named_parameters``, ``test_no_named_parameters``,
``test_optimizer_no_named_parameters``, ``test_dynamic_requires_grad``, ``test_force_allreduce``
(every ``torch.optim`` optimizer but LBFGS, SparseAdam and Muon, which takes 2-D parameters only)
and ``test_sparse_embeddings`` (both of its ``sparse_as_dense`` settings; how the rows travel is
tested in tests/torch/test_sparse.py). Not ported: ``test_delta_optimizer`` (Adasum, refused here:
``adasum_is_refused``), ``test_optimizer_process_sets`` (no process sets),
``test_model_parallelism`` (GPUs) and ``test_async_sparse_allreduce`` (Horovod's
``sparse_allreduce_async`` is not offered; tests/torch/test_sparse.py covers sparse gradients).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.torch.launched import Outcomes, assert_case, shared_jobs

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)



CASES = ["sgd_momentum_matches_one_process", "adam_matches_one_process", "backward_passes_per_step_accumulates",
         "gradient_predivide_factor_gives_the_average", "fp16_compression_trains_alike", "op_sum_sums",
         "gradients_leave_during_backward", "too_many_backward_passes_raise", "horovod_gradient_clipping",
         "horovod_synchronize_step_warning", "zero_grad_before_step_is_refused", "horovod_duplicate_names",
         "horovod_missing_named_parameters", "horovod_no_named_parameters", "horovod_optimizer_no_named_parameters",
         "horovod_dynamic_requires_grad", "horovod_force_allreduce", "horovod_sparse_embeddings",
         "grad_scaler_unscales_after_synchronize", "it_is_the_optimizer", "wrapping_again_takes_the_parameters_over",
         "adasum_is_refused"]


STORES = {"dist_sync": 1, "allreduce": 0}  # store kind -> pskv launch -s


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcomes]:
    """job_optimizer.py under ``pskv launch -n 2 -s 1`` and ``-s 0`` (in the shared jobs); each store kind's ranks'
    outcomes."""
    shared = shared_jobs(tmp_path_factory)
    return {kind: shared[kind]["optimizer"] for kind in STORES}


@pytest.fixture(params=list(STORES))
def job(request: pytest.FixtureRequest, jobs: dict[str, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return jobs[request.param]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_with_the_same_parameters(job: dict[int, dict[str, Any]]) -> None:
    first, second = job[0]["params"], job[1]["params"]
    assert {"sgd", "adam", "passes", "predivide", "fp16", "sparse", "amp", "no_names", "force.SGD.4"} <= set(first)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], name


def test_both_ranks_name_the_parameters_alike(job: dict[int, dict[str, Any]]) -> None:
    assert job[0]["noname_names"] == job[1]["noname_names"] == [f"allreduce.noname.{i}.{j}" for i in (0, 1)
                                                                  for j in (0, 1)]
    assert [(r["rank"], r["size"]) for r in job.values()] == [(0, 2), (1, 2)]


def test_pskvs_own_compression_trains_like_its_reference_with_servers_and_is_refused_without(
        jobs: dict[str, Outcomes]) -> None:
    """``compression=Compression.twobit(...)``: the bucket keys travel 2-bit with residuals (pskv.compression's
    own values, identical parameters on both ranks); the all-reduce store refuses it by name."""
    for kind in STORES:
        assert_case(jobs[kind], "pskv_compression_matches_its_reference")
    dist = jobs["dist_sync"]
    assert dist[0]["params"]["twobit"] == dist[1]["params"]["twobit"]
    assert "twobit" not in jobs["allreduce"][0]["params"]
