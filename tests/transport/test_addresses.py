"""Which address a node binds (``pskv.transport.addresses``) and the local rank without a launcher.

The choice is tested with injected interface tables and routes; a job in network
namespaces with only ``DMLC_*`` set is ``tests/fault/test_cluster_env.py``.
"""

from __future__ import annotations

import pytest

import pskv
from pskv.config import ClusterConfig
from pskv.transport.addresses import bind_host, interface_address, interface_table, route_source

TABLE = [("lo", "127.0.0.1"), ("docker0", "169.254.3.1"), ("eth0", "10.1.2.3"), ("eth1", "192.168.7.7")]


def cluster(**kw) -> ClusterConfig:
    return ClusterConfig(num_servers=1, num_workers=1, root_port=9091, **kw)


def no_route(host: str, port: int) -> None:
    return None


def test_the_node_host_then_the_interface_win():
    assert bind_host(cluster(root_uri="10.9.9.9", node_host="10.5.5.5"), lambda: TABLE, no_route) == "10.5.5.5"
    assert bind_host(cluster(root_uri="10.9.9.9", interface="lo"), lambda: TABLE, no_route) == "127.0.0.1"
    with pytest.raises(pskv.InvalidArgumentError, match="DMLC_INTERFACE='nosuch0'"):
        bind_host(cluster(root_uri="10.9.9.9", interface="nosuch0"))


@pytest.mark.parametrize("root", ["127.0.0.1", "127.3.0.1", "localhost", "::1"])
def test_a_local_job_binds_loopback_whatever_the_interfaces(root):
    assert bind_host(cluster(root_uri=root), lambda: TABLE, lambda h, p: "10.1.2.3") == "127.0.0.1"


def test_a_cluster_job_binds_the_address_on_the_route_to_the_scheduler():
    asked = []

    def route(host: str, port: int) -> str:
        asked.append((host, port))
        return "192.168.7.7"
    assert bind_host(cluster(root_uri="mxjob-scheduler-0"), lambda: TABLE, route) == "192.168.7.7"
    assert asked == [("mxjob-scheduler-0", 9091)]


def test_without_a_route_the_first_routable_interface_and_else_a_clear_error():
    assert bind_host(cluster(root_uri="10.9.9.9"), lambda: TABLE, no_route) == "10.1.2.3"  # not lo, not link-local
    assert bind_host(cluster(root_uri="10.9.9.9"), lambda: TABLE, lambda h, p: "127.0.0.1") == "10.1.2.3"
    with pytest.raises(pskv.InvalidArgumentError, match="set DMLC_NODE_HOST .* or DMLC_INTERFACE"):
        bind_host(cluster(root_uri="10.9.9.9"), lambda: TABLE[:2], no_route)


def test_the_real_table_and_route_of_this_host():
    assert ("lo", "127.0.0.1") in interface_table()
    assert interface_address("lo") == "127.0.0.1"
    assert route_source("127.0.0.1", 9) == "127.0.0.1"  # no packet sent: a UDP connect only picks the route
    assert route_source("no-such-host.invalid", 9) is None


@pytest.mark.parametrize(("env", "rank", "local_rank"), [
    ({"PSKV_LOCAL_RANK": "2"}, 5, 2),
    ({"BYTEPS_LOCAL_RANK": "1"}, 5, 1),
    ({"DMLC_PS_ROOT_URI": "127.0.0.1"}, 3, 3),  # a job on one host: every worker is local
    ({"DMLC_PS_ROOT_URI": "10.0.0.1"}, 3, 0),  # one worker per host (an MXJob pod)
    ({"DMLC_PS_ROOT_URI": "10.0.0.1", "BYTEPS_LOCAL_RANK": "1"}, 3, 1),
])
def test_local_rank_without_the_launcher(env, rank, local_rank):
    assert ClusterConfig.from_env(env).local_rank_of(rank) == local_rank
    with pytest.raises(pskv.InvalidArgumentError, match="local_rank"):
        ClusterConfig(local_rank=-2)
