"""``hvd.elastic``: Horovod's elastic API on an elastic pskv job (``pskv launch -n MIN:MAX``, issue 24).

A Horovod elastic script runs with its import line changed (``import pskv.torch as hvd``)::

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for batch_idx, batch in enumerate(loader):
                ...; optimizer.step(); state.sampler.record_batch(batch_idx, batch_size)
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    train(state)

:func:`run` loops: ``state.sync()`` (rank 0's state to every rank), then ``func(state)``. A worker
that departs (dies, or leaves undrained) voids every step since the last commit on every server; the
others get :class:`~pskv.errors.MembershipChangedError` (also named :data:`HorovodInternalError`
here), adopt the new view (``kv.restore()``), put their state back to the last commit
(``state.restore()``) and redo from there. Workers that join are admitted at a commit:
``state.commit()`` raises :class:`WorkersAvailableException` on every member, and every member and
joiner syncs. A commit that only lost members (drained) raises :class:`HostsUpdatedInterrupt` with
``skip_sync=True``; one that a departure right after its release follows (some members hear of it from the
commit, the others from a refused call) with ``skip_sync=False``, as the others sync after their restore. After each, :func:`run` resets (``hvd.size()``, ``hvd.rank()``, every
DistributedOptimizer's pending step, the samplers' shares) and calls the reset callbacks (where a
script scales its learning rate by ``hvd.size()``).

**Two-phase commit.** :meth:`State.commit` saves into a pending copy, commits the store
(``kv.commit()``: every worker and server agree on this cut) and only then promotes the copy: a commit
that fails leaves the previous one as the restore point, matching the servers' snapshot.

**Deliberate differences from Horovod.** The reset is not ``shutdown(); init()``: a re-init renames
every key, and a joiner would name them apart from the others (:func:`pskv.torch.runtime.adopt_view`).
:meth:`State.check_host_updates` commits (in pskv joins and drains happen only at commits, where the
servers' snapshot matches the workers' saved state). A worker that joined registers the keys the
members made (the servers check them) until its first commit: names first used after that are new
keys for every worker alike. The objects of a state (and a sampler's position) travel in fixed-size
pieces, so that a joiner meets keys the members already made, whatever the objects' size. In an
elastic job ``DistributedOptimizer`` sends sparse gradients dense (which travel as rows is agreed by
a collective at the first step, which a joiner would make alone). Only an elastic job's stores with
servers take part (tests/torch/test_elastic_torch.py runs ``dist_sync``); the all-reduce stores
(``horovod``, ``nccl``) keep the model nowhere but in the workers and raise
:class:`~pskv.errors.NotSupportedError`, as does a job that is not elastic.

**Trust:** a sync unpickles rank 0's objects, as :func:`~pskv.torch.functions.broadcast_object` does.
"""

from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from pskv.errors import InvalidArgumentError, MembershipChangedError, NotSupportedError
from pskv.kvstore import KVStoreBase
from pskv.torch import ops, optimizer, runtime
from pskv.torch.elastic_sampler import ElasticSampler
from pskv.torch.functions import broadcast_optimizer_state, broadcast_parameters
from pskv.torch.gather import MAX_BYTES

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "WorkersAvailableException", "run"]

#: Horovod's name for what interrupts a step when a worker departs: here the store's MembershipChangedError.
HorovodInternalError = MembershipChangedError

_PIECE_WORDS = 1024  # int32 words per broadcast of a state's objects: one key of a fixed size (see the docstring)

R = TypeVar("R")


class HostsUpdatedInterrupt(RuntimeError):
    """The workers changed at a commit; the state is the committed one (no restore).

    Args:
        skip_sync: True when members only left (every rank already holds the same state).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the job's workers changed at a commit" + (" (only removals)" if skip_sync else ""))
        self.skip_sync = skip_sync


class WorkersAvailableException(HostsUpdatedInterrupt):
    """Workers joined at a commit: every rank syncs its state from rank 0 (Horovod's, ``skip_sync=False``)."""

    def __init__(self) -> None:
        super().__init__(skip_sync=False)


def elastic_store() -> KVStoreBase:
    """The store of ``pskv.torch``, checked to be an elastic job's.

    Raises:
        NotSupportedError: an all-reduce store, or a job that is not elastic (why, in the message).
    """
    job = runtime.current()
    if job.kind.allreduce:
        raise NotSupportedError(f"hvd.elastic on the {job.kind.name!r} store: elastic training needs servers that "
                                "keep the model while workers come and go (dist_sync under pskv launch -n MIN:MAX)")
    if not job.elastic:
        raise NotSupportedError("hvd.elastic: this job is not elastic: start it with pskv launch -n MIN:MAX "
                                "(its workers then commit, restore and adopt new members)")
    return job.store


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` run until it returns, through membership changes.

    Each round: ``state.sync()`` (unless the last interrupt said skip), then ``func``. On
    :class:`~pskv.errors.MembershipChangedError`: ``kv.restore()`` and ``state.restore()`` (the last
    commit); on :class:`HostsUpdatedInterrupt`: nothing (the commit is the state). Then the reset (see
    the module docstring) and ``state.on_reset()``.

    Raises:
        NotSupportedError: (when called) the store is not an elastic job's.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        store = elastic_store()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except MembershipChangedError:
                store.restore()
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            reset()
            state.on_reset()
    return wrapper


def reset() -> None:
    """After a membership change: ``hvd.size()``/``rank()`` anew, every DistributedOptimizer's step forgotten,
    and the handles of the voided operations dropped."""
    runtime.adopt_view()
    optimizer.reset_all()
    names = runtime.current().state.get("names")
    if names is not None:
        names.handles.clear()


def broadcast_state_object(obj: Any, name: str) -> Any:
    """Rank 0's ``obj`` on every rank, pickled and sent in pieces of a fixed size (keys declared once).

    :func:`~pskv.torch.functions.broadcast_object` keys its buffer by the object's size, so an object
    that grew would make a new key at a sync that a joiner (who registers only keys the members made)
    cannot make with them.

    Raises:
        InvalidArgumentError: (on every rank) rank 0's ``obj`` cannot be pickled, or is over :data:`MAX_BYTES`.
    """
    is_root = runtime.rank() == 0
    data: bytes | None = b""
    why = "see rank 0's error"
    if is_root:
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - told to every rank (a length of -1), or they would wait for it
            data, why = None, f"{type(exc).__name__}: {exc}"
    length = torch.tensor([-1 if data is None else len(data)], dtype=torch.int64)
    ops.broadcast_(length, 0, name=f"elastic.{name}.length")
    n, piece = int(length[0]), _PIECE_WORDS * 4
    if n < 0:  # every rank raises alike
        raise InvalidArgumentError(f"hvd.elastic state object {name!r}: rank 0's cannot be pickled ({why}); a sync "
                                   "sends a state's objects pickled: keep only picklable objects in it")
    if data is None or n > MAX_BYTES:  # bounded before anything is received (every rank raises alike)
        raise InvalidArgumentError(f"hvd.elastic state object {name!r}: rank 0's is {n} bytes pickled, over the "
                                   f"{MAX_BYTES}-byte limit of an object sync")
    received = bytearray()
    words = torch.zeros(_PIECE_WORDS, dtype=torch.int32)
    for start in range(0, n, piece):
        if is_root:
            chunk = data[start:start + piece]
            words.zero_()
            words.view(torch.uint8)[:len(chunk)] = torch.frombuffer(bytearray(chunk), dtype=torch.uint8)
        ops.broadcast_(words, 0, name=f"elastic.{name}.piece")
        received += words.view(torch.uint8)[:min(piece, n - start)].numpy().tobytes()
    return obj if is_root else pickle.loads(bytes(received))  # noqa: S301 - rank 0 of this job sent it


class State:
    """Horovod's elastic state: what :func:`run` saves at each commit, restores after a departure and syncs.

    Subclasses save into a pending copy (:meth:`save`), promoted once the store committed
    (:meth:`_promote`), and put the promoted copy back (:meth:`restore`).
    """

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Call each of ``callbacks`` after every membership change (e.g. to scale the LR by ``hvd.size()``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a membership change: :meth:`reset`, then the reset callbacks in order."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state and commit the job (a collective): the restore point of a later departure.

        Raises:
            MembershipChangedError: a member departed (:func:`run` restores and redoes).
            WorkersAvailableException: workers joined at this commit (every member syncs).
            HostsUpdatedInterrupt: (``skip_sync=True``) members were drained at this commit; (``skip_sync=False``)
                a member departed right after it (the others get MembershipChangedError; every rank syncs).
            pskv.WorkerDrained: (a ``SystemExit`` with code 0) this worker was drained: it left the job.
            NotSupportedError: the job is not elastic.
        """
        self.save()
        self._commit_saved()

    def check_host_updates(self) -> None:
        """Horovod's check for new or lost hosts: in pskv a commit (joins and drains happen only there).

        Raises:
            as :meth:`commit`.
        """
        self.save()
        self._commit_saved()

    def _commit_saved(self) -> None:
        store = elastic_store()
        before = store.view
        view = store.commit()  # a drained worker's raises pskv.WorkerDrained (SystemExit 0): run() lets it through
        self._promote()
        runtime.current().joining = False  # the store registers new keys with the members from now on
        if view is None:
            return
        if set(view.members) - set(before.members):
            raise WorkersAvailableException()
        # a departure right after the release (a voiding view) reaches the other members as MembershipChangedError,
        # and they sync after their restore: so must this one
        raise HostsUpdatedInterrupt(skip_sync=not view.voids)

    def save(self) -> None:
        """Copy the state into the pending copy (promoted by the next successful commit)."""

    def _promote(self) -> None:
        """The pending copy becomes the restore point."""

    def restore(self) -> None:
        """Put the state of the last commit back."""

    def sync(self) -> None:
        """Rank 0's state on every rank (the restore point too, on every rank)."""

    def reset(self) -> None:
        """After a membership change, before the reset callbacks."""


class ObjectState(State):
    """A state of plain Python objects: each keyword argument is an attribute, saved, restored and synced.

    Synced from rank 0 pickled (see the module docstring on trust).
    """

    def __init__(self, **kwargs: Any) -> None:
        self._saved_state = dict(kwargs)
        self._pending_state = dict(kwargs)
        self._set_attrs()
        super().__init__()

    def save(self) -> None:
        self._pending_state = {attr: _copied(attr, getattr(self, attr)) for attr in self._saved_state}

    def _promote(self) -> None:
        self._saved_state = self._pending_state

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._pending_state = broadcast_state_object(self._saved_state, "objects")
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, _copied(attr, value))


def _copied(attr: str, value: Any) -> Any:
    """A deep copy of state attribute ``attr`` (what a commit saves and a restore puts back).

    Raises:
        InvalidArgumentError: ``value`` cannot be copied (a lock, a file, a generator: named with its attribute).
    """
    try:
        return copy.deepcopy(value)
    except (TypeError, copy.Error, pickle.PicklingError) as exc:
        raise InvalidArgumentError(f"hvd.elastic state attribute {attr!r}: a {type(value).__name__} cannot be "
                                   f"copied ({exc}); a state keeps a copy of each attribute at every commit: keep "
                                   "only copyable, picklable objects in it") from exc


class _Handler:
    """How :class:`TorchState` saves, restores and syncs one of its torch objects."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value
        self.saved = self.pending = self.snapshot()

    def snapshot(self) -> Any:
        return copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        """Rank 0's object on every rank: each kind of handler below has its own broadcast."""
        raise NotImplementedError  # every handler made by _handler is a subclass that defines it

    def reset(self) -> None:
        """After a membership change (a sampler shares its epoch out again)."""


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0, prefix=f"elastic.{self.name}.")


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0, prefix=f"elastic.{self.name}.")


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_state_object(self.value.state_dict(), f"sampler.{self.name}"))

    def reset(self) -> None:
        self.value.reset()


def _handler(name: str, value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(name, value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(name, value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(name, value)
    return None


class TorchState(ObjectState):
    """Horovod's ``TorchState(model, optimizer, **kwargs)``: models, optimizers and ElasticSamplers (by
    their ``state_dict``), and any other keyword argument as an :class:`ObjectState` attribute.

    Synced from rank 0: parameters by ``broadcast_parameters``, optimizer state by
    ``broadcast_optimizer_state``, a sampler's position and the objects pickled. Assigning a new
    model or optimizer to its attribute (``state.model = ...``) makes it the one saved.
    """

    _handlers: dict[str, _Handler]

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {name: h for name, value in kwargs.items() if (h := _handler(name, value)) is not None}
        object.__setattr__(self, "_handlers", handlers)
        for name, h in handlers.items():
            object.__setattr__(self, name, h.value)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in handlers})

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def save(self) -> None:
        for h in self._handlers.values():
            h.pending = h.snapshot()
        super().save()

    def _promote(self) -> None:
        for h in self._handlers.values():
            h.saved = h.pending
        super()._promote()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self) -> None:
        for h in self._handlers.values():
            h.sync()
            h.saved = h.pending = h.snapshot()  # every rank holds rank 0's committed state now
        super().sync()

    def reset(self) -> None:
        for h in self._handlers.values():
            h.reset()
        super().reset()
