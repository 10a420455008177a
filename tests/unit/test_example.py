"""The README's main job runs and reaches its stated result."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_local_data_parallel_example_matches_single_device_training():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "local_data_parallel.py"), "--epochs", "2", "--devices", "3"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "epoch 2/2" in proc.stdout
    assert "3 devices vs 1 device with the whole batch: max weight difference" in proc.stdout
    accuracy = float(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert accuracy >= 0.9


def test_distributed_example_under_the_launcher_matches_single_process_training():
    proc = subprocess.run(
        [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--timeout", "150", "--",
         sys.executable, str(ROOT / "examples" / "dist_data_parallel.py"), "--epochs", "2"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[worker 0] epoch 2/2" in proc.stdout
    assert "2 workers vs 1 process with the whole batch: max weight difference" in proc.stdout
    accuracy = float(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert accuracy >= 0.9


def load(name: str):
    """examples/<name>.py as a module (not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(module, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int | str | None:
    """``module.main()`` with these arguments; its exit code."""
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    return exit_.value.code


@pytest.mark.parametrize("name, argv, message", [
    ("local_data_parallel", ["--devices", "0"], "--devices must be >= 1, got 0"),
    ("local_data_parallel", ["--batch", "9000"], "--batch must be >= 1 and <= 8192, got 9000"),
    ("local_data_parallel", ["--epochs", "0"], "--epochs must be >= 1, got 0"),
    ("dist_data_parallel", ["--batch", "0"], "--batch must be >= 1 and <= 8192, got 0"),
    ("dist_data_parallel", [], "a distributed store needs the cluster environment (pskv launch sets it)"),
    ("dist_data_parallel", ["--store", "bogus"], "unknown store type 'bogus'"),
])
def test_a_bad_option_is_a_usage_error_not_a_traceback(name, argv, message, monkeypatch, capsys):
    for var in ("DMLC_ROLE", "DMLC_PS_ROOT_URI"):
        monkeypatch.delenv(var, raising=False)
    assert run_main(load(name), argv, monkeypatch) == 2
    assert message in capsys.readouterr().err


def test_a_low_accuracy_is_not_reported_as_a_mismatch(monkeypatch, capsys):
    # labels drawn apart from the samples: nothing to learn, yet the devices still match one device
    module = load("local_data_parallel")
    make_data = module.make_data

    def unlearnable(n, dim, classes, seed):
        x, y = make_data(n, dim, classes, seed)
        return x, np.random.default_rng(1).integers(0, classes, size=n)

    monkeypatch.setattr(module, "make_data", unlearnable)
    code = run_main(module, ["--epochs", "1", "--batch", "4096", "--devices", "2"], monkeypatch)
    assert isinstance(code, str) and code.startswith("test accuracy") and "below 0.9" in code
    assert "2 devices vs 1 device with the whole batch: max weight difference" in capsys.readouterr().out
