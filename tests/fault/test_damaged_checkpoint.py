"""pskv launch --max-restarts with a damaged checkpoint in --checkpoint-dir (issue 28, finding 4): the
launcher's scan for a checkpoint to restart from skips it with a one-line note, and when no good one is
left it gives up with that line, not a traceback (the scan itself: ``tests/unit/test_loaded_files.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.test_restart import launch


@pytest.mark.timeout(120)
def test_a_restart_with_only_a_damaged_checkpoint_gives_up_with_one_line(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    (ckpts / "ckpt-9").mkdir(parents=True)
    (ckpts / "ckpt-9" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in json
    code, out = launch(tmp_path, 2, "--checkpoint-dir", str(ckpts), "--max-restarts", "1")  # crash before a save
    assert code != 0, out
    assert "crashing server 0" in out, out
    assert f"skipping damaged checkpoint {ckpts / 'ckpt-9'}: {ckpts / 'ckpt-9' / 'manifest.json'} nests deeper" \
        in out, out
    assert f"giving up: no usable checkpoint in {ckpts}: every one is damaged" in out, out
    assert "RecursionError" not in out and "restarting the job" not in out, out
