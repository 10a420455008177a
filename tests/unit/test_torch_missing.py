"""Without PyTorch, ``import pskv`` works and ``import pskv.parallel`` says how to get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK_TORCH = r'''
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoTorch())
import pskv
print("pskv imported", pskv.create("local").type)
try:
    import pskv.parallel
except ModuleNotFoundError as exc:
    print("error:", exc.name, exc)
'''


def test_pskv_parallel_without_torch_names_the_extra_to_install():
    res = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "pskv imported local" in res.stdout, res.stdout
    assert "error: torch pskv.parallel trains PyTorch models and needs PyTorch: pip install 'pskv[torch]'" \
        in res.stdout, res.stdout
