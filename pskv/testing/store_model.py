"""Random sequences of store operations checked against a plain-dict model (hypothesis).

Every operation either succeeds and matches the model, or raises a pskv error and
leaves the store equal to the model — whatever mix of keys, shapes, blocking modes,
priorities and updaters the sequence uses. The machine drives a
:class:`~pskv.testing.stores.StoreGroup`: in a distributed store every worker makes the
same call at the same time, worker ``r`` contributing ``v + r`` where the model pushes
``v``, so a sum over workers is ``n v + n (n - 1) / 2``; ``init`` and ``broadcast``
take rank 0's value.

``hypothesis`` is a test dependency, not a dependency of pskv: this module imports it,
and nothing imports this module but tests (``pskv.testing`` does not).

Usage (pytest)::

    from pskv.testing.store_model import run_store_machine
    from pskv.testing.stores import local_store

    def test_model(): run_store_machine(local_store("local"))
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from pskv.errors import DuplicateKeyError, InvalidArgumentError, ShapeMismatchError, UnknownKeyError
from pskv.kvstore import KVStoreBase
from pskv.optimizer import SGD
from pskv.testing.stores import StoreSpec

__all__ = ["run_store_machine", "store_machine"]

TIMEOUT = 20.0
KEYS = ["a", "b", "c", "d"]
SHAPES = [(3,), (2, 2), (3, 2)]


keys = st.sampled_from(KEYS)
shapes = st.sampled_from(SHAPES)
small = st.integers(min_value=-4, max_value=4)


def _value(shape: tuple[int, ...], v: float) -> np.ndarray[Any, Any]:
    return np.full(shape, v, dtype=np.float64)


class StoreMachine(RuleBasedStateMachine):  # type: ignore[misc]
    """Stores of one spec and a dict ``{key: float64 array}`` side by side (subclassed per spec by
    :func:`store_machine`, which sets :attr:`spec`)."""

    spec: StoreSpec

    def __init__(self) -> None:
        super().__init__()
        self.group = self.spec.open()
        self.n = self.group.num_workers
        self.model: dict[str, np.ndarray[Any, Any]] = {}
        # What a push does to the stored value: None stores the sum; +1 / -1 add / subtract it.
        self.sign: int | None = None

    def teardown(self) -> None:
        self.group.close()

    def over_workers(self, values: list[int]) -> float:
        """The model's sum of ``values`` pushed by every worker (worker r adds r to each)."""
        return float(sum(self.n * v + self.n * (self.n - 1) // 2 for v in values))

    def after_push(self, key: str, merged: float) -> None:
        current = self.model[key]
        self.model[key] = _value(current.shape, merged) if self.sign is None else current + self.sign * merged

    @rule(key=keys, shape=shapes, v=small)
    def init(self, key: str, shape: tuple[int, ...], v: int) -> None:
        def call(kv: KVStoreBase) -> str:
            try:
                kv.init(key, _value(shape, v + kv.rank))
            except DuplicateKeyError:
                return "duplicate"
            return "created"
        outcome = self.group.run(call)
        assert outcome == ["duplicate" if key in self.model else "created"] * self.n, outcome
        if key not in self.model:
            self.model[key] = _value(shape, v)

    @rule(key=keys, values=st.lists(small, min_size=1, max_size=4), bad_shape=st.booleans(),
          block=st.booleans(), priority=small)
    def push(self, key: str, values: list[int], bad_shape: bool, block: bool, priority: int) -> None:
        if key not in self.model:
            def unknown(kv: KVStoreBase) -> bool:
                try:
                    kv.push(key, _value((1,), 0))
                except UnknownKeyError:
                    return True
                return False
            assert all(self.group.run(unknown)), "push to an unknown key accepted"
            return
        shape = self.model[key].shape

        def call(kv: KVStoreBase) -> bool:
            arrays = [_value(shape, v + kv.rank) for v in values]
            if bad_shape:
                try:
                    kv.push(key, [*arrays, _value((5, 5), 1)])
                except ShapeMismatchError:
                    return True
                return False
            handle = kv.push(key, arrays, priority=priority, block=block)
            if handle is not None and priority % 2:
                handle.wait(TIMEOUT)
            return True
        assert all(self.group.run(call)), "a push with a bad shape was accepted"
        if not bad_shape:
            self.after_push(key, self.over_workers(values))

    @rule(key=keys, devices=st.integers(min_value=1, max_value=3))
    def pull(self, key: str, devices: int) -> None:
        if key not in self.model:
            return
        shape = self.model[key].shape

        def call(kv: KVStoreBase) -> list[np.ndarray[Any, Any]]:
            outs = [np.zeros(shape) for _ in range(devices)]
            kv.pull(key, out=outs)
            return outs
        for outs in self.group.run(call):
            for o in outs:
                np.testing.assert_array_equal(o, self.model[key])

    @rule(key=keys, v=small, into_out=st.booleans())
    def pushpull(self, key: str, v: int, into_out: bool) -> None:
        if key not in self.model:
            return
        shape = self.model[key].shape

        def call(kv: KVStoreBase) -> list[np.ndarray[Any, Any]]:
            values = [_value(shape, v + kv.rank) for _ in range(2)]
            if into_out:
                out = np.zeros(shape)
                kv.pushpull(key, values, out=out)
                return [out]
            kv.pushpull(key, values)
            return values
        results = self.group.run(call)
        self.after_push(key, self.over_workers([v, v]))
        for arrays in results:
            for a in arrays:
                np.testing.assert_array_equal(a, self.model[key])

    @rule(key=keys, shape=shapes, v=small)
    def broadcast(self, key: str, shape: tuple[int, ...], v: int) -> None:
        if key in self.model:
            shape = self.model[key].shape

        def call(kv: KVStoreBase) -> np.ndarray[Any, Any]:
            out = np.zeros(shape)
            kv.broadcast(key, _value(shape, v + kv.rank), out=out)
            return out
        results = self.group.run(call)
        self.model[key] = _value(shape, v)
        for out in results:
            np.testing.assert_array_equal(out, self.model[key])

    @precondition(lambda self: self.sign is None and not self.spec.store_type.distributed)
    @rule()
    def install_accumulating_updater(self) -> None:
        self.group.run(lambda kv: kv.set_updater(lambda key, merged, stored: stored.__iadd__(merged)))
        self.sign = 1

    @precondition(lambda self: self.sign is None and self.spec.store_type.servers_optimize)
    @rule()
    def install_sgd(self) -> None:
        self.group.run(lambda kv: kv.set_optimizer(SGD(learning_rate=1.0)))
        self.sign = -1

    @rule(key=keys, rows=st.lists(st.integers(min_value=0, max_value=2), max_size=4))
    def row_sparse_pull(self, key: str, rows: list[int]) -> None:
        if key not in self.model or self.model[key].ndim < 2:
            return
        value = self.model[key]

        def call(kv: KVStoreBase) -> np.ndarray[Any, Any] | None:
            out = np.full(value.shape, 99.0)
            try:
                kv.row_sparse_pull(key, out=out, row_ids=rows)
            except InvalidArgumentError:
                return None
            return out
        in_range = all(r < value.shape[0] for r in rows)
        want = np.zeros_like(value)
        if in_range:
            want[sorted(set(rows))] = value[sorted(set(rows))]
        for out in self.group.run(call):
            if out is None:
                assert not in_range, f"rows {rows} refused for shape {value.shape}"
            else:
                assert in_range, f"rows {rows} accepted for shape {value.shape}"
                np.testing.assert_array_equal(out, want)

    @invariant()
    def store_equals_model(self) -> None:
        model = dict(self.model)

        def call(kv: KVStoreBase) -> dict[str, Any]:
            kv.wait(timeout=TIMEOUT)
            return {key: kv.pull(key) for key in model}
        for pulled in self.group.run(call):
            for key, value in model.items():
                np.testing.assert_array_equal(pulled[key], value)



def store_machine(spec: StoreSpec) -> type[StoreMachine]:
    """A hypothesis ``RuleBasedStateMachine`` class driving stores of ``spec`` and a dict model.

    Each example opens a new group of ``spec`` and closes it in ``teardown``.
    """
    return type(f"StoreMachine[{spec.id}]", (StoreMachine,), {"spec": spec})


def run_store_machine(spec: StoreSpec, *, max_examples: int = 30, steps: int = 25) -> None:
    """Run :func:`store_machine` of ``spec`` as a test: ``max_examples`` sequences of up to ``steps`` calls.

    Raises:
        AssertionError: a (shrunk) sequence on which the store and the model disagree.
    """
    run_state_machine_as_test(store_machine(spec), settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow]))
