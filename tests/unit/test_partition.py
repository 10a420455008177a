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
