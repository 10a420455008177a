"""The cases of one ``tests/torch/job_<name>.py`` script and the ``rank-R.json`` it writes.

Every job script makes one :class:`Cases` and decorates its cases with :meth:`Cases.case` (run at
once, in file order) or :meth:`Cases.later` (run by :meth:`Cases.run_later`, e.g. after an
``init()`` the script makes in its ``main``). Each case records ``"ok"`` or the exception's text
under its function's name, so one failing case does not hide the next; :meth:`Cases.write` puts
those outcomes, and what the script adds, into ``OUTDIR/rank-R.json`` (``OUTDIR``: the script's
one argument), which tests/torch/launched.py's ``assert_case`` reads back.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Case = Callable[[], None]


class Cases:
    """One job script's outcomes: ``results`` (case name -> ``"ok"`` or the error, plus what cases add),
    ``params`` (name -> a model's parameters, flattened; see :meth:`record`) and ``seconds`` per case."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.params: dict[str, list[float]] = {}
        self.seconds: dict[str, float] = {}
        self._later: list[Case] = []

    def case(self, fn: Case) -> Case:
        """Decorator: run ``fn`` now and record its outcome."""
        self.run(fn)
        return fn

    def later(self, fn: Case) -> Case:
        """Decorator: keep ``fn`` for :meth:`run_later`."""
        self._later.append(fn)
        return fn

    def run_later(self) -> None:
        """Run the cases kept by :meth:`later`, in the order they were defined."""
        for fn in self._later:
            self.run(fn)

    def run(self, fn: Case) -> None:
        """Run one case: ``"ok"``, or ``"Class: message"`` of what it raised (the next case runs anyway)."""
        began = time.monotonic()
        try:
            fn()
            self.results[fn.__name__] = "ok"
        except BaseException as exc:  # noqa: BLE001 - recorded for the tests; the next case runs
            self.results[fn.__name__] = f"{type(exc).__name__}: {exc}"
        self.seconds[fn.__name__] = round(time.monotonic() - began, 2)

    def record(self, name: str, model: Any) -> None:
        """Keep ``model``'s parameters (a ``torch.nn.Module``), flattened, as ``params[name]``."""
        self.params[name] = [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]

    def write(self, rank: int, **extra: Any) -> None:
        """Write ``results`` with ``rank`` and ``extra`` (e.g. ``params=cases.params``) to ``OUTDIR/rank-R.json``."""
        self.results.update(rank=rank, **extra)
        (Path(sys.argv[1]) / f"rank-{rank}.json").write_text(json.dumps(self.results))
