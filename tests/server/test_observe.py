"""The server's observer (:mod:`pskv.server.observe`): the shard's round events become counters and spans."""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.metrics import NodeCounters
from pskv.server.observe import ServerObserver, TracingObserver, observer
from pskv.server.shard import ServerShard, ShardObserver

W0, W1 = 9, 11  # node ids of workers 0 and 1


class Spans:
    """A stand-in timeline: keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float, dict[str, Any]]] = []
        self.closed = False

    def span(self, name: str, track: str, start: float, end: float, args: dict[str, Any]) -> None:
        self.spans.append((name, track, start, end, args))

    def close(self) -> None:
        self.closed = True


def _round(s: ServerShard) -> None:
    part = s.part(7, 0, "test")
    s.push(part, W0, np.ones(4, np.float32))
    s.push(part, W1, np.ones(4, np.float32))


def test_the_default_observer_ignores_everything_and_the_counters_count_rounds():
    plain = ServerShard(2)
    assert type(plain.observer) is ShardObserver
    counted = ServerShard(2, observer=ServerObserver())
    for s in (plain, counted):
        s.init(7, 0, "float32", np.zeros(4, np.float32))
        s.updater = lambda key, grad, value: np.subtract(value, grad, out=value)
        _round(s)
        assert s.part(7, 0, "test").value.tolist() == [-2.0] * 4
    assert isinstance(counted.observer, ServerObserver) and counted.observer.counters.rounds == 1
    assert observer(NodeCounters(), None, {}).timeline is None


def test_a_traced_round_has_its_merge_and_update_spans_with_who_came_last():
    timeline = Spans()
    counters = NodeCounters()
    s = ServerShard(2, observer=TracingObserver(counters, timeline, {7: "weights"}))  # type: ignore[arg-type]
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    s.updater = lambda key, grad, value: np.subtract(value, grad, out=value)
    _round(s)
    (merge, track, start, end, args), (update, _, ustart, uend, uargs) = timeline.spans
    assert (merge, update, track) == ("merge", "update", "key weights") and start <= end <= ustart <= uend
    assert args["round"] == uargs["round"] == 1 and args["workers"] == 2 and args["bytes"] == 16
    assert sorted(args["pushes"]) == ["worker 0", "worker 1"] and args["pushes"]["worker 0"] == 0
    assert args["last"] == "worker 1" and counters.rounds == 1
    s.observer.close()  # type: ignore[attr-defined]
    assert timeline.closed


def test_open_rounds_are_the_stalls_of_both_the_report_and_the_metrics():
    s = ServerShard(2)
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    part = s.part(7, 0, "test")
    s.push(part, W0, np.ones(4, np.float32))
    s.pull(part, 1, lambda p: None)
    [(same, rnd, pushed, age)] = s.open_rounds()
    assert same is part and rnd == 1 and pushed == {W0} and age >= 0 and s.parked() == 1
    s.push(part, W1, np.ones(4, np.float32))
    assert list(s.open_rounds()) == [] and s.parked() == 0
