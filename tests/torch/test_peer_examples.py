"""Programs nobody here wrote run on pskv with their import line changed (issue 22).

Horovod's ``pytorch_mnist.py`` and ``pytorch_synthetic_benchmark.py`` and BytePS's
``benchmark_byteps.py`` and ``train_mnist_byteps.py`` are in ``examples/torch/`` with
``import pskv.torch as hvd`` (or ``as bps``) for the peer's import, torchvision's data and models
replaced by small synthetic stand-ins (torchvision is not installed), and nothing else changed
(each file's header lists its changed lines; :func:`test_each_example_lists_exactly_its_changed_lines`
keeps the lists true).

Each runs on 2 workers under ``pskv launch -n 2 -s 2`` (``hvd.init()`` opens ``dist_sync``: the
servers sum) and under torchrun (``horovod``, the all-reduce store), through
``examples/torch/checked_run.py``, which runs the program unchanged and then writes each rank's
store, printed losses and final parameters. The bars:

* the program ends with exit code 0, on the launcher's store, and both ranks hold bit-identical
  parameters, which changed after the first optimizer step (the ranks trained on different
  data, so only averaged gradients keep them equal);
* the MNIST trainers print, at every step of their epoch, a loss whose mean over the two
  ranks equals the loss one process prints on the combined batch (``--batch-size`` twice as
  large, ``--lr`` times 2 since the programs scale it by ``size()``) to 1e-5, and end with
  its parameters to 1e-5. For this comparison every run, the one-process run included, has
  dropout switched off by the driver (``--no-dropout``): each process draws its own masks,
  so with dropout the runs differ by design. The printed losses have 6 decimals.

All jobs start together at the first test, a few at a time, so the module's wall time is
about that of its slowest few jobs (each takes a few seconds of CPU); the two one-process
references run one after the other in one process (one interpreter start, one torch import).
docs/from-horovod.md's "Run one" block is this module's ``pskv launch`` run of
``pytorch_synthetic_benchmark.py`` (tests/unit/test_doc_blocks.py skips it; a test here checks it is). The last tests check, in
this process, that what docs/from-horovod.md lists as not offered raises ``NotSupportedError``
naming the call.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pskv.testing.jobs import ProcessGroup, child_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "torch"
DRIVER = EXAMPLES / "checked_run.py"
DEADLINE = 100.0  # seconds for one job (a few seconds each on an idle machine)
AT_ONCE = 3  # jobs running at a time

MNIST = ["--no-cuda", "--epochs", "1", "--test-batch-size", "64", "--log-interval", "1"]
BENCH = ["--no-cuda", "--model", "small_cnn", "--batch-size", "2", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "2", "--num-iters", "2"]
BATCH, LR = 16, 0.01  # each MNIST worker's batch and the programs' default learning rate
PROGRAMS = {  # example -> its arguments (small sizes through its own flags)
    "pytorch_mnist.py": [*MNIST, "--batch-size", str(BATCH)],
    "train_mnist_byteps.py": [*MNIST, "--batch-size", str(BATCH)],
    "pytorch_synthetic_benchmark.py": BENCH,
    "benchmark_byteps.py": BENCH,
}
TRAINERS = ["pytorch_mnist.py", "train_mnist_byteps.py"]
STORES = {"pskv launch": "dist_sync", "torchrun": "horovod", "one process": "horovod"}  # what hvd.init() opens
LAUNCHERS = {  # name -> the command before the driver's file (torchrun takes a script, not a command)
    "pskv launch": [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2",
                    "--timeout", str(int(DEADLINE)), "--", sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
}
REFERENCE = [*MNIST, "--batch-size", str(2 * BATCH), "--lr", str(2 * LR)]  # one process on the combined batch
# the driver for each job given (its arguments joined by \x1f), one after the other in this one process; no
# launcher: pskv.torch.init() opens a job of one process (idempotent: the second program reuses it)
IN_TURN = ("import runpy, sys\n"
           "driver, *jobs = sys.argv[1:]\n"
           "for job in jobs:\n"
           "    sys.argv = [driver, *job.split('\\x1f')]\n"
           "    runpy.run_path(driver, run_name='__main__')\n")


def environment(home: Path) -> dict[str, str]:
    """This process's environment without a launcher's variables; HOME for Horovod's ``~/.horovod_lock``."""
    env = {k: v for k, v in child_env().items()
           if not k.startswith(("DMLC_", "PSKV_", "PS_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "GROUP_",
                                "ROLE_", "TORCHELASTIC_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(HOME=str(home), OMP_NUM_THREADS="1", PSKV_DEFAULT_TIMEOUT="30", PYTHONUNBUFFERED="1")
    return env


def run_command(where: Path, name: str, argv: list[str]) -> tuple[int | None, str]:
    """``argv`` in ``where``; its exit code (None: past the deadline, killed) and output."""
    with ProcessGroup(name) as group:
        proc = group.start(name, argv, environment(where), cwd=where)
        code = proc.wait(DEADLINE)
        if code is None:
            proc.kill_tree()
            proc.wait(10)
        return code, proc.output()


def reports_in(out: Path) -> dict[int, dict[str, Any]]:
    """The driver's report of each rank, by rank, with its parameters (``values``)."""
    reports = {}
    for path in sorted(out.glob("rank-*.json")):
        report = json.loads(path.read_text())
        report["values"] = np.load(path.with_suffix(".npy"))
        reports[report["rank"]] = report
    return reports


def run_job(where: Path, launcher: str, example: str, args: list[str], no_dropout: bool) -> dict[str, Any]:
    """One job: ``example`` under ``launcher`` through the driver; its exit code, output and ranks' reports."""
    where.mkdir(parents=True)
    driver = [str(DRIVER), str(where / "out"), *(["--no-dropout"] if no_dropout else []), "--"]
    code, out = run_command(where, f"{example} under {launcher}",
                            [*LAUNCHERS[launcher], *driver, str(EXAMPLES / example), *args])
    return {"code": code, "output": out, "ranks": reports_in(where / "out")}


def run_references(where: Path) -> dict[str, dict[str, Any]]:
    """Each MNIST trainer in one process on the combined batch, one after the other in one process: by example,
    what :func:`run_job` says of a job (the exit code and output are the shared process's)."""
    where.mkdir(parents=True)
    jobs = ["\x1f".join([str(where / f"out-{i}"), "--no-dropout", "--", str(EXAMPLES / example), *REFERENCE])
            for i, example in enumerate(TRAINERS)]
    code, out = run_command(where, "the one-process references", [sys.executable, "-c", IN_TURN, str(DRIVER), *jobs])
    return {example: {"code": code, "output": out, "ranks": reports_in(where / f"out-{i}")}
            for i, example in enumerate(TRAINERS)}


def jobs_to_run() -> Iterator[tuple[str, str, list[str], bool]]:
    """(launcher, example, arguments, dropout off): the 2-worker runs (test order)."""
    for launcher in ("pskv launch", "torchrun"):
        for example, args in PROGRAMS.items():
            if launcher == "torchrun" and example not in TRAINERS:
                continue  # the benchmarks' calls are the trainers' (the horovod store): the suite's time
            yield launcher, example, args, example in TRAINERS


def pass_on(source: Future[dict[str, dict[str, Any]]], *, example: str, target: Future[dict[str, Any]]) -> None:
    """``target`` gets ``source``'s outcome for ``example`` (or its exception)."""
    if target.done():  # cancelled at the module's end
        return
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result()[example])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Future[dict[str, Any]]]]:
    """(launcher, example) -> the job's outcome (a future: every job starts now, a few at a time)."""
    where = tmp_path_factory.mktemp("peer-examples")
    with ThreadPoolExecutor(AT_ONCE, thread_name_prefix="peer-example") as pool:
        futures = {(launcher, example): pool.submit(run_job, where / f"{i}-{Path(example).stem}", launcher,
                                                    example, args, no_dropout)
                   for i, (launcher, example, args, no_dropout) in enumerate(jobs_to_run())}
        references = pool.submit(run_references, where / "references")
        for example in TRAINERS:
            futures["one process", example] = Future()
            references.add_done_callback(partial(pass_on, example=example, target=futures["one process", example]))
        yield futures
        references.cancel()
        for future in futures.values():
            future.cancel()


def outcome(jobs: dict[tuple[str, str], Future[dict[str, Any]]], launcher: str, example: str,
            ranks: int = 2) -> dict[str, Any]:
    """The finished job's outcome, asserted to have ended well with a report from each rank."""
    job = jobs[launcher, example].result(timeout=DEADLINE + 15)
    ended = f"did not end within {DEADLINE:g} s" if job["code"] is None else f"ended with exit code {job['code']}"
    assert job["code"] == 0, f"{example} under {launcher} {ended}:\n{job['output'][-6000:]}"
    assert sorted(job["ranks"]) == list(range(ranks)), job["output"][-6000:]
    assert [(r["size"], r["store"]) for r in job["ranks"].values()] == [(ranks, STORES[launcher])] * ranks
    return job


@pytest.mark.parametrize(("launcher", "example"), [(launcher, example) for launcher, example, _, _ in jobs_to_run()])
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)  # the first waits for the job and the module's fixture starting them all
def test_runs_to_the_end_with_identical_parameters_on_both_ranks(jobs: Any, example: str, launcher: str) -> None:
    job = outcome(jobs, launcher, example)
    first, second = job["ranks"][0], job["ranks"][1]
    assert first["params"] == second["params"], (
        f"{example} under {launcher}: the ranks' parameters differ by up to "
        f"{np.abs(first['values'] - second['values']).max()}")
    assert np.array_equal(first["values"], second["values"])
    assert first["params"]["sha256"] != first["first_step"]["sha256"], "the parameters never changed"
    if example in TRAINERS:  # the ranks saw different data, and printed what they trained on
        assert len(first["losses"]) == len(second["losses"]) == 8, first["output"]
        assert first["losses"] != second["losses"]
        assert "Test set: Average loss" in first["output"]
    else:
        assert re.search(r"Total img/sec on 2 CPU\(s\): ", first["output"]), first["output"]


@pytest.mark.parametrize("example", TRAINERS)
@pytest.mark.parametrize("launcher", ["pskv launch", "torchrun"])
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_mnist_losses_equal_one_process_on_the_combined_batch(jobs: Any, example: str, launcher: str) -> None:
    two = outcome(jobs, launcher, example)
    one = outcome(jobs, "one process", example, ranks=1)["ranks"][0]
    mean = [(a + b) / 2 for a, b in zip(two["ranks"][0]["losses"], two["ranks"][1]["losses"], strict=True)]
    assert len(mean) == len(one["losses"]) == 8, (mean, one["losses"])
    worst = max(abs(a - b) for a, b in zip(mean, one["losses"], strict=True))
    assert worst <= 1e-5, f"{example} under {launcher}: 2 workers' mean losses {mean} vs one process {one['losses']}"
    assert np.abs(two["ranks"][0]["values"] - one["values"]).max() <= 1e-5


def test_the_doc_block_it_stands_for_is_the_command_it_runs() -> None:
    text = (ROOT / "docs" / "from-horovod.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- doc-block: skip tests/torch/test_peer_examples.py [^\n]*-->\n```bash\n(.*?)```", text, re.S)
    assert block is not None, "docs/from-horovod.md's block run by this module is not marked for it"
    assert shlex.split(block.group(1)) == ["pskv", "launch", "-n", "2", "-s", "2", "--", "python",
                                           "examples/torch/pytorch_synthetic_benchmark.py", *BENCH]
    assert LAUNCHERS["pskv launch"][3:8] == ["launch", "-n", "2", "-s", "2"]


HEADER_LINE = re.compile(r"^#   line (\d+): `(.+)` -> `(.+)`$")


def check_changed_lines(path: Path) -> None:
    """The header's list of changed lines names each line marked ``# pskv:`` with its text, and no other; the
    peer's import is among them and nowhere else."""
    lines = path.read_text(encoding="utf-8").splitlines()
    listed = {int(m.group(1)): m.group(3) for m in map(HEADER_LINE.match, lines) if m}
    marked = {i + 1: line.split("  # pskv: ")[0] for i, line in enumerate(lines) if "  # pskv: " in line}
    assert listed == marked
    assert any(re.fullmatch(r"import pskv\.torch as (hvd|bps)", line) for line in marked.values())
    assert not [line for line in lines if re.search(r"\b(horovod|byteps)\.torch\b", line) and not line.startswith("#")]


@pytest.mark.parametrize("example", list(PROGRAMS))
def test_each_example_lists_exactly_its_changed_lines(example: str) -> None:
    check_changed_lines(EXAMPLES / example)


NOT_OFFERED = ["alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
               "grouped_allgather", "allgather_async", "sparse_allreduce_async", "add_process_set", "remove_process_set"]


@pytest.mark.parametrize("function", NOT_OFFERED)
def test_what_is_not_offered_raises_not_supported_error_naming_it(function: str) -> None:
    """docs/from-horovod.md's list: a Horovod program calling one of these learns at once which call it was."""
    import torch

    import pskv.torch as hvd
    from pskv.errors import NotSupportedError

    with pytest.raises(NotSupportedError, match=rf"\bpskv\.torch\.{function} is not offered"):
        getattr(hvd, function)(torch.ones(2))


def test_adasum_is_refused_naming_the_call() -> None:
    import torch

    import pskv.torch as hvd
    from pskv.errors import NotSupportedError

    with pytest.raises(NotSupportedError, match=r"allreduce\(op=Adasum\)"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(NotSupportedError, match=r"DistributedOptimizer\(op=Adasum\)"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=hvd.Adasum)
