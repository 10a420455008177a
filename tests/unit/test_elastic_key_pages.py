"""WorkerView.key_table (pskv/worker/elastic.py): a server's KEYS pages must move on, right after each page."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import pskv
from pskv.protocol import Command, Header
from pskv.protocol.bodies import KeyPart, KeysRequest, KeyTable
from pskv.worker.elastic import WorkerView


def view(pages):
    """A view whose one server answers KEYS from ``start`` with ``pages[start]`` (parts, next)."""
    asked = []

    def request(server, command, body, what, timeout):
        start = KeysRequest.parse(Header(Command.KEYS, 1, 0, body=body)).start
        asked.append(start)
        n, follow = pages[start]
        table = KeyTable(tuple(KeyPart(start + i, 0, "float32", 4) for i in range(n)), follow)
        return SimpleNamespace(wait=lambda timeout: Header(Command.REPLY, 1, 0, body=table.encode()))

    client = SimpleNamespace(info=SimpleNamespace(num_servers=1), request=request)
    return WorkerView(client), asked  # type: ignore[arg-type]


def test_pages_that_follow_each_other_make_the_table():
    v, asked = view({0: (2, 2), 2: (1, 0)})
    assert sorted(v.key_table(1.0)) == [(0, 0), (1, 0), (2, 0)] and asked == [0, 2]


@pytest.mark.parametrize("pages", [{0: (0, 5), 5: (0, 5)},  # an empty page going on
                                   {0: (2, 2), 2: (2, 2)},  # the same page again (was: forever)
                                   {0: (2, 7)},  # past the parts sent
                                   {0: (2, 2), 2: (2, 1)}])  # back
def test_a_page_whose_next_is_not_right_after_it_is_refused_naming_the_server(pages):
    v, asked = view(pages)
    with pytest.raises(pskv.ProtocolError, match=r"^KEYS reply of server 0: the page from part \d+ lists"):
        v.key_table(1.0)
    assert len(asked) <= 2


def test_a_table_past_the_bound_is_refused(monkeypatch):
    monkeypatch.setattr("pskv.worker.elastic.MAX_TABLE_PARTS", 4)
    v, _ = view({0: (2, 2), 2: (2, 4), 4: (2, 0)})
    with pytest.raises(pskv.ProtocolError, match="fewer than 4 parts"):
        v.key_table(1.0)
