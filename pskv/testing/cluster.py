"""A whole cluster inside one process, for tests and experiments.

:class:`InProcessCluster` starts a scheduler on ``127.0.0.1`` (port chosen by the OS)
and the servers as threads; :meth:`InProcessCluster.run_workers` runs a function of the
worker's cluster contract once per worker, each in its own thread (:meth:`InProcessCluster.run_stores`:
a function of a store each worker creates and closes), and returns their results — or
raises the first worker's exception. Every wait has a deadline; leftover threads are
daemons and the sockets are closed on exit.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from pskv.cluster import Scheduler
from pskv.config import ClusterConfig
from pskv.errors import OperationTimeoutError
from pskv.kvstore import KVStoreBase, create
from pskv.server.node import ServerNode

__all__ = ["InProcessCluster"]

T = TypeVar("T")


class InProcessCluster:
    """Scheduler + servers as threads of this process.

    Args:
        num_servers: servers to start.
        num_workers: workers :meth:`run_workers` will start.
        deadline: seconds any single wait of the harness may take.
        **settings: further :class:`~pskv.config.ClusterConfig` fields (heartbeats, ...).
    """

    def __init__(self, num_servers: int, num_workers: int, deadline: float = 60.0, **settings: Any) -> None:
        self.deadline = deadline
        base = ClusterConfig(num_servers=num_servers, num_workers=num_workers, startup_timeout=deadline,
                             request_timeout=deadline, **settings)
        self.scheduler = Scheduler(base, address="tcp://127.0.0.1:0")
        port = int(self.scheduler.address.rsplit(":", 1)[1])
        self.config = dataclasses.replace(base, root_uri="127.0.0.1", root_port=port)
        self.servers: list[ServerNode] = []
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def __enter__(self) -> InProcessCluster:
        self.scheduler.start()
        for i in range(self.config.num_servers):
            server = ServerNode(dataclasses.replace(self.config, role="server", server_rank=i))
            self.servers.append(server)
            t = threading.Thread(target=self._serve, args=(server,), name=f"pskv-test-server-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _serve(self, server: ServerNode) -> None:
        try:
            server.run()
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.errors.append(exc)

    def worker_config(self, rank: int) -> ClusterConfig:
        """The cluster contract of worker ``rank``."""
        return dataclasses.replace(self.config, role="worker", rank=rank)

    def run_workers(self, fn: Callable[[ClusterConfig], T], timeout: float | None = None) -> list[T]:
        """Run ``fn(worker_config)`` for every worker concurrently; results in rank order.

        Raises:
            OperationTimeoutError: a worker did not finish within ``timeout`` (default
                ``deadline``) of the wait for it; the workers are waited for in rank order,
                each with a fresh ``timeout``, so the call may last up to ``num_workers`` times it.
            Exception: the first worker exception (in rank order).
        """
        limit = self.deadline if timeout is None else timeout
        pool = ThreadPoolExecutor(self.config.num_workers, thread_name_prefix="pskv-test-worker")
        futures = [pool.submit(fn, self.worker_config(r)) for r in range(self.config.num_workers)]
        try:
            results = []
            for f in futures:
                try:
                    results.append(f.result(timeout=limit))
                except FutureTimeout:
                    if f.done():  # the worker itself raised a TimeoutError (e.g. OperationTimeoutError)
                        raise
                    faulthandler.dump_traceback(all_threads=True)  # where is everyone stuck?
                    raise OperationTimeoutError(f"a worker did not finish within {limit} s") from None
            return results
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def run_stores(self, fn: Callable[[KVStoreBase], T], store: str = "dist_sync", timeout: float | None = None) -> list[T]:
        """:meth:`run_workers` of ``fn(kv)``, each worker with a ``store`` of its own (closed after ``fn``)."""
        def body(cluster: ClusterConfig) -> T:
            kv = create(store, cluster=cluster)
            try:
                return fn(kv)
            finally:
                kv.close()

        return self.run_workers(body, timeout)

    def close(self) -> None:
        """Wait for the servers to finish (they end when every worker closed its store).

        Servers still running after a short grace (e.g. because a test left a store
        open) are stopped.
        """
        for t in self._threads:
            t.join(2.0)
        for server in self.servers:
            server.stop()
        for t in self._threads:
            t.join(self.deadline)
        self.scheduler.stop()

    def __exit__(self, *exc: object) -> None:
        self.close()
