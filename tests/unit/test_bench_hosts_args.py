"""The simulated-host benchmarks' options and arithmetic (no namespaces: the runs themselves need root and minutes).

``bench/bench_hosts.py --setup c`` (the scaling curve) and ``bench/bench_train_hosts.py``
(training between hosts) of issue 23: their defaults, the refusals of options that do not
apply, the bounds the scaling curve is drawn against, and the training checks.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Import a bench program by name (bench/ on sys.path only for this test)."""
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])
    return importlib.import_module


def test_setup_c_defaults_and_quick(bench: Any) -> None:
    hosts = bench("bench_hosts")
    full = hosts.parse_args(["--setup", "c"])
    assert (full.workers, full.rate, full.only, full.rounds) == ([2, 4, 8], "100mbit", "16mb", 2)
    quick = hosts.parse_args(["--setup", "c", "--quick", "--rate", "50mbit"])
    assert (quick.workers, quick.rate, quick.rounds, quick.repeats) == ([2, 4], "50mbit", 1, 2)
    assert hosts.parse_args(["--setup", "c", "--workers", "8,2,4,2"]).workers == [2, 4, 8]


@pytest.mark.parametrize("argv", [["--workers", "2,4"], ["--setup", "c", "--workers", "1,2"],
                                  ["--setup", "c", "--compression", "2bit"]])
def test_setup_c_refuses_options_that_do_not_apply(bench: Any, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench("bench_hosts").parse_args(argv)


def _worker(rank: int, seconds: list[float], mode: str) -> dict[str, Any]:
    return {"rank": rank, "results": {"16mb": {"samples_s": {mode: seconds}}}}


def test_scaling_rows_hold_throughput_and_bounds(bench: Any) -> None:
    hosts, scaling = bench("bench_hosts"), bench("_hosts_scaling")
    work = next(w for w in scaling.scaling_workloads(False) if w.id == "16mb")
    runs = {w: {"pskv": [[_worker(r, [1.0, 1.0], "pushpull") for r in range(w)]],
                "gloo": [[_worker(r, [2.0, 2.0], "push_pull") for r in range(w)]]} for w in (2, 8)}
    rows = scaling.throughput_rows(runs, work, 100e6, hosts.summarize)
    assert [r["workers"] for r in rows] == [2, 8]
    eight = rows[1]
    assert eight["pskv"]["bytes_per_s"] == pytest.approx(16 << 20)
    assert eight["pskv"]["bound_bytes_per_s"] == pytest.approx(12.5e6)
    assert eight["gloo"]["bound_bytes_per_s"] == pytest.approx(12.5e6 * 8 / 14)
    assert eight["ratio_vs_gloo"] == pytest.approx(2.0)
    assert scaling.flatness(rows) == {"pskv": 1.0, "gloo": 1.0, "pskv_flat_within_10pct": True}


def test_train_hosts_options(bench: Any) -> None:
    train = bench("bench_train_hosts")
    args = train.parse_args(["--quick"])
    assert (args.rounds, args.iters, args.system_ids, args.model_ids) == (1, 4, ["trainer", "optimizer", "ddp"],
                                                                          ["mlp_large"])
    for bad in (["--systems", "horovod"], ["--models", "gpt"], ["--rate", "fast"]):
        with pytest.raises(SystemExit):
            train.parse_args(bad)


def _trained(rank: int, digest: str, first: list[float], last: list[float]) -> dict[str, Any]:
    return {"rank": rank, "results": {"m": {"final_params": {"sha256": digest, "sum": 1.0},
                                            "first_losses": first, "last_losses": last}}}


def test_train_hosts_checks_catch_divergence_and_stalled_loss(bench: Any) -> None:
    check = bench("bench_train_hosts").check_job
    good = [_trained(r, "a", [2.0, 1.9], [0.5, 0.4]) for r in range(4)]
    assert check(good, "m", good) == []
    apart = [*good[:3], _trained(3, "b", [2.0, 1.9], [0.5, 0.4])]
    assert "differ between workers" in check(apart, "m", None)[0]
    stalled = [_trained(r, "a", [2.0, 1.9], [1.9, 1.9]) for r in range(4)]
    assert all("loss" in p for p in check(stalled, "m", None))
    other = [_trained(r, "a", [2.1, 1.9], [0.5, 0.4]) for r in range(4)]
    assert "DDP" in check(good, "m", other)[0]
