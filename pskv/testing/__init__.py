"""Helpers for testing code that uses pskv (and pskv's own tests).

* :class:`InProcessCluster` — a whole job (scheduler, servers, workers) in one process.
* :mod:`pskv.testing.fuzz` — valid and hostile wire messages, to attack a server with.
"""

from pskv.testing import fuzz
from pskv.testing.cluster import InProcessCluster

__all__ = ["InProcessCluster", "fuzz"]
