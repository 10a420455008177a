"""Helpers for testing code that uses pskv (and pskv's own tests).

* :class:`InProcessCluster` — a whole job (scheduler, servers, workers) in one process.
* :mod:`pskv.testing.fuzz` — valid and hostile wire messages, to attack a server with.
* :mod:`pskv.testing.contracts` — the KVStore semantics every store keeps (:func:`run_contract`
  of a :class:`Contract` on a :class:`StoreSpec`: :func:`local_store`, :func:`cluster_store`).
* :mod:`pskv.testing.store_model` — :func:`~pskv.testing.store_model.run_store_machine`:
  random calls against a dict model (needs ``hypothesis``; import it explicitly).
* :mod:`pskv.testing.loopback` — :func:`~pskv.testing.loopback.loopback_store`: a
  distributed store whose servers run in this process, without sockets.
* :mod:`pskv.testing.jobs` — real processes: a ``pskv launch`` job, or a scheduler, servers
  and workers started by hand on 127.0.0.1, with readiness waits, deadlines and reaping
  (import it explicitly).
* :mod:`pskv.testing.hosts` — :class:`~pskv.testing.hosts.SimulatedHosts`: hosts as network
  namespaces on one Linux machine (root; import it explicitly).
"""

from pskv.testing import contracts, fuzz
from pskv.testing.cluster import InProcessCluster
from pskv.testing.contracts import CONTRACTS, Contract, contracts_for, run_contract
from pskv.testing.stores import StoreGroup, StorePool, StoreSpec, cluster_store, local_store

__all__ = [
    "CONTRACTS",
    "Contract",
    "InProcessCluster",
    "StoreGroup",
    "StorePool",
    "StoreSpec",
    "cluster_store",
    "contracts",
    "contracts_for",
    "fuzz",
    "local_store",
    "run_contract",
]
