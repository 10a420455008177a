"""The README's performance paragraph and docs/benchmarks.md's summary are what bench/report.py renders from
bench/results (so the two texts cannot disagree with each other or with the results)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
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


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_results_older_than_the_code_they_measure_are_flagged(tmp_path, monkeypatch, capsys):
    """A result is current until a commit changes pskv/ after the one it measured; then --check fails until the
    texts say it is older, and it counts the later commits. A commit elsewhere (docs) changes nothing."""
    report = report_module()
    repo, results = tmp_path / "repo", tmp_path / "results"
    (repo / "pskv").mkdir(parents=True)
    results.mkdir()
    git(repo, "init", "-q")
    (repo / "pskv" / "code.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "measured")
    measured = git(repo, "rev-parse", "--short", "HEAD")
    for name in report.SOURCES.values():
        data = json.loads((report.RESULTS / name).read_text())
        data.get("environment", data)["git_commit" if "environment" in data else "commit"] = measured
        (results / name).write_text(json.dumps(data))
    for doc in report.TARGETS:
        (repo / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, repo / doc)
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "ROOT", repo)

    assert report.main([]) == 0
    assert "Every run measured the current code." in " ".join((repo / "README.md").read_text().split())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "docs only")
    capsys.readouterr()
    assert report.main(["--check"]) == 0
    assert "older than the code" not in capsys.readouterr().out

    (repo / "pskv" / "code.py").write_text("x = 2\n")
    git(repo, "commit", "-q", "-am", "a change to the measured code")
    assert report.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert f"older than the code: local.json measured {measured} on 2026-11-22; 1 later commits change pskv/" in out
    assert report.main([]) == 0
    readme = " ".join((repo / "README.md").read_text().split())
    assert "Older than the code they measure: every run" in readme
    assert "Older than the code they measure: every run" in (repo / "docs/benchmarks.md").read_text()
    assert report.main(["--check"]) == 0


def test_a_result_whose_commit_git_cannot_find_counts_as_older(monkeypatch):
    report = report_module()
    monkeypatch.setattr(report, "ROOT", Path("/nonexistent"))
    assert report.later_commits("d273439") is None
    assert set(report.older_than_code()) == set(report.QUOTED)
