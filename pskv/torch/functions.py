"""Whole-model helpers: ``broadcast_parameters``, ``broadcast_optimizer_state``, objects between ranks.

Horovod's ``horovod/torch/functions.py`` semantics: parameters and optimizer state go from
``root_rank`` to every rank in place (one store call for all tensors), an optimizer's
scalar state and ``param_groups`` options (learning rate, momentum, ...) travel as one
pickled object. An optimizer that has no state even after one step (plain SGD) is left
as it is, its options included, as in Horovod.

**Trust:** :func:`broadcast_object` and :func:`allgather_object` unpickle bytes that
other ranks of the same job sent, as Horovod does (its ranks are members of one job,
started by one launcher). Unpickling runs code of the sender's choosing: never use them
in a job whose ranks you do not trust (pskv's own wire protocol never unpickles). Each
object is bounded by :data:`pskv.torch.gather.MAX_BYTES`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

import torch

from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.torch import ops
from pskv.torch.gather import allgather_bytes, broadcast_bytes
from pskv.torch.runtime import current

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def broadcast_parameters(params: Any, root_rank: int, prefix: str = "") -> None:
    """Copy rank ``root_rank``'s parameters into every rank's, in place.

    Args:
        params: ``model.state_dict()`` (sorted by name, as Horovod), ``model.named_parameters()``
            or ``model.parameters()`` (a list or any iterable; unnamed tensors are numbered in order).
        root_rank: the rank whose values everyone gets.
        prefix: put before every name (BytePS's argument).

    Raises:
        InvalidArgumentError: ``params`` is not a dict or an iterable of tensors / (name, tensor) pairs.
    """
    if isinstance(params, dict):
        pairs = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        pairs = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise InvalidArgumentError(f"invalid params of type: {type(params).__qualname__}")
    if not pairs:
        return
    for name, p in pairs:
        if not isinstance(p, torch.Tensor):
            raise InvalidArgumentError(f"broadcast_parameters: {name!r} is a {type(p).__qualname__}, not a tensor")
    tensors = [p.detach() for _, p in pairs]  # written in place: the parameters' own memory
    names = [None if n is None else f"{prefix}{n}" for n, _ in pairs]
    ops.synchronize(ops.grouped_broadcast_async_(tensors, root_rank, names))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: torch.nn.Module | None = None,
                              prefix: str = "") -> None:
    """Copy rank ``root_rank``'s optimizer state (tensors, scalars, ``param_groups`` options) into every rank's.

    A new optimizer's state is made first by one step with zero gradients (no
    communication: a DistributedOptimizer's wrapped optimizer steps), as Horovod does;
    ``model`` names the sparse embeddings whose zero gradients are sparse (Horovod's
    argument). ``prefix``: put before every name (BytePS's argument). An optimizer
    that has no state even after that step (plain SGD) is left as it is, its options
    included, as in Horovod.

    Raises:
        NotSupportedError: ``torch.optim.LBFGS`` (its state is not per parameter; Horovod refuses it too).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise NotSupportedError("broadcast_optimizer_state: cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _make_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer (plain SGD): nothing sent, not even the options (as Horovod)
    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, Any] = {}
    setters: dict[str, Callable[[Any], None]] = {}
    for index, group in enumerate(state_dict["param_groups"]):
        for option, value in group.items():
            if option != "params":
                scalars[f"{option}.{index}"] = value
                setters[f"{option}.{index}"] = _option_setter(optimizer, index, option)
        for pid in group["params"]:
            for field, value in state_dict["state"].get(pid, {}).items():
                key = f"{field}.{index}.{pid}"
                if isinstance(value, torch.Tensor):
                    tensors.append((key, value))
                else:
                    scalars[key] = value
                    setters[key] = _state_setter(optimizer, state_dict, pid, field)
    broadcast_parameters(tensors, root_rank, prefix=f"{prefix}optimizer.")
    for key, value in broadcast_object(scalars, root_rank, name=f"{prefix}optimizer.scalars").items():
        setters[key](value)


def _make_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """One step with zero gradients on the parameters that have none yet, then those gradients dropped."""
    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    make_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    zeroed = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if make_sparse or id(p) in sparse:
                    p.grad = p.grad.to_sparse()
                zeroed.append(p)
    _own_step(optimizer)()
    for p in zeroed:
        p.grad = None


def _own_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """The wrapped optimizer's own ``step``: a DistributedOptimizer's (a subclass made in :mod:`pskv.torch`)
    would reduce gradients, a collective that every rank would have to join."""
    for cls in type(optimizer).__mro__:
        step = vars(cls).get("step")
        if step is not None and not cls.__module__.startswith("pskv.torch"):
            return lambda: step(optimizer)
    return optimizer.step


def _option_setter(optimizer: torch.optim.Optimizer, index: int, option: str) -> Callable[[Any], None]:
    def assign(value: Any) -> None:
        optimizer.param_groups[index][option] = value
    return assign


def _state_setter(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any], pid: int,
                  field: str) -> Callable[[Any], None]:
    """Sets a scalar of a parameter's live state (``state_dict`` numbers the parameters in group order)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def assign(value: Any) -> None:
        optimizer.state[params[pid]][field] = value
    return assign


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Rank ``root_rank``'s ``obj`` (pickled) on every rank; the root gets its own ``obj`` back.

    ``name`` keys the transfer (default: one name for every call, not Horovod's type name, so
    ranks that pass ``None`` for the root's object still meet). Unpickles the root's bytes:
    see the module docstring on trust.

    Raises:
        InvalidArgumentError: the pickled object is over :data:`~pskv.torch.gather.MAX_BYTES` (every rank).
    """
    name = "broadcast_object" if name is None else name
    is_root = current().store.rank == root_rank
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if is_root else None
    received = broadcast_bytes(data, root_rank, f"object.{name}")
    return obj if is_root else pickle.loads(received)  # noqa: S301 - a rank of this job sent it (module docstring)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order, on every rank. Unpickles the other ranks' bytes:
    see the module docstring on trust."""
    name = "allgather_object" if name is None else name
    parts = allgather_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), f"object.{name}")
    return [pickle.loads(p) for p in parts]  # noqa: S301 - ranks of this job sent them (module docstring)
