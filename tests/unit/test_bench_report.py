"""The README's performance paragraph and docs/benchmarks.md's summary are what bench/report.py renders from
bench/results (so the two texts cannot disagree with each other or with the results)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def report_module():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_texts_are_what_the_results_give(capsys):
    assert report_module().main(["--check"]) == 0, capsys.readouterr().err


def test_a_new_result_changes_both_texts(tmp_path, monkeypatch):
    report = report_module()
    for name in report.SOURCES.values():
        shutil.copy(report.RESULTS / name, tmp_path / name)
    local = json.loads((tmp_path / "local.json").read_text())
    next(r for r in local["summary"] if r["workload"] == "4 KB")["pskv_over_mxnet"] = 0.5
    (tmp_path / "local.json").write_text(json.dumps(local))
    for doc in report.TARGETS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    assert report.main(["--check"]) == 1
    assert report.main([]) == 0
    assert "0.50x per 4 KB operation" in " ".join((tmp_path / "README.md").read_text().split())  # wrapped lines
    assert "| local store | 4 KB | MXNet 1.9.1 `local` | 0.50x |" in (tmp_path / "docs/benchmarks.md").read_text()
    assert report.main(["--check"]) == 0
