#!/usr/bin/env python
"""Fault injection into real pskv jobs on 127.0.0.1: runs the package ``bench/faults/`` (its docstring
describes the rows and options; the results are discussed in docs/reliability.md).

    python bench/bench_faults.py                    # all faults, 3 runs each: ~3 min on 2 cores
    python bench/bench_faults.py --pskv-commit HEAD # pskv/ as committed, not the working tree
    python bench/bench_faults.py --only kill_server,fuzz --repeats 1

Every job's workers run this file too: ``bench_faults.py _worker SPEC.json``.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package bench/faults: import it as `faults`
    if len(sys.argv) >= 3 and sys.argv[1] == "_worker":
        from faults.workers import worker_main

        sys.exit(worker_main(sys.argv[2]))
    from faults.__main__ import main

    sys.exit(main())
