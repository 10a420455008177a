"""Helpers for testing code that uses pskv (and pskv's own tests)."""

from pskv.testing.cluster import InProcessCluster

__all__ = ["InProcessCluster"]
