"""The updater: per-key optimizer state plus the ``updater(key, grad, weight)`` call.

The updater owns the per-key state arrays; the optimizer owns the hyperparameters and
the per-key update counts. :meth:`Updater.set_optimizer` swaps the hyperparameters
and keeps both the states and the counts.

Placement of states: a state is created on the backend and device of its weight.
Loaded states (:meth:`Updater.load_states`) stay as CPU NumPy arrays until the key's
next update, which converts them to the weight's backend, device and dtype. The
same happens whenever the weight's backend, device or dtype, or the optimizer's
state layout, changes: arrays are matched by name (``"momentum"``, ``"mean"``, ...),
arrays the new layout lacks are dropped, new ones start as the optimizer's fresh
state (zeros, or a float32 copy of the weight for ``"weight32"``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import numpy as np

from pskv.arrays import FLOAT_DTYPES, ArrayMeta, describe
from pskv.arrays.rowsparse import RowSparse, coo_parts, is_row_sparse
from pskv.errors import (
    DTypeMismatchError,
    InvalidArgumentError,
    OptimizerStateError,
    ShapeMismatchError,
    UnsupportedValueError,
)
from pskv.optimizer import _math, states
from pskv.optimizer._validate import check_key
from pskv.optimizer.base import Key, Optimizer, State
from pskv.optimizer.rows import check_rows

__all__ = ["Updater", "get_updater", "install_optimizer", "updater_from_states"]

_OP = "optimizer update"


@dataclass
class _Plan:
    key: Key
    weight: Any
    grad: Any
    state: State
    layout: tuple[tuple[str, ...], ArrayMeta]
    fresh: bool
    rows: np.ndarray[Any, Any] | None = None  # a row-sparse gradient's row ids (grad holds those rows)


def _signature(x: Any) -> tuple[Any, ...] | None:
    """A cheap identity of an array's kind, shape, dtype and device (``None``: use the full checks)."""
    if type(x) is np.ndarray:
        return (None, x.shape, x.dtype)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return (x.device, x.shape, x.dtype)
    return None


def _describe(key: Key, what: str, x: Any) -> ArrayMeta:
    try:
        return describe(x)
    except UnsupportedValueError as exc:
        raise UnsupportedValueError(f"{_OP} of key {key!r}: {what}: {exc}") from None


class Updater:
    """Apply an optimizer to weights by key, keeping per-key state.

    Args:
        optimizer: the optimizer to drive.

    Raises:
        InvalidArgumentError: ``optimizer`` is not an :class:`Optimizer`.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer, Optimizer):
            raise InvalidArgumentError(f"Updater needs an Optimizer, got {optimizer!r}")
        self.optimizer = optimizer
        self.states: dict[Key, State] = {}
        self._layout: dict[Key, tuple[tuple[str, ...], ArrayMeta]] = {}
        self._pending: dict[Key, states.KeyStates] = {}
        # key -> signature of the weight (and gradient) its last update was validated for
        self._checked: dict[Key, tuple[Any, ...]] = {}

    # ------------------------------------------------------------------ update
    def __call__(self, key: Key | Sequence[Key], grad: Any, weight: Any) -> None:
        """Update ``weight`` in place from ``grad``; lists of keys / grads / weights are accepted.

        Everything is validated (and states prepared) before any weight or state is
        modified, so a failing call changes nothing.

        Args:
            key: a store key, or a list of keys.
            grad: the gradient (or a list), same shape and dtype as the weight; on
                another backend / device it is copied next to the weight. A
                row-sparse gradient (a :class:`~pskv.arrays.rowsparse.RowSparse` or a
                torch sparse COO tensor) goes to :meth:`update_rows` (MXNet's
                ``row_sparse`` gradients; lazy with ``lazy_update``).
            weight: the weight (or a list), updated in place.

        Raises:
            KeyTypeError: a key is neither int nor str.
            UnsupportedValueError: not arrays, or not a floating-point dtype.
            ShapeMismatchError: grad and weight shapes differ, or the weight's shape
                changed since the key's state was created.
            DTypeMismatchError: grad and weight dtypes differ.
            OptimizerStateError: a loaded state does not fit the weight.
            InvalidArgumentError: list arguments of different lengths.
        """
        if isinstance(key, (list, tuple)):
            if not isinstance(grad, (list, tuple)) or not isinstance(weight, (list, tuple)):
                raise InvalidArgumentError("with a list of keys, grad and weight must be lists too")
            if not len(key) == len(grad) == len(weight):
                raise InvalidArgumentError(
                    f"{len(key)} keys, {len(grad)} gradients and {len(weight)} weights: lengths must match"
                )
            keys = [check_key(k) for k in key]
            if len(set(keys)) != len(keys):
                raise InvalidArgumentError(f"duplicate keys in one updater call: {keys!r}")
            plans = [self._prepare_any(k, g, w) for k, g, w in zip(keys, grad, weight, strict=True)]
        else:
            plans = [self._prepare_any(check_key(key), grad, weight)]
        self._run(plans)

    def update_rows(self, key: Key | Sequence[Key], indices: Any, grad_rows: Any, weight: Any) -> None:
        """Update ``weight`` in place from a row-sparse gradient (:meth:`Optimizer.update_rows`).

        The gradient holds the rows ``indices`` (sorted, unique) as ``grad_rows``; every
        other row is zero. With the optimizer's ``lazy_update`` only those rows of the
        weight and of its state change. Lists of keys / indices / rows / weights are
        accepted; everything is validated before any weight or state changes.

        Raises:
            KeyTypeError, UnsupportedValueError, OptimizerStateError: as :meth:`__call__`.
            InvalidTypeError, InvalidArgumentError, ShapeMismatchError, DTypeMismatchError:
                the row ids or rows do not fit the weight (see :func:`~pskv.optimizer.rows.check_rows`).
        """
        if isinstance(key, (list, tuple)):
            lists = (indices, grad_rows, weight)
            if not all(isinstance(x, (list, tuple)) and len(x) == len(key) for x in lists):
                raise InvalidArgumentError("with a list of keys, indices, grad_rows and weight must be lists of "
                                           "the same length")
            keys = [check_key(k) for k in key]
            if len(set(keys)) != len(keys):
                raise InvalidArgumentError(f"duplicate keys in one updater call: {keys!r}")
            self._run([self._prepare_rows(*args) for args in zip(keys, indices, grad_rows, weight, strict=True)])
        else:
            self._run([self._prepare_rows(check_key(key), indices, grad_rows, weight)])

    def update_batch(self, dense: Sequence[tuple[Key, Any, Any]], rows: Sequence[tuple[Key, Any, Any, Any]]) -> None:
        """One call for ``(key, grad, weight)`` dense updates and ``(key, indices, grad_rows, weight)`` row updates.

        Every key is validated (states prepared) before any weight or state changes; the
        keys must be distinct. This is what a store runs for a push of several keys.

        Raises:
            InvalidArgumentError: a key is listed twice; otherwise as :meth:`__call__` and
                :meth:`update_rows`.
        """
        keys = [check_key(k) for k, *_ in dense] + [check_key(k) for k, *_ in rows]
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError(f"duplicate keys in one updater call: {keys!r}")
        plans = [self._prepare_any(check_key(k), g, w) for k, g, w in dense]
        plans += [self._prepare_rows(check_key(k), i, g, w) for k, i, g, w in rows]
        self._run(plans)

    def _run(self, plans: Sequence[_Plan]) -> None:
        """Install the fresh states of validated plans, then update (dense plans together, then row plans)."""
        opt = self.optimizer
        for plan in plans:
            if plan.fresh:
                self.states[plan.key] = plan.state
                self._layout[plan.key] = plan.layout
                self._pending.pop(plan.key, None)
                if plan.rows is None:
                    self._remember(plan.key, plan.weight, plan.grad)
                else:
                    self._checked.pop(plan.key, None)
        dense = [p for p in plans if p.rows is None]
        if type(opt).update is not Optimizer.update:  # a custom optimizer with its own update()
            for plan in dense:
                opt.update(plan.key, plan.weight, plan.grad, plan.state)
        elif dense:
            opt._apply([(p.key, p.weight, p.grad, p.state or (), opt._uses_master(p.layout[1].dtype)) for p in dense])
        for plan in plans:
            if plan.rows is not None:
                opt.update_rows(plan.key, plan.weight, plan.rows, plan.grad, plan.state)

    def _prepare_rows(self, key: Key, indices: Any, grad_rows: Any, weight: Any) -> _Plan:
        wmeta = _describe(key, "weight", weight)
        if wmeta.dtype not in FLOAT_DTYPES:
            raise UnsupportedValueError(
                f"{_OP} of key {key!r}: dtype {wmeta.dtype} is not a floating-point dtype "
                f"(supported: {', '.join(sorted(FLOAT_DTYPES))})"
            )
        ids, grad_rows = check_rows(key, wmeta, indices, grad_rows)
        layout = (self.optimizer.state_names(wmeta), wmeta)
        if key not in self._pending and self._layout.get(key) == layout:
            return _Plan(key, weight, grad_rows, self.states[key], layout, False, ids)
        state = self._rebuild(key, weight, wmeta, layout[0])
        return _Plan(key, weight, grad_rows, state, layout, True, ids)

    def _prepare_any(self, key: Key, grad: Any, weight: Any) -> _Plan:
        """A dense gradient's plan, or a row-sparse one's (RowSparse, torch sparse COO: MXNet's row_sparse)."""
        if not is_row_sparse(grad):
            return self._prepare(key, grad, weight)
        wmeta = _describe(key, "weight", weight)
        gshape = tuple(grad.shape)
        if gshape != wmeta.shape:
            raise ShapeMismatchError(key, _OP, wmeta.shape, gshape)
        ids, rows = (grad.indices, grad.data) if isinstance(grad, RowSparse) else coo_parts(grad)
        return self._prepare_rows(key, ids, rows, weight)

    def _prepare(self, key: Key, grad: Any, weight: Any) -> _Plan:
        checked = self._checked.get(key)
        if checked is not None:  # fast path: same kind, shape, dtype and device as last time
            sig = _signature(weight)
            if sig == checked and _signature(grad) == sig:
                layout = self._layout[key]
                if self.optimizer.state_names(layout[1]) == layout[0]:
                    return _Plan(key, weight, grad, self.states[key], layout, False)
        wmeta = _describe(key, "weight", weight)
        gmeta = _describe(key, "gradient", grad)
        if wmeta.dtype not in FLOAT_DTYPES:
            raise UnsupportedValueError(
                f"{_OP} of key {key!r}: dtype {wmeta.dtype} is not a floating-point dtype "
                f"(supported: {', '.join(sorted(FLOAT_DTYPES))})"
            )
        if gmeta.shape != wmeta.shape:
            raise ShapeMismatchError(key, _OP, wmeta.shape, gmeta.shape)
        if gmeta.dtype != wmeta.dtype:
            raise DTypeMismatchError(key, _OP, wmeta.dtype, gmeta.dtype)
        layout = (self.optimizer.state_names(wmeta), wmeta)
        if key not in self._pending and self._layout.get(key) == layout:
            grad = _math.to_backend(grad, wmeta)
            self._remember(key, weight, grad)
            return _Plan(key, weight, grad, self.states[key], layout, False)
        state = self._rebuild(key, weight, wmeta, layout[0])
        return _Plan(key, weight, _math.to_backend(grad, wmeta), state, layout, True)

    def _remember(self, key: Key, weight: Any, grad: Any) -> None:
        """Let the next update of ``key`` skip the checks if it brings arrays like these.

        Only called once ``key``'s state and layout are those of ``weight``.
        """
        sig = _signature(weight)
        if sig is None or _signature(grad) != sig:
            self._checked.pop(key, None)
        else:
            self._checked[key] = sig

    def _rebuild(self, key: Key, weight: Any, wmeta: ArrayMeta, names: tuple[str, ...]) -> State:
        """A state in the current layout for ``weight``, carrying over same-named arrays."""
        source: dict[str, Any] = {}
        pending = self._pending.get(key)
        if pending is not None:
            for name, arr in zip(pending.names, pending.values(), strict=True):
                if arr.shape != wmeta.shape:
                    raise OptimizerStateError(
                        f"loaded optimizer state {name!r} of key {key!r} has shape {arr.shape}, "
                        f"but the weight has shape {wmeta.shape}"
                    )
                source[name] = arr
        elif key in self._layout:
            old_names, old_meta = self._layout[key]
            if old_meta.shape != wmeta.shape:
                raise ShapeMismatchError(key, _OP, old_meta.shape, wmeta.shape)
            source = dict(zip(old_names, self.states.get(key) or (), strict=True))
        state = self.optimizer.create_state(key, weight)
        for name, arr in zip(names, state or (), strict=True):
            if name in source:
                _math.copy_cast(arr, source[name])
        return state

    # --------------------------------------------------------------- optimizer
    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Use ``optimizer`` from now on, keeping the per-key states and update counts.

        Args:
            optimizer: the new optimizer (typically the same kind with new hyperparameters).

        Raises:
            InvalidArgumentError: ``optimizer`` is not an :class:`Optimizer`.
        """
        if not isinstance(optimizer, Optimizer):
            raise InvalidArgumentError(f"set_optimizer needs an Optimizer, got {optimizer!r}")
        if optimizer is not self.optimizer:
            optimizer.set_update_counts(self.optimizer.update_counts, self.optimizer.num_update)
            self.optimizer = optimizer

    # ------------------------------------------------------------------ states
    def _document(self, dump_optimizer: bool) -> states.StatesDocument:
        opt = self.optimizer
        keys = list(dict.fromkeys([*self.states, *self._pending, *opt.update_counts]))
        entries = []
        for k in keys:
            count = opt.get_update_count(k)
            pending = self._pending.get(k)
            if pending is not None:
                entries.append(replace(pending, count=count))
                continue
            names = self._layout[k][0] if k in self._layout else ()
            encoded = [states.encode_array(a) for a in (self.states.get(k) or ())]
            entries.append(
                states.KeyStates(k, count, names, tuple(d for _, d in encoded), tuple(a for a, _ in encoded))
            )
        config = opt.to_config() if dump_optimizer else None
        return states.StatesDocument(opt.num_update, tuple(entries), config)

    def _restore(self, doc: states.StatesDocument) -> None:
        opt = self.optimizer
        if doc.optimizer is not None:
            try:
                opt = Optimizer.from_config(doc.optimizer)
            except InvalidArgumentError as exc:
                raise OptimizerStateError(f"the optimizer config in the state file is invalid: {exc}") from exc
        opt.set_update_counts({ks.key: ks.count for ks in doc.keys}, doc.num_update)
        self.optimizer = opt
        self.states = {}
        self._layout = {}
        self._checked = {}
        self._pending = {ks.key: ks for ks in doc.keys if ks.names}

    def get_states(self, dump_optimizer: bool = False) -> bytes:
        """The states, counts (and optionally the optimizer config) as state-file bytes.

        Args:
            dump_optimizer: include ``optimizer.to_config()``.
        """
        return states.dumps(self._document(dump_optimizer))

    def set_states(self, data: bytes) -> None:
        """Restore from :meth:`get_states` bytes (see :meth:`load_states`).

        Raises:
            OptimizerStateError: the bytes are not a valid state file.
        """
        self._restore(states.loads(data))

    def document(self, dump_optimizer: bool = False) -> states.StatesDocument:
        """The states and counts (and optionally the optimizer config) as a state document.

        Its arrays may be the live states (a caller that keeps them past the next update copies them).
        """
        return self._document(dump_optimizer)

    def restore(self, doc: states.StatesDocument) -> None:
        """Replace all states and counts with ``doc``'s (as :meth:`load_states` does with a file's).

        Raises:
            OptimizerStateError: ``doc`` holds an invalid optimizer config.
        """
        self._restore(doc)

    def save_states(self, fname: str | os.PathLike[str], dump_optimizer: bool = False) -> None:
        """Write the states and counts to ``fname`` atomically (safetensors, no pickle).

        Args:
            fname: the file to write (replaced if it exists).
            dump_optimizer: also store ``optimizer.to_config()``.
        """
        states.save(fname, self._document(dump_optimizer))

    def load_states(self, fname: str | os.PathLike[str]) -> None:
        """Replace all states and counts with those in ``fname``.

        If the file holds an optimizer config, the optimizer is replaced by
        ``Optimizer.from_config`` of it. States are placed next to their weights on
        each key's next update.

        Raises:
            OptimizerStateError: the file is not a valid state file.
            OSError: the file cannot be read.
        """
        self._restore(states.load(fname))


def get_updater(optimizer: Optimizer) -> Updater:
    """An :class:`Updater` for ``optimizer``.

    Args:
        optimizer: the optimizer to drive.

    Raises:
        InvalidArgumentError: ``optimizer`` is not an :class:`Optimizer`.
    """
    return Updater(optimizer)


StatesSource: TypeAlias = str | os.PathLike[str] | bytes | states.StatesDocument


def install_optimizer(current: object, optimizer: Optimizer) -> Updater:
    """The updater to use once ``optimizer`` is set, where ``current`` was in use before.

    If ``current`` is already an :class:`Updater`, it takes the new hyperparameters and
    keeps its per-key states and update counts (:meth:`Updater.set_optimizer`) and is
    returned; otherwise (no updater, or a user's own function) a fresh updater is.

    Args:
        current: the updater in use (any callable), or None.
        optimizer: the optimizer to use from now on.

    Raises:
        InvalidArgumentError: ``optimizer`` is not an :class:`Optimizer`.
    """
    if isinstance(current, Updater):
        current.set_optimizer(optimizer)
        return current
    if not isinstance(optimizer, Optimizer):
        raise InvalidArgumentError(f"set_optimizer needs an Optimizer, got {optimizer!r}")
    return Updater(optimizer)


def updater_from_states(source: StatesSource, no_config: Exception | None = None) -> Updater:
    """A new updater built from a state file that carries its optimizer's config (``dump_optimizer=True``).

    The optimizer is ``Optimizer.from_config`` of the document's config; the states and
    update counts are the document's.

    Args:
        source: the state file's path, its bytes (:meth:`Updater.get_states`), or its
            parsed document.
        no_config: what to raise if the document holds no optimizer config (by default
            an :class:`OptimizerStateError`).

    Raises:
        OptimizerStateError: not a valid state file, or (without ``no_config``) it
            holds no optimizer config.
        InvalidArgumentError: the optimizer config is not a valid one.
        OSError: the file cannot be read.
    """
    if isinstance(source, states.StatesDocument):
        document = source
    elif isinstance(source, bytes):
        document = states.loads(source)
    else:
        document = states.load(source)
    if document.optimizer is None:
        raise no_config or OptimizerStateError("the optimizer state file holds no optimizer config")
    updater = Updater(Optimizer.from_config(document.optimizer))
    updater._restore(document)
    return updater
