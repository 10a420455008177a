"""``import pskv.torch as hvd`` on 2 ranks under ``pskv launch``: with a server (``-s 1``: ``dist_sync``)
and without (``-s 0``: the all-reduce store ``horovod``).

Each store runs the whole job once (tests/torch/job_api.py, in the shared jobs of tests/torch/launched.py); each test reads one
case's outcome on both ranks. Ported from the semantics (no code copied) of horovod/horovod
``test/parallel/test_torch.py``: ``test_horovod_reinit``, ``test_horovod_allreduce``, ``_average``, ``_inplace``,
``_async_fused``, ``_prescale``/``_postscale`` (one case), ``_error``, ``_type_error``, ``_grad``;
``test_horovod_grouped_allreduce`` (with ``_average``, ``_inplace``); ``test_horovod_broadcast``,
``_inplace``, ``_error``, ``_type_error``, ``_rank_error``, ``_grad``; ``test_horovod_allgather_variable_size``
and ``_type_error``; ``test_broadcast_object``, ``test_allgather_object``, ``test_broadcast_state``
(three optimizers), ``test_broadcast_state_options``, ``test_compression_fp16``,
``test_horovod_join_allreduce`` (a rank joins first; on the server store the other's averages go on).

Differences: dtypes narrowed to pskv's (int32, int64, float16, float32, float64), grids to 1 and 3
dims; names carry the dtype and dims where Horovod reuses one name for every shape (a key of the
servers keeps its dtype and size: ``test_name_reused_with_another_size_fails_on_every_rank``);
errors are pskv's (``InitMismatchError`` with servers, ``CollectiveMismatchError`` without), on
every rank within seconds. Beyond Horovod's: names that differ between ranks, a broadcast name
reused with another size, BytePS's names. Not ported: Min/Max/Product/Adasum, process sets,
alltoall, reducescatter, grouped allgather (refused: ``test_not_offered``), ``_duplicate_name_error``
(pskv runs two calls of one name in call order), CUDA cases, the DistributedOptimizer cases
(tests of pskv/torch/optimizer.py). The ``byteps`` store (``PSKV_TORCH_STORE=byteps``) passes the
same job; it is not run here, to keep the file short.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.torch.launched import shared_jobs

pytest.importorskip("torch")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]  # the first test waits for the shared jobs


CASES = ["test_horovod_rank_size", "test_horovod_reinit", "test_horovod_allreduce", "test_horovod_allreduce_average",
         "test_horovod_allreduce_inplace", "test_horovod_allreduce_async_fused",
         "test_horovod_allreduce_prescale_postscale", "test_horovod_grouped_allreduce", "test_horovod_allreduce_grad",
         "test_horovod_allreduce_error", "test_horovod_allreduce_type_error",
         "test_name_reused_with_another_shape_of_the_same_size",
         "test_names_that_differ_at_first_use_fail_on_every_rank",
         "test_name_reused_with_another_size_fails_on_every_rank", "test_not_offered", "test_horovod_broadcast",
         "test_horovod_broadcast_inplace", "test_horovod_broadcast_grad", "test_horovod_broadcast_error",
         "test_horovod_broadcast_type_error", "test_horovod_broadcast_rank_error",
         "test_broadcast_name_reused_with_another_size_fails_on_every_rank",
         "test_horovod_allgather_variable_size", "test_broadcast_object", "test_allgather_object",
         "test_broadcast_state", "test_broadcast_state_options", "test_compression_fp16", "test_byteps_names",
         "test_horovod_join_allreduce"]

# (store, error of a mismatch at a name's first use): the servers' init agreement, or the all-reduce store's
STORES = {"1": ("dist_sync", "InitMismatchError"), "0": ("horovod", "CollectiveMismatchError")}


@pytest.fixture(scope="module", params=sorted(STORES))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, Any]]:
    """job_api.py under ``pskv launch -n 2 -s S`` (in the shared jobs, tests/torch/launched.py): (S, each rank's
    outcomes)."""
    servers = request.param
    ranks = shared_jobs(tmp_path_factory)["dist_sync" if servers == "1" else "allreduce"]["api"]
    for rank, results in ranks.items():
        assert "__crashed__" not in results, f"rank {rank}'s script crashed:\n{results['__crashed__']}"
    return servers, ranks


@pytest.mark.parametrize("name", CASES)
def test_ported_case_passes_on_both_ranks(job: tuple[str, dict[int, Any]], name: str) -> None:
    _, ranks = job
    for rank, results in ranks.items():
        assert results[name] == "ok", f"rank {rank}: {results[name]}"


def test_the_launcher_chose_the_store(job: tuple[str, dict[int, Any]]) -> None:
    servers, ranks = job
    assert [r["store"] for r in ranks.values()] == [STORES[servers][0]] * 2


def test_mismatches_fail_on_every_rank_with_the_stores_error(job: tuple[str, dict[int, Any]]) -> None:
    servers, ranks = job
    error = STORES[servers][1]
    for case in ("allreduce_error", "allreduce_type_error", "broadcast_error", "broadcast_type_error",
                 "broadcast_rank_error"):
        assert [ranks[r][case] for r in range(2)] == [error, error], case
    assert [ranks[r]["allgather_type_error"] for r in range(2)] == ["InvalidArgumentError"] * 2
    names = "InvalidArgumentError" if servers == "1" else "CollectiveMismatchError"  # a checksum; the agreement
    assert [ranks[r]["name_error"] for r in range(2)] == [names] * 2


def test_a_name_reused_with_another_size_fails_on_every_rank(job: tuple[str, dict[int, Any]]) -> None:
    """Rank 1 reuses a name with 5 elements instead of 4: it is refused there, and the other rank's
    call fails too (the servers refuse the round; the all-reduce store's agreement). The name, and
    every case after it, works on (the job's own assertion)."""
    servers, ranks = job
    expected = ["RemoteError", "ShapeMismatchError"] if servers == "1" else ["CollectiveMismatchError"] * 2
    assert [ranks[r]["reuse_error"] for r in range(2)] == expected


def test_a_broadcast_name_reused_with_another_size_fails_on_every_rank(job: tuple[str, dict[int, Any]]) -> None:
    """The same for a broadcast: its meeting fails on every rank, and the name works on afterwards."""
    servers, ranks = job
    expected = ["CollectiveFailedError", "ShapeMismatchError"] if servers == "1" else ["CollectiveMismatchError"] * 2
    assert [ranks[r]["broadcast_reuse_error"] for r in range(2)] == expected
