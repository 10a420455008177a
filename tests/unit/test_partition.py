"""Key numbering and where the parts of a value live (pskv.partition)."""

from __future__ import annotations

import pytest

from pskv.partition import home_server, split


def covers(parts, size):
    """The parts tile [0, size) in order, without gaps or overlaps."""
    at = 0
    for _, offset, n in parts:
        assert offset == at
        at += n
    return at == size


def test_small_values_are_one_part_on_their_home_server():
    assert split(42, 10, 3, 1_000) == [(home_server(42, 3), 0, 10)]


def test_big_values_get_one_slice_per_server():
    assert split(1, 10, 3, 5) == [(0, 0, 3), (1, 3, 3), (2, 6, 4)]


@pytest.mark.parametrize(("size", "servers", "bound", "max_part"),
                         [(100_001, 2, 50_000, 10_000), (7, 1, 100, 2), (1_000, 3, 10, 1), (9, 4, 5, 100)])
def test_slices_longer_than_max_part_are_cut_into_near_equal_pieces_on_the_same_server(size, servers, bound, max_part):
    whole = split(5, size, servers, bound)
    parts = split(5, size, servers, bound, max_part)
    assert covers(parts, size)
    assert all(0 < n <= max_part for _, _, n in parts)
    for server, offset, n in whole:  # each slice's pieces: on its server, as few as max_part allows, near-equal
        pieces = [p for p in parts if p[0] == server and offset <= p[1] < offset + n]
        assert len(pieces) == -(-n // max_part)
        assert max(p[2] for p in pieces) - min(p[2] for p in pieces) <= 1


def test_no_cut_without_max_part_or_when_slices_fit():
    assert split(5, 100, 2, 10) == split(5, 100, 2, 10, 0) == split(5, 100, 2, 10, 50)
    assert split(5, 0, 2, 10, 4) == [(home_server(5, 2), 0, 0)]  # an empty value keeps its one part


def test_between_hosts_a_slice_becomes_a_pipeline_of_at_least_pieces_partitions_of_at_least_min_piece_bytes():
    from pskv.partition import MIN_PIECE_BYTES

    mib = 1 << 18  # float32 elements of 1 MiB
    parts = split(7, 16 * mib, 8, 0, mib, 4, pieces=8)  # a 16 MiB value over 8 servers: 2 MiB slices
    assert covers(parts, 16 * mib) and len(parts) == 64
    assert {n * 4 for _, _, n in parts} == {256 << 10} and [s for s, _, _ in parts[:9]] == [0] * 8 + [1]
    small = split(7, 4 * mib, 8, 0, mib, 4, pieces=8)  # 512 KiB slices: 4 pieces, none under MIN_PIECE_BYTES
    assert len(small) == 32 and min(n * 4 for _, _, n in small) >= MIN_PIECE_BYTES
    assert len(split(7, 64 * mib, 2, 0, mib, 4, pieces=8)) == 64  # big slices: cut by max_part as before
    tight = split(7, 16 * mib, 8, 0, mib // 16, 4, pieces=8)  # PSKV_PART_BYTES below MIN_PIECE_BYTES wins
    assert max(n for _, _, n in tight) <= mib // 16
    assert split(7, 16 * mib, 8, 0, mib, 4) == split(7, 16 * mib, 8, 0, mib, 4, pieces=1)  # one host: as before
    assert len(split(7, 16 * mib, 8, 0, mib, 4)) == 16


def test_each_worker_sends_a_calls_messages_from_its_own_ranks_server_on():
    """Workers of a job start at different servers (no incast on server 0), every server's messages in order."""
    import numpy as np

    from pskv.arrays import describe
    from pskv.config import ClusterConfig
    from pskv.worker.layout import by_server, new_layout

    cluster = ClusterConfig.from_env({"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_NUM_SERVER": "4"})
    assert (cluster.part_size, cluster.part_pieces, cluster.message_bytes) == (1 << 20, 8, 128 << 10)
    rec = new_layout("bucket", describe(np.zeros(1 << 20, np.float32)), 4, cluster, True)  # 4 MiB: 1 MiB slices
    assert len(rec.parts) == 32  # each slice: 8 partitions of 128 KiB
    for rank in range(4):
        messages = by_server([rec], False, cluster.message_bytes, rank)  # a message per piece
        assert [server for server, _, _ in messages[:4]] == [(rank + i) % 4 for i in range(4)]
        for server in range(4):
            mine = [i for s, _, items in messages if s == server for _, i in items]
            assert mine == sorted(mine) and len(mine) == 8 and len(messages) == 32


def test_between_hosts_each_server_gets_at_least_two_partitions_of_a_slice_and_calls_a_window():
    """More servers, smaller rounds: a partition's round is a piece from every worker (pskv.worker.pacing's window too)."""
    from pskv.config import ClusterConfig

    def cluster(**env):
        return ClusterConfig.from_env({"DMLC_PS_ROOT_URI": "10.0.0.1", **env})

    eight = cluster(DMLC_NUM_SERVER="8")
    assert (eight.part_pieces, eight.window) == (16, 4)
    assert len(split(7, 16 << 20, 8, 0, eight.part_size, 4, pieces=eight.part_pieces)) == 128  # 128 KiB partitions
    assert cluster(DMLC_NUM_SERVER="2").part_pieces == 8
    assert cluster(DMLC_NUM_SERVER="8", PSKV_CALL_WINDOW="0").window == 0
    assert cluster(DMLC_NUM_SERVER="8", PSKV_RESUME_FROM="/ckpt").window == 0  # its servers may run an optimizer
    assert ClusterConfig.from_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NUM_SERVER": "8"}).window == 0  # one host
