"""Random sequences of store operations checked against a plain-dict model (hypothesis).

Every operation either succeeds and matches the model, or raises a pskv error and leaves
the store equal to the model — whatever mix of keys, shapes, blocking modes and
priorities the sequence uses.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pskv

KEYS = st.sampled_from(["a", "b", "c", "d"])
SHAPES = st.sampled_from([(3,), (2, 2), (3, 2)])
SMALL = st.integers(min_value=-4, max_value=4)


class StoreMachine(RuleBasedStateMachine):
    """Drives a 'local' store and a dict {key: float64 array} side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = pskv.create("local", engine_threads=2)
        self.model: dict[str, np.ndarray] = {}
        self.updater_on = False

    def teardown(self) -> None:
        self.kv.close()

    def _value(self, shape: tuple[int, ...], v: int) -> np.ndarray:
        return np.full(shape, v, dtype=np.float64)

    @rule(key=KEYS, shape=SHAPES, v=SMALL)
    def init(self, key: str, shape: tuple[int, ...], v: int) -> None:
        if key in self.model:
            try:
                self.kv.init(key, self._value(shape, v))
            except pskv.DuplicateKeyError:
                return
            raise AssertionError("duplicate init accepted")
        self.kv.init(key, self._value(shape, v))
        self.model[key] = self._value(shape, v)

    @rule(key=KEYS, values=st.lists(SMALL, min_size=1, max_size=4), bad_shape=st.booleans(),
          block=st.booleans(), priority=SMALL)
    def push(self, key: str, values: list[int], bad_shape: bool, block: bool, priority: int) -> None:
        if key not in self.model:
            try:
                self.kv.push(key, self._value((1,), 0))
            except pskv.UnknownKeyError:
                return
            raise AssertionError("push to an unknown key accepted")
        shape = self.model[key].shape
        arrays = [self._value(shape, v) for v in values]
        if bad_shape:
            arrays.append(self._value((5, 5), 1))
            try:
                self.kv.push(key, arrays)
            except pskv.ShapeMismatchError:
                return
            raise AssertionError("bad shape accepted")
        handle = self.kv.push(key, arrays, priority=priority, block=block)
        merged = sum(arrays)
        self.model[key] = self.model[key] + merged if self.updater_on else merged
        if handle is not None and priority % 2:
            handle.wait(10)

    @rule(key=KEYS, devices=st.integers(min_value=1, max_value=3))
    def pull(self, key: str, devices: int) -> None:
        if key not in self.model:
            return
        outs = [np.zeros(self.model[key].shape) for _ in range(devices)]
        self.kv.pull(key, out=outs)
        for o in outs:
            np.testing.assert_array_equal(o, self.model[key])

    @rule(key=KEYS, v=SMALL)
    def pushpull_in_place(self, key: str, v: int) -> None:
        if key not in self.model:
            return
        values = [self._value(self.model[key].shape, v) for _ in range(2)]
        self.kv.pushpull(key, values)
        self.model[key] = self.model[key] + 2 * v if self.updater_on else 2 * self._value(self.model[key].shape, v)
        np.testing.assert_array_equal(values[1], self.model[key])

    @rule(key=KEYS, shape=SHAPES, v=SMALL)
    def broadcast(self, key: str, shape: tuple[int, ...], v: int) -> None:
        if key in self.model:
            shape = self.model[key].shape
        out = np.zeros(shape)
        self.kv.broadcast(key, self._value(shape, v), out=out)
        self.model[key] = self._value(shape, v)
        np.testing.assert_array_equal(out, self.model[key])

    @precondition(lambda self: not self.updater_on)
    @rule()
    def install_accumulating_updater(self) -> None:
        self.kv.set_updater(lambda key, merged, stored: stored.__iadd__(merged))
        self.updater_on = True

    @rule(key=KEYS, rows=st.lists(st.integers(min_value=0, max_value=2), max_size=4))
    def row_sparse_pull(self, key: str, rows: list[int]) -> None:
        if key not in self.model or self.model[key].ndim < 2:
            return
        value = self.model[key]
        out = np.full(value.shape, 99.0)
        try:
            self.kv.row_sparse_pull(key, out=out, row_ids=rows)
        except pskv.InvalidArgumentError:
            assert any(r >= value.shape[0] for r in rows)
            return
        want = np.zeros_like(value)
        want[sorted(set(rows))] = value[sorted(set(rows))]
        np.testing.assert_array_equal(out, want)

    @invariant()
    def store_equals_model(self) -> None:
        self.kv.wait(timeout=10)
        for key, value in self.model.items():
            np.testing.assert_array_equal(self.kv.pull(key), value)


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestStoreMachine = StoreMachine.TestCase
