"""Sparse gradients of ``pskv.torch.DistributedOptimizer`` travel as rows (pskv/torch/sparse.py), on 2 ranks.

tests/torch/job_sparse.py runs under ``pskv launch -n 2 -s 1`` (the servers' row-sparse keys) and
``-s 0`` (rows gathered on the all-reduce store), in the shared jobs of tests/torch/launched.py: ranks
touching different and overlapping rows get the union of the rows back, sparse, equal to a dense
all-reduce; the first step already sends rows, not the table (what its buckets carry, and through
the servers the bytes sent); an embedding trained 5 steps with SGD and with SparseAdam equals one process on the
combined batch; ``sparse_as_dense=True`` still travels dense; a row id out of range fails on both
ranks, and the next step works; a bfloat16 gradient stays dense where the servers keep the rows.
"""

from __future__ import annotations

import pytest

from tests.torch.launched import Outcomes, assert_case, shared_jobs

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)

STORES = {"dist_sync": 1, "allreduce": 0}  # store kind -> pskv launch -s
CASES = ["rows_touched_differ_and_overlap", "the_first_step_sends_rows_not_the_table", "sgd_five_steps_match_one_process",
         "sparse_adam_five_steps_match_one_process", "sparse_as_dense_still_dense",
         "bfloat16_rows_travel_dense_where_the_servers_keep_rows", "row_id_out_of_range_fails_on_both_ranks"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcomes]:
    """job_sparse.py under ``pskv launch -n 2 -s 1`` and ``-s 0`` (in the shared jobs); each store kind's outcomes."""
    shared = shared_jobs(tmp_path_factory)
    return {kind: shared[kind]["sparse"] for kind in STORES}


@pytest.fixture(params=list(STORES))
def job(request: pytest.FixtureRequest, jobs: dict[str, Outcomes]) -> Outcomes:
    return jobs[request.param]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_with_the_same_parameters(job: Outcomes) -> None:
    first, second = job[0]["params"], job[1]["params"]
    assert set(first) == {"rows", "sgd", "sparse_adam", "as_dense", "after_error"}
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], name


def test_the_modules_making_sparse_gradients_are_found_and_the_watch_ends_with_their_forward() -> None:
    """torch DDP's rule (``sparse=True`` embeddings), and the optimizer's forward watch: its global hooks
    go once a forward that used its parameters has ended (later forwards of any module pay nothing)."""
    import torch
    from torch import nn

    from pskv.torch.sparse import _SparseForwards, sparse_parameters

    model = nn.Sequential(nn.Embedding(5, 2, sparse=True), nn.Linear(2, 1), nn.EmbeddingBag(4, 2))
    assert sparse_parameters(model) == {model[0].weight}
    watch = _SparseForwards(list(model.parameters()))
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    nn.ReLU()(torch.ones(1))  # a module without the parameters: still watching
    assert not watch.found and watch._hooks[0].id in hooks
    model[:2](torch.tensor([1, 2]))
    assert watch.found == {model[0].weight} and watch._hooks[0].id not in hooks
