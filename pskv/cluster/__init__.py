"""Cluster membership: the scheduler, the node side of its protocol, request tracking."""

from pskv.cluster.membership import Membership, NodeInfo
from pskv.cluster.requests import Pending, RequestTracker
from pskv.cluster.scheduler import Scheduler

__all__ = ["Membership", "NodeInfo", "Pending", "RequestTracker", "Scheduler"]
