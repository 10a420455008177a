"""Run several job scripts of ``tests/torch`` one after another in this one process: ``run_scripts.py OUTDIR SCRIPT...``.

Started on every rank by ``pskv launch`` (tests/torch/launched.py). Each ``job_<name>.py`` runs as
``__main__`` with ``sys.argv = [SCRIPT, OUTDIR/<name>]``, as if it had been launched alone: it
calls ``init()`` first and ``shutdown()`` last (a store with servers is taken back by the next
script's ``init()``, every name new again) and writes ``OUTDIR/<name>/rank-R.json``. One process
for every script saves each further script a job's start (processes, importing torch: seconds of
CPU each). A script that raises is recorded in its own ``rank-R.json`` (``"__crashed__"``) and the
next one runs.
"""

from __future__ import annotations

import json
import runpy
import sys
import traceback
from pathlib import Path

import pskv.torch as hvd
from pskv.config import rank_env


def main(outdir: Path, scripts: list[str]) -> None:
    ranks = rank_env()
    rank = ranks.rank if ranks is not None else 0
    for script in scripts:
        where = outdir / Path(script).stem.removeprefix("job_")
        where.mkdir(parents=True, exist_ok=True)
        sys.argv = [script, str(where)]
        try:
            runpy.run_path(script, run_name="__main__")
        except BaseException:  # noqa: BLE001 - recorded for the tests; the next script runs
            (where / f"rank-{rank}.json").write_text(json.dumps({"__crashed__": traceback.format_exc()[-4000:]}))
        hvd.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
