"""Run one of this folder's peer examples unchanged and write down what the tests compare.

    python examples/torch/checked_run.py OUT_DIR [--no-dropout] -- EXAMPLE.py [ITS ARGUMENTS...]

The example runs as its own ``__main__`` (``runpy``; its folder first on ``sys.path`` and
``sys.argv`` its own, as when started directly), under whatever started this process
(``pskv launch``, torchrun, or nothing). When it has finished, this process writes

* ``OUT_DIR/rank-R.json`` — ``rank``, ``size`` and ``store`` (the type of the store ``pskv.torch``
  runs on), ``losses``: every ``Loss: x`` the program printed, in order, ``params``: how many
  parameter values and the SHA-256 of their bytes at the end, ``first_step``: the same just
  after the first optimizer step, and ``output``: what it printed;
* ``OUT_DIR/rank-R.npy`` — those parameters, flattened and concatenated in order.

The parameters are those of the last optimizer that took a step, found by torch's global
step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``), so the program
needs no change to be checked.

``--no-dropout`` makes ``torch.nn.functional.dropout`` and ``dropout2d`` the identity, for
comparing N processes with one process on the combined batch: each process draws its own
dropout masks, so with dropout the two runs differ by design, not by a fault.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import runpy
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.nn.functional
from torch.optim.optimizer import register_optimizer_step_post_hook

LOSS = re.compile(r"Loss: (-?[0-9.]+(?:e[-+]?\d+)?)")


class Tee(io.TextIOBase):
    """Writes go to ``out`` and are kept (``kept``)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


def flat_parameters(optimizer: torch.optim.Optimizer) -> np.ndarray:
    """The optimizer's parameters, flattened and concatenated in order (a copy)."""
    return torch.cat([p.detach().cpu().reshape(-1) for group in optimizer.param_groups
                      for p in group["params"]]).numpy().copy()


def watch_optimizers() -> dict[str, Any]:
    """After the run: ``"last"``, the last optimizer whose ``step()`` ran, ``"first"``, its parameters after the first."""
    seen: dict[str, Any] = {}

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not seen:
            seen["first"] = flat_parameters(optimizer)
        seen["last"] = optimizer

    register_optimizer_step_post_hook(hook)
    return seen


def summary(values: np.ndarray) -> dict[str, Any]:
    return {"count": int(values.size), "sha256": hashlib.sha256(values.tobytes()).hexdigest()}


def without_dropout() -> None:
    def identity(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        return input

    torch.nn.functional.dropout = identity  # nn.Dropout and nn.Dropout2d call these by attribute
    torch.nn.functional.dropout2d = identity


def parse(argv: list[str]) -> tuple[Path, bool, list[str]]:
    if "--" not in argv or len(argv) < 4:
        sys.exit(__doc__.split("\n\n")[1])
    cut = argv.index("--")
    own, example = argv[1:cut], argv[cut + 1:]
    return Path(own[0]), "--no-dropout" in own[1:], example


def main() -> None:
    out_dir, no_dropout, example = parse(sys.argv)
    if no_dropout:
        without_dropout()
    stepped = watch_optimizers()
    tee = Tee(sys.stdout)
    sys.stdout = tee
    sys.argv = example
    sys.path.insert(0, str(Path(example[0]).resolve().parent))
    runpy.run_path(example[0], run_name="__main__")
    sys.stdout = tee.out

    import pskv.torch as hvd

    if not stepped:
        sys.exit(f"{example[0]} finished without an optimizer step")
    flat = flat_parameters(stepped["last"])
    rank = hvd.rank()
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / f"rank-{rank}.npy", flat)
    report = {"rank": rank, "size": hvd.size(), "store": hvd.store().type, "losses": [float(m) for m in LOSS.findall(tee.kept.getvalue())],
              "params": summary(flat), "first_step": summary(stepped["first"]),
              "output": tee.kept.getvalue()}
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
