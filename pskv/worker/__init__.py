"""The worker role's network side."""

from pskv.worker.client import WorkerClient

__all__ = ["WorkerClient"]
