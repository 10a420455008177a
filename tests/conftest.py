"""Shared fixtures: stores that are always closed, and array factories per backend."""

from __future__ import annotations

import compileall
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pskv

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    torch = None

BACKENDS = ["numpy", "torch"] if torch is not None else ["numpy"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config: pytest.Config) -> None:
    """Compile pskv and the examples once, before the test workers start.

    The launched tests start hundreds of Python processes that import pskv from this checkout. Where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's machines) none of them writes what it compiled,
    so each would compile pskv's ~140 modules again: 0.3 s of CPU per process, a tenth of the suite's CPU.
    """
    if not hasattr(config, "workerinput"):  # the controlling process, not an xdist worker
        for folder in ("pskv", "examples"):
            compileall.compile_dir(os.path.join(ROOT, folder), quiet=1)


@pytest.fixture
def make_store() -> Iterator[Callable[..., pskv.KVStoreBase]]:
    """Factory for stores; every store it made is closed after the test."""
    made: list[pskv.KVStoreBase] = []

    def make(name: str = "local", **settings: Any) -> pskv.KVStoreBase:
        kv = pskv.create(name, **settings)
        made.append(kv)
        return kv

    yield make
    for kv in made:
        kv.close()


@pytest.fixture(params=["local", "device"])
def kv(request: pytest.FixtureRequest, make_store: Callable[..., pskv.KVStoreBase]) -> pskv.KVStoreBase:
    """A 'local' and a 'device' store."""
    return make_store(request.param)


class Arrays:
    """Creates arrays of one backend ('numpy' or 'torch') and reads them back as NumPy."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def full(self, shape: tuple[int, ...], value: float, dtype: str = "float32") -> Any:
        if self.backend == "numpy":
            return np.full(shape, value, dtype=dtype)
        return torch.full(shape, value, dtype=getattr(torch, dtype))

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return self.full(shape, 0.0, dtype)

    def ones(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return self.full(shape, 1.0, dtype)

    def rand(self, shape: tuple[int, ...], seed: int = 0, dtype: str = "float32") -> Any:
        return self.from_np(np.random.default_rng(seed).standard_normal(shape).astype(dtype))

    def from_np(self, a: np.ndarray) -> Any:
        """``a`` as this backend's array (shares memory for torch)."""
        return a if self.backend == "numpy" else torch.from_numpy(a)

    @staticmethod
    def np(x: Any) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.detach().cpu().numpy()


@pytest.fixture(params=BACKENDS)
def arr(request: pytest.FixtureRequest) -> Arrays:
    """Array factory, once per available backend."""
    return Arrays(request.param)


def cuda_available() -> bool:
    return torch is not None and torch.cuda.is_available()


# -- markers ------------------------------------------------------------------------------
# Test modules that start real processes (scheduler, servers, workers, the launcher, a
# training script): marked `multiprocess`. They, and the minute-long example trainings,
# are also `slow`: `pytest -m "not slow"` is the inner loop (under a minute on 2 cores);
# CI runs everything.
MULTIPROCESS_MODULES = frozenset({
    "tests/fault/test_cluster_env.py",
    "tests/fault/test_elastic_launch.py",
    "tests/fault/test_compression_restart.py",
    "tests/fault/test_network.py",
    "tests/fault/test_restart.py",
    "tests/fault/test_server_recovery.py",
    "tests/fault/test_sparse_recovery.py",
    "tests/fault/test_worker_recovery.py",
    "tests/hosts/test_simulated_hosts.py",
    "tests/integration/test_big_table.py",
    "tests/integration/test_cluster_launchers.py",
    "tests/integration/test_departures.py",
    "tests/integration/test_dist_processes.py",
    "tests/integration/test_horovod.py",
    "tests/integration/test_launcher.py",
    "tests/integration/test_launch_logs.py",
    "tests/integration/test_security.py",
    "tests/integration/test_mxnet_dist_compression.py",
    "tests/integration/test_mxnet_dist_sparse.py",
    "tests/integration/test_real_slurm.py",  # a real slurmctld/slurmd (fixed ports: its tests run one by one)
    "tests/integration/test_timeline.py",
    "tests/integration/test_top.py",
    "tests/unit/test_doc_blocks.py",  # runs every code block of the docs (pskv launch jobs among them)
    "tests/unit/test_example.py",
    "tests/parallel/test_example_digits.py",
    "tests/parallel/test_embedding_launched.py",
    "tests/parallel/test_embedding_checkpoint_launched.py",
    "tests/torch/test_api.py",
    "tests/torch/test_byteps.py",
    "tests/torch/test_cross_barrier.py",
    "tests/torch/test_ddp.py",
    "tests/torch/test_elastic_examples.py",
    "tests/torch/test_elastic_torch.py",  # pskv launch -n 1:4: a worker killed, one joining
    "tests/torch/test_optimizer.py",
    "tests/torch/test_peer_examples.py",
    "tests/torch/test_server_update.py",
    "tests/torch/test_sparse.py",
})
SLOW_MODULES = MULTIPROCESS_MODULES | frozenset({
    "tests/fault/test_fuzz_server.py",  # in-process clusters, but seconds per test
    "tests/fault/test_hostile_peers.py",  # in-process clusters under hostile peers, seconds per test
    "tests/fault/test_load.py",
    "tests/integration/test_checkpoint.py",  # restarts whole in-process clusters
    "tests/transport/test_memory.py",  # a fresh interpreter per malloc setting (importing pskv: seconds)
    "tests/unit/test_torch_missing.py",  # a fresh interpreter that imports pskv without torch
})
# Single slow tests (over ~1 s: launched jobs, big arrays, fuzzing, waits for a timeout) in modules
# that are otherwise fast: module -> test function names (every parametrization) or test ids (one).
SLOW_TESTS = {
    "tests/contracts/test_store_contracts.py": {"test_random_operations_match_a_dict_model[dist_sync-2s2w]",
                                                "test_random_operations_match_a_dict_model[dist_sync-loopback-2s]"},
    "tests/integration/test_collectives.py": {
        "test_a_rank0_only_collective_while_the_others_push_names_who_did_not_come"},
    "tests/integration/test_compression_dist.py": {"test_a_launched_job_compresses_between_hosts",
                                                   "test_the_digits_example_trains_with_2bit_compression_to_its_accuracy_bar"},
    "tests/integration/test_data_channel.py": {"test_a_launched_job_without_shared_memory_uses_data_connections"},
    "tests/integration/test_elastic_fit.py": {
        "test_through_pskv_launch_a_worker_killed_mid_fit_leaves_and_an_added_one_joins_with_the_replayed_weights"},
    "tests/integration/test_sealed_channel.py": {"test_a_launched_secure_job_without_shared_memory_seals_data_connections"},
    "tests/integration/test_dist_inprocess.py": {"test_a_stalled_round_is_reported_with_the_missing_workers",
                                                 "test_big_arrays_are_split_over_servers_and_reassembled"},
    "tests/integration/test_sparse_dist.py": {"test_a_big_table_is_drawn_while_the_server_keeps_sending_heartbeats"},
    "tests/server/test_state_files.py": {"test_a_relative_state_file_works_through_pskv_launch_and_escapes_are_refused"},
    "tests/transport/test_reactor.py": {"test_a_message_of_more_frames_than_allowed_is_discarded_unbuilt"},
    "tests/transport/test_stream.py": {"test_a_message_split_across_many_small_writes_is_put_together"},
    "tests/unit/test_bench_report.py": {"test_the_committed_texts_are_what_the_results_give"},
    "tests/unit/test_compression.py": {"test_mxnets_compressed_store_test_passes"},
    "tests/unit/test_compression_torch.py": {"test_dithering_on_tensors_is_unbiased_and_within_a_step"},
    "tests/unit/test_metrics.py": {"test_top_usage_errors_are_one_line",
                                   "test_a_round_waiting_for_a_slow_worker_is_a_stall_naming_it"},
    "tests/unit/test_optimizer_states.py": {"test_set_optimizer_keeps_state_and_counts"},
    "tests/unit/test_protocol.py": {"test_mutated_valid_messages_are_decoded_or_rejected",
                                    "test_random_frames_never_escape_as_other_errors"},
    "tests/unit/test_security.py": {"test_zap_admits_only_the_cluster_key_and_logs_refusals"},
    "tests/unit/test_sparse.py": {"test_rsp_push_pull_large_rowid"},
    "tests/unit/test_timeline.py": {"test_a_process_killed_while_writing_leaves_a_valid_file",
                                    "test_a_forked_child_writes_nothing_into_its_parents_file"},
}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores (at most 4, ``--maxprocesses``). The suite's
    multi-process tests spend much of their time waiting on their children (launches,
    rendezvous, failure detection), so a core per worker leaves the machine half idle."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of the modules and the single tests above (one list, so nobody forgets a marker)."""
    root = config.rootpath
    for item in items:
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if module in MULTIPROCESS_MODULES:
            item.add_marker(pytest.mark.multiprocess)
        slow_here = SLOW_TESTS.get(module, ())
        if module in SLOW_MODULES or item.name in slow_here or getattr(item, "originalname", "") in slow_here:
            item.add_marker(pytest.mark.slow)
