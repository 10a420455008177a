"""``pskv.torch.DistributedDataParallel`` on 2 ranks under ``pskv launch -s 1`` (dist_sync) and ``-s 0``
(the all-reduce store), against ``torch.nn.parallel.DistributedDataParallel`` (Gloo) in the same job.

The job starts as a torch DDP script does (``init_process_group("gloo")``, no ``hvd.init()``).
Each scenario runs twice on every rank, once with torch's DDP and once with pskv's (the one line a
user changes), on the same start and the same data: the parameters (and buffers, and which
gradients are None) must agree to 1e-6, and the plain run must equal one process training on the
combined batch. Scenarios: plain training, ``no_sync`` accumulation, ``find_unused_parameters``
with a rank-dependent branch and a layer no rank uses, BatchNorm buffers broadcast from rank 0 at
each forward, sparse embedding gradients (sent dense, back sparse), and many small buckets made
ready out of order (layers registered in another order than they run). Both jobs (one per store
kind) run at once, in a module fixture.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.torch.launched import Outcomes, assert_case, shared_jobs

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)



CASES = ["the_store_is_the_launchers", "plain_training_equals_torch_ddp_and_one_process",
         "many_small_buckets_ready_out_of_order", "batch_norm_buffers_follow_rank_0", "no_sync_accumulates_locally",
         "find_unused_parameters_as_torch", "sparse_gradients_as_torch", "unused_without_the_flag_still_reduces",
         "the_torch_surface"]


STORES = {"dist_sync": 1, "allreduce": 0}  # store kind -> pskv launch -s


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcomes]:
    """job_ddp.py under ``pskv launch -n 2 -s 1`` and ``-s 0`` (in the shared jobs); each store kind's ranks' outcomes."""
    shared = shared_jobs(tmp_path_factory)
    return {kind: shared[kind]["ddp"] for kind in STORES}


@pytest.fixture(params=list(STORES))
def job(request: pytest.FixtureRequest, jobs: dict[str, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return jobs[request.param]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_alike(job: dict[int, dict[str, Any]]) -> None:
    assert job[0]["plain"] == job[1]["plain"]
    assert job[0]["buffers"] == job[1]["buffers"]
    assert [r["rank"] for r in job.values()] == [0, 1]


def test_each_job_ran_on_its_store(jobs: dict[str, dict[int, dict[str, Any]]]) -> None:
    assert [jobs[kind][r]["store"] for kind in STORES for r in range(2)] == ["dist_sync"] * 2 + ["horovod"] * 2


def test_pskvs_own_compression_trains_like_its_reference(jobs: dict[str, dict[int, dict[str, Any]]]) -> None:
    """``DistributedDataParallel(compression=Compression.twobit(...))``: with servers, pskv.compression's values
    and the same parameters on both ranks; the all-reduce store refuses it by name."""
    for kind in STORES:
        assert_case(jobs[kind], "pskv_compression_matches_its_reference")
    assert jobs["dist_sync"][0]["twobit"] == jobs["dist_sync"][1]["twobit"]
