"""``pskv.torch.CrossBarrier`` on 2 ranks under ``pskv launch -n 2 -s 1`` (pskv/torch/cross_barrier.py).

One job runs every case (one JSON per rank): several steps with the cross-barrier give the same
parameters, bit for bit, as the server-side optimizer without it (for a torch SGD with momentum,
a BytePS-style ``DistributedOptimizer`` handed over, and Adam); the overlap is wired: ``step()``
returns with updates still on the way and the next forward's pre-hooks wait for them (neither
happens without the cross-barrier); ``num_steps`` makes the last step wait; arguments checked.
"""

from __future__ import annotations

import pytest

from tests.torch.launched import Outcomes, assert_case, shared_jobs

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)



CASES = ["byteps_distributed_optimizer_handed_over_bit_for_bit", "sgd_same_parameters_bit_for_bit",
         "adam_same_parameters_bit_for_bit", "forward_waits_for_the_updates", "num_steps_makes_the_last_step_wait",
         "arguments_are_checked"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    """job_cross_barrier.py under ``pskv launch -n 2 -s 1`` (in the shared job); each rank's outcomes."""
    return shared_jobs(tmp_path_factory)["dist_sync"]["cross_barrier"]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_with_the_same_parameters(job: Outcomes) -> None:
    first, second = job[0]["params"], job[1]["params"]
    assert {"sgd", "byteps", "adam"} <= set(first)
    assert first == second


def test_pskvs_own_compression_trains_like_its_reference(job: Outcomes) -> None:
    """``CrossBarrier(..., compression=Compression.twobit(...))`` and ``update_on_kvstore=True`` with it: the
    same parameters, pskv.compression's values, on both ranks."""
    assert_case(job, "pskv_compression_matches_its_reference")
    assert job[0]["params"]["twobit"] == job[1]["params"]["twobit"]
