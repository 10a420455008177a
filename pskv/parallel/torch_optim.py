"""The Trainer's optimizer argument, and a ``torch.optim.Optimizer`` as its local optimizer.

:func:`make_optimizer` turns the argument (a name, a pskv optimizer, a torch optimizer)
into the Trainer's optimizer; :func:`local_updater` gives what runs it on the worker. A
torch optimizer runs only there (``update_on_kvstore=False``): the store sums the gradients as for pskv's own optimizers; then every worker runs the
same torch optimizer on the same summed gradients, so parameters and optimizer state stay
identical on every rank (as with DDP or Horovod's ``DistributedOptimizer``). The rules:

* the gradient handed to ``optimizer.step()`` is the sum over devices and workers times
  the Trainer's ``rescale_grad`` (1 / global batch, as for pskv optimizers), written into
  the parameters' ``.grad`` (views of the Trainer's flat buckets) in place; a parameter
  that got no gradient this step has zeros there, not None (every worker pushes every
  key), so momentum and weight decay still move it, unlike plain torch which skips it;
* every parameter the optimizer holds that takes gradients must be one the Trainer
  trains (device 0's copy): an optimizer built over another copy of the model would
  silently train nothing, so it is refused;
* the servers cannot run a torch optimizer (its ``step()`` is Python code on the
  worker's tensors; only pskv optimizers travel as a JSON config), so
  ``update_on_kvstore=True`` — explicit, forced by an asynchronous store, or the
  default with a store that runs optimizers — is refused, naming the two ways out;
* its state is saved without pickle: tensors in a safetensors file, everything else
  (hyperparameters, scalar state) as JSON (format ``pskv.torch-optimizer-states``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pskv.errors import CheckpointError, InvalidArgumentError, InvalidTypeError, OptimizerStateError
from pskv.kvstore import KVStoreBase
from pskv.optimizer import Optimizer, Updater, get_updater
from pskv.optimizer import create as create_optimizer
from pskv.safefile import read_document, write_document

__all__ = ["TorchOptimizerStep", "local_updater", "make_optimizer", "FORMAT_NAME"]

FORMAT_NAME = "pskv.torch-optimizer-states"
FORMAT_VERSION = 1

REFUSAL = ("pskv cannot run a torch.optim optimizer ({name}) on the servers ({why}). Either pass "
           "update_on_kvstore=False: the store sums the gradients and {name}.step() runs on every worker; "
           "or wrap it: pskv.torch.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())")


class TorchOptimizerStep:
    """Runs ``optimizer.step()`` on the summed gradients of a Trainer's parameters.

    Stands where a pskv :class:`~pskv.optimizer.Optimizer` and its updater stand in the
    Trainer: ``rescale_grad``, ``learning_rate`` / ``set_learning_rate`` (every param
    group), no per-key ``lr_mult`` / ``wd_mult`` (torch's param groups carry those), a
    call with the device-0 gradients and weights, ``save_states`` / ``load_states``.

    Args:
        optimizer: the torch optimizer, built over the model's parameters.
        params: the parameters the Trainer trains (device 0's copies).

    Raises:
        InvalidArgumentError: the optimizer holds a parameter that takes gradients but
            is not one of ``params``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        trained = {id(p) for p in params}
        foreign = [p for group in optimizer.param_groups for p in group["params"]
                   if p.requires_grad and id(p) not in trained]
        if foreign:
            raise InvalidArgumentError(
                f"{len(foreign)} parameter(s) of the {type(optimizer).__name__} optimizer (shapes "
                f"{[tuple(p.shape) for p in foreign[:4]]}) are not parameters this Trainer trains: build the "
                "optimizer over the model given to the Trainer (a group's: group.replicas[0].parameters())")
        self.torch_optimizer = optimizer
        self.rescale_grad = 1.0
        self.lr_mult: dict[Any, float] = {}
        self.wd_mult: dict[Any, float] = {}

    @property
    def optimizer(self) -> TorchOptimizerStep:
        """Itself: it is both the Trainer's optimizer and its updater."""
        return self

    @property
    def learning_rate(self) -> float:
        """The first param group's ``lr``."""
        return float(self.torch_optimizer.param_groups[0]["lr"])

    def set_learning_rate(self, lr: float) -> None:
        """Set ``lr`` of every param group."""
        for group in self.torch_optimizer.param_groups:
            group["lr"] = lr

    def __call__(self, keys: Sequence[Any], grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]) -> None:
        """Scale the summed gradients (the flat buckets the ``.grad`` views live in) by
        ``rescale_grad`` and step the torch optimizer; ``keys`` and ``weights`` are the
        buckets', the parameters are the optimizer's."""
        with torch.no_grad():
            for g in grads:
                g.mul_(self.rescale_grad)
        self.torch_optimizer.step()

    def save_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer's ``state_dict()`` to ``fname`` (no pickle; ``dump_optimizer`` is
        accepted for the Trainer's sake: the hyperparameters are always in it).

        Raises:
            OptimizerStateError: a hyperparameter or state entry that is neither a tensor nor JSON.
        """
        tensors, doc = _encode(self.torch_optimizer.state_dict())
        write_document(os.fspath(fname), FORMAT_NAME, FORMAT_VERSION, doc, tensors)

    def load_states(self, fname: str) -> None:
        """Load what :meth:`save_states` wrote into the optimizer.

        Raises:
            CheckpointError: not such a file (naming it).
            OptimizerStateError: the state does not fit this optimizer (other parameter groups or sizes).
        """
        doc, tensors = read_document(os.fspath(fname), FORMAT_NAME, FORMAT_VERSION,
                                     what="pskv torch optimizer state file")
        state_dict = _decode(doc, tensors)
        try:
            self.torch_optimizer.load_state_dict(state_dict)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise OptimizerStateError(f"{fname} does not fit this {type(self.torch_optimizer).__name__}: {exc}") from exc


def _encode(state_dict: Mapping[str, Any]) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, Any]]:
    """Tensors ``"<param>/<name>"`` (float32 for the dtypes NumPy lacks) and the JSON rest."""
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    state: dict[str, dict[str, Any]] = {}
    for index, entries in state_dict["state"].items():
        state[str(index)] = {}
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}/{name}"] = _to_numpy(value)
                state[str(index)][name] = {"tensor": f"{index}/{name}", "dtype": str(value.dtype).removeprefix("torch.")}
            else:
                state[str(index)][name] = {"value": _json(value, f"state {name!r}")}
    groups = [{k: _json(v, f"param group entry {k!r}") for k, v in g.items()} for g in state_dict["param_groups"]]
    return tensors, {"state": state, "param_groups": groups}


def _to_numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # NumPy has none; float32 holds every value (the dtype is recorded)
        t = t.float()
    return t.contiguous().numpy()  # (np.ascontiguousarray would make a 0-d step count 1-d)


def _json(value: Any, what: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json(v, what) for v in value]
    raise OptimizerStateError(f"cannot save {what} of a torch optimizer: {type(value).__name__} is neither a "
                              "tensor nor a JSON value")


def _decode(doc: Mapping[str, Any], tensors: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    """The ``state_dict`` :func:`_encode` took apart."""
    state: dict[int, dict[str, Any]] = {}
    try:
        for index, entries in doc["state"].items():
            state[int(index)] = {name: _tensor(tensors[e["tensor"]], e["dtype"]) if "tensor" in e else e["value"]
                                 for name, e in entries.items()}
        groups = [dict(g) for g in doc["param_groups"]]
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"a damaged torch optimizer state: {exc!r}") from exc
    return {"state": state, "param_groups": groups}


def _tensor(stored: np.ndarray[Any, Any], dtype_name: str) -> torch.Tensor:
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"no torch dtype {dtype_name!r}")
    return torch.from_numpy(np.array(stored)).to(dtype)


def make_optimizer(optimizer: str | Optimizer | torch.optim.Optimizer, optimizer_params: Mapping[str, Any] | None,
                   params: Sequence[torch.Tensor]) -> Optimizer | TorchOptimizerStep:
    """The Trainer's optimizer: the pskv optimizer given, the one named built with
    ``optimizer_params``, or a torch optimizer's :class:`TorchOptimizerStep` over ``params``.

    Raises:
        InvalidArgumentError: ``optimizer_params`` with a ready-made optimizer, or a torch
            optimizer whose parameters are not the Trainer's.
        InvalidTypeError: ``optimizer`` is none of these.
    """
    if isinstance(optimizer, str):
        return create_optimizer(optimizer, **dict(optimizer_params or {}))
    if not isinstance(optimizer, (Optimizer, torch.optim.Optimizer)):
        raise InvalidTypeError(f"optimizer must be a name, a pskv Optimizer or a torch.optim.Optimizer, "
                               f"got {type(optimizer).__name__}")
    if optimizer_params:
        raise InvalidArgumentError("optimizer_params only go with an optimizer name")
    return optimizer if isinstance(optimizer, Optimizer) else TorchOptimizerStep(optimizer, params)


def local_updater(optimizer: Optimizer | TorchOptimizerStep, update_on_kvstore: bool, requested: bool | None,
                  store: KVStoreBase | None) -> Updater | TorchOptimizerStep | None:
    """What runs the optimizer on this worker: None when the store runs it, the torch
    optimizer's step, or a pskv updater.

    Args:
        optimizer: the Trainer's optimizer.
        update_on_kvstore: the Trainer's mode, after MXNet's rules.
        requested: the ``update_on_kvstore`` argument given (None: the default).
        store: the Trainer's store (named in the refusal).

    Raises:
        InvalidArgumentError: a torch optimizer with ``update_on_kvstore`` (see the module docstring).
    """
    if not isinstance(optimizer, TorchOptimizerStep):
        return None if update_on_kvstore else get_updater(optimizer)
    if update_on_kvstore:
        kind = store.type if store is not None else None
        why = ("update_on_kvstore=True" if requested else
               f"update_on_kvstore is True by default with store {kind!r}" if store is None or store.store_type.sync
               else f"store {kind!r} is asynchronous: it applies every push on the servers, so only "
                    "pskv optimizers can train with it")
        raise InvalidArgumentError(REFUSAL.format(name=type(optimizer.torch_optimizer).__name__, why=why))
    return optimizer
