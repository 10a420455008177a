"""The servers run the optimizer: ``DistributedOptimizer(optimizer, named_parameters=..., update_on_kvstore=True)``.

The parameter server's classic mode for PyTorch users. Each parameter is a key on the
servers, created from rank 0's values at the first backward pass (so a
``broadcast_parameters`` or a checkpoint load after wrapping counts); the servers hold
a pskv optimizer (:mod:`pskv.optimizer`) with ``rescale_grad = 1 / size`` (``op=Average``;
1 with ``op=Sum``). During backward, a hook on each parameter counts its passes; once
every parameter of a bucket (parameters in reverse order, about ``bucket_bytes`` each)
has its gradient, the bucket goes as one non-blocking ``pushpull``: the gradients are
summed over the workers, the servers apply the optimizer, and the new weights land in
the parameters. ``step()`` sends what is left (a missing gradient as zeros, as
Horovod's wrapper does) and waits. There is no local step and no local optimizer state.

Which optimizers (:func:`pskv_optimizer_for`): a pskv optimizer runs as it is; a
``torch.optim`` optimizer is mapped to the pskv optimizer with the same formulas --
``SGD`` (momentum, ``weight_decay``, ``nesterov``; ``dampening=0``) to ``sgd`` / ``nag``,
``Adam`` (``amsgrad=False``) to ``adam``, ``AdamW`` to ``adamw`` -- with each param
group's ``lr`` and ``weight_decay`` as per-key multipliers. A group's ``lr`` changed by
an LR scheduler is sent to the servers before the next step's gradients (a collective
``set_optimizer``, after the previous step's updates are in). Anything else (another
class, ``maximize``, ``amsgrad``, ``dampening``) is refused with
:class:`~pskv.errors.InvalidArgumentError` naming the class and the way out
(``update_on_kvstore=False``), and so is a store without servers (the all-reduce store).
The servers run one optimizer for every key: several wrappers (models) share it, each key
with its own group's ``lr`` and ``weight_decay``; a wrapper that installs another class or
options replaces it, and the older wrappers still in use fail at their next step.

With ``overlap`` (:mod:`pskv.torch.cross_barrier`) ``step()`` returns once the last
bucket is sent; a parameter's update is waited for by :meth:`ServerUpdates.wait_for`
(the next forward's pre-hooks), or by ``synchronize()``.

Differences from the local wrapper: the gradients never come back (``.grad`` keeps this
rank's own), so norm clipping and ``GradScaler.unscale_`` cannot act on what the
servers apply; the weights change as their bucket's update lands (during backward, as
the pskv ``Trainer`` with ``update_on_kvstore``), not at ``step()``; sparse gradients
travel dense; ``compression`` is ``Compression.none`` or one of pskv's own (``Compression.twobit()``,
...: the keys are made with it, each worker pushes compressed with its residuals, the servers
decode, sum and apply the optimizer, as MXNet's ``update_on_kvstore`` with compression);
``Compression.fp16`` is refused. Once the
servers hold an optimizer, every key that is not ``summed`` goes through it: the
all-reduce keys of :mod:`pskv.torch.ops` are declared ``summed``, so they keep summing.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.optimizer import Optimizer as PskvOptimizer
from pskv.optimizer import create as create_optimizer
from pskv.torch import ops, runtime
from pskv.torch.compression import Compression, StoreCompressor
from pskv.torch.optimizer import _check_passes, _parameter_names

__all__ = ["ServerUpdates", "ServerSideOptimizer", "server_side_optimizer", "pskv_optimizer_for", "BUCKET_BYTES"]

BUCKET_BYTES = 2 * 2**20  #: default bytes of gradients per ``pushpull``
_instances = itertools.count()  # one key prefix per wrapper, the same on every rank
_HOOK_ATTRIBUTE = "_pskv_server_update_hook"  # on a parameter: the hook of the wrapper that has it
_SERVERS_STATE = "server_update.optimizer"  # in the runtime's state: what the servers run, for every wrapper's keys
_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")
_WAY_OUT = ("pass update_on_kvstore=False (the servers sum the gradients and {cls}.step() runs on every worker), "
            "or give a pskv optimizer (pskv.optimizer.create('sgd', ...))")


def _refuse(optimizer: Any, why: str) -> InvalidArgumentError:
    cls = next(c for c in type(optimizer).__mro__ if not c.__module__.startswith("pskv.")).__name__
    return InvalidArgumentError(f"update_on_kvstore=True: pskv's servers cannot run torch.optim.{cls} ({why}); "
                                + _WAY_OUT.format(cls=cls))


def _same(optimizer: torch.optim.Optimizer, option: str) -> Any:
    """The value of ``option``, which must be the same in every param group (else refused)."""
    values = {repr(group.get(option)) for group in optimizer.param_groups}
    if len(values) > 1:
        raise _refuse(optimizer, f"its param groups differ in {option!r}; only lr and weight_decay may differ")
    return optimizer.param_groups[0].get(option)


def _mapped(optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, Any]]:
    """The pskv optimizer name and hyperparameters with ``torch.optim``'s formulas (see the module docstring)."""
    if _same(optimizer, "maximize"):
        raise _refuse(optimizer, "maximize=True")
    kind = next(c for c in type(optimizer).__mro__ if not c.__module__.startswith("pskv."))  # not our wrapper's
    if kind is torch.optim.SGD:
        if _same(optimizer, "dampening"):
            raise _refuse(optimizer, "dampening != 0")
        momentum = float(_same(optimizer, "momentum"))
        return ("nag" if _same(optimizer, "nesterov") else "sgd"), {"momentum": momentum}
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        if _same(optimizer, "amsgrad"):
            raise _refuse(optimizer, "amsgrad=True")
        decoupled = kind is torch.optim.AdamW or bool(_same(optimizer, "decoupled_weight_decay"))
        beta1, beta2 = (float(b) for b in _same(optimizer, "betas"))
        options: dict[str, Any] = {"beta1": beta1, "beta2": beta2, "epsilon": float(_same(optimizer, "eps"))}
        return ("adamw" if decoupled else "adam"), options
    raise _refuse(optimizer, "pskv maps SGD, Adam and AdamW, whose formulas its sgd, nag, adam and adamw share")


def pskv_optimizer_for(optimizer: torch.optim.Optimizer | PskvOptimizer, keys: dict[torch.Tensor, str]
                       ) -> PskvOptimizer:
    """The pskv optimizer the servers run for ``optimizer`` over the parameters' ``keys``.

    A pskv optimizer is returned as it is. A ``torch.optim`` one is mapped (module
    docstring): learning rate and weight decay 1, each key's ``lr_mult`` / ``wd_mult`` its
    group's ``lr`` / ``weight_decay`` (exact products, so each group's values are used as they are).

    Raises:
        InvalidArgumentError: a ``torch.optim`` optimizer whose formulas pskv has not (naming it).
    """
    if isinstance(optimizer, PskvOptimizer):
        return optimizer
    name, options = _mapped(optimizer)
    made = create_optimizer(name, learning_rate=1.0, wd=1.0, **options)
    made.set_lr_mult({keys[p]: float(g["lr"]) for g in optimizer.param_groups for p in g["params"] if p in keys})
    made.set_wd_mult({keys[p]: float(g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]
                      if p in keys})
    return made


@dataclass
class _Bucket:
    """Parameters sent in one ``pushpull``; ``handle`` is that call's while its updates are on the way."""

    params: list[torch.Tensor]
    keys: list[str]
    priority: int
    ready: int = 0
    handle: Any = None


class ServerUpdates:
    """One wrapper's keys, buckets and pending updates: the state of the server-side optimizer.

    Args:
        optimizer: the torch optimizer whose param groups hold the parameters (their
            ``lr`` changes are forwarded) -- the wrapper itself.
        names: every parameter's name (its key is ``pskv.torch.server.<n>.<name>``).
        pskv_optimizer: what the servers run (None: mapped from ``optimizer``).
        scale: ``rescale_grad`` (1 / size for an average, 1 for a sum).
        passes: backward passes per step.
        bucket_bytes: about how many bytes of gradients one ``pushpull`` carries.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
                 pskv_optimizer: PskvOptimizer | None, scale: float, passes: int, bucket_bytes: int) -> None:
        prefix = f"pskv.torch.server.{next(_instances)}"
        self.optimizer = optimizer
        wanted = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self.keys = {p: f"{prefix}.{names[p]}" for p in wanted}
        self._given = pskv_optimizer
        self._sent_lrs: list[float] | None = None
        self.scale = scale
        self.passes = passes
        self.overlap = False
        self.started = False
        self.superseded = False
        self.round_open = False
        self.waited_in_forward = 0  # waits that found an update still on the way (cross-barrier's evidence)
        self.compression: dict[str, Any] | None = None  # pskv's own, the keys' (init(compression=))
        self.buckets = _buckets(wanted, self.keys, bucket_bytes)
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._left = {p: passes for p in wanted}
        self.hooks = []
        for p in wanted:  # a parameter wrapped again leaves the old wrapper
            old = getattr(p, _HOOK_ATTRIBUTE, None)
            if old is not None:
                old.remove()
            self.hooks.append(p.register_post_accumulate_grad_hook(self.on_gradient))
            setattr(p, _HOOK_ATTRIBUTE, self.hooks[-1])

    # -- a step: hooks during backward, then step() -------------------------------------------
    def on_gradient(self, param: torch.Tensor) -> None:
        """The hook: one more backward pass of ``param``; after the last one its bucket may go."""
        if not self.round_open:
            self.begin_round()
        if self._left[param] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._left[param] -= 1
        if self._left[param] == 0:
            bucket = self._bucket_of[param]
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._launch(bucket)

    def begin_round(self) -> None:
        """The first gradient of a step: the last step's updates in, the job started, a new lr sent."""
        self.finish()
        if self.superseded:
            raise InvalidArgumentError("update_on_kvstore=True: a later wrapper had the servers run another optimizer "
                                       "(they run one for every key); use the same class and options in every wrapper")
        if not self.started:
            self._start()
        elif self._lrs() != self._sent_lrs:
            self._send_optimizer()
        self.round_open = True

    def end_round(self) -> None:
        """``step()``: send every bucket not sent yet (missing gradients as zeros); wait unless overlapping."""
        if not self.round_open:
            self.begin_round()
        for bucket in self.buckets:
            if bucket.handle is None and bucket.ready < len(bucket.params):
                self._launch(bucket)
        self.reset()
        if not self.overlap:
            self.finish()

    def reset(self) -> None:
        """Forget this step's pass counts (the buckets sent stay on the way)."""
        self.round_open = False
        for p in self._left:
            self._left[p] = self.passes
        for bucket in self.buckets:
            bucket.ready = 0

    def _launch(self, bucket: _Bucket) -> None:
        grads = [_dense_grad(p) for p in bucket.params]
        with torch.no_grad():
            bucket.handle = runtime.store().pushpull(bucket.keys, grads, out=[p.data for p in bucket.params],
                                                     priority=bucket.priority, block=False)
        bucket.ready = len(bucket.params)

    # -- waiting ------------------------------------------------------------------------------
    def wait_for(self, params: Iterable[torch.Tensor], forward: bool = False) -> None:
        """Wait for the updates of ``params`` still on the way (``forward``: counted in ``waited_in_forward``)."""
        for p in params:
            bucket = self._bucket_of.get(p)
            if bucket is not None and bucket.handle is not None:
                self._wait(bucket, forward)

    def _wait(self, bucket: _Bucket, forward: bool = False) -> None:
        handle, bucket.handle = bucket.handle, None
        if forward and not handle.done():
            self.waited_in_forward += 1
        handle.wait()

    def finish(self) -> None:
        """Wait for every update on the way."""
        for bucket in self.buckets:
            if bucket.handle is not None:
                self._wait(bucket)

    @property
    def pending(self) -> int:
        """Buckets whose updates are still on the way (not waited for, not done)."""
        return sum(1 for b in self.buckets if b.handle is not None and not b.handle.done())

    # -- the servers' side --------------------------------------------------------------------
    def _lrs(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def _send_optimizer(self) -> None:
        """Install (again: new hyperparameters, the state kept) the optimizer on the servers. Collective."""
        lrs = self._lrs()
        if self._given is None:
            made = pskv_optimizer_for(self.optimizer, self.keys)
        else:
            made = self._given
            if self._sent_lrs is not None and made.lr_scheduler is None:
                made.set_learning_rate(lrs[0])
        made.rescale_grad = self.scale
        runtime.store().set_optimizer(_merged(made, self))
        self._sent_lrs = lrs

    def _start(self) -> None:
        """Install the optimizer, then create every key from rank 0's parameters (into every rank's). Collective."""
        self._send_optimizer()
        params = list(self.keys)
        keys, values = [self.keys[p] for p in params], [p.data for p in params]
        with torch.no_grad():
            if self.compression is None:
                runtime.store().broadcast(keys, values, out=values)
            else:  # keys made with their compression (rank 0's values), then every rank takes them
                runtime.store().init(keys, values, compression=self.compression)  # type: ignore[call-arg]
                runtime.store().pull(keys, out=values)
        self.started = True

    def close(self) -> None:
        """Wait for the updates on the way and remove the hooks."""
        self.finish()
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def _bare(optimizer: PskvOptimizer) -> dict[str, Any]:
    config = optimizer.to_config()
    config["params"] = {k: v for k, v in config["params"].items() if k not in ("lr_mult", "wd_mult")}
    return config


@dataclass
class _Servers:
    """What the servers run (one optimizer for every key), and the wrappers whose keys it updates."""

    optimizer: PskvOptimizer | None = None
    users: weakref.WeakSet[ServerUpdates] = field(default_factory=weakref.WeakSet)


def _merged(made: PskvOptimizer, owner: ServerUpdates) -> PskvOptimizer:
    """``made`` with the other wrappers' keys' multipliers, when it is the same optimizer as theirs
    (class and options but a group's lr and weight_decay); else it replaces theirs, and those
    wrappers fail at their next step (``superseded``) rather than train with another rule."""
    servers = runtime.current().state.setdefault(_SERVERS_STATE, _Servers())
    old = servers.optimizer
    if old is not None and old is not made:
        if _bare(old) == _bare(made):
            made.set_lr_mult({**old.lr_mult, **made.lr_mult})
            made.set_wd_mult({**old.wd_mult, **made.wd_mult})
        else:
            for user in servers.users:
                user.superseded = user is not owner
            servers.users = weakref.WeakSet()
    servers.optimizer = made
    servers.users.add(owner)
    return made


def _buckets(params: list[torch.Tensor], keys: dict[torch.Tensor, str], bucket_bytes: int) -> list[_Bucket]:
    """Parameters in reverse order (about autograd's) cut every ``bucket_bytes``; a bucket holding earlier
    layers goes first where the store can reorder (the next forward needs them first)."""
    buckets: list[_Bucket] = []
    current: list[torch.Tensor] = []
    size = 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(_Bucket(current, [keys[q] for q in current], 0))
            current, size = [], 0
    if current:
        buckets.append(_Bucket(current, [keys[q] for q in current], 0))
    for i, bucket in enumerate(buckets):
        bucket.priority = i  # the last bucket of backward holds the first layers
    return buckets


def _dense_grad(p: torch.Tensor) -> torch.Tensor:
    g = p.grad
    if g is None:
        return torch.zeros_like(p)
    return g.to_dense() if g.is_sparse else g.contiguous()


class ServerSideOptimizer(torch.optim.Optimizer):
    """The methods mixed in front of the wrapped optimizer's class (never instantiated on its own)."""

    _updates: ServerUpdates
    _should_synchronize: bool
    _steps: int

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Send the gradients not sent yet; wait for the servers' updates (not with cross-barrier)."""
        loss = closure() if closure is not None else None
        self._updates.end_round()
        self._steps += 1
        return loss

    def synchronize(self) -> None:
        """Wait until every update sent so far is in the parameters (before reading them outside a forward)."""
        self._updates.finish()

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's context; nothing to skip: the servers apply the gradients as they were sent."""
        yield

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's ``zero_grad``; gradients zeroed in place first wait for the sends that read them."""
        if not set_to_none:
            self._updates.finish()
        super().zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Expect ``passes`` backward passes per step from now on (Horovod's name)."""
        self._updates.passes = _check_passes(passes)
        self._updates.reset()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused: the optimizer state lives on the servers (``pskv.torch.store().load_optimizer_states``)."""
        raise NotSupportedError("update_on_kvstore=True keeps the optimizer state on the servers: load it with "
                                "pskv.torch.store().load_optimizer_states(fname)")


def server_side_optimizer(optimizer: torch.optim.Optimizer | PskvOptimizer,
                          named_parameters: Iterable[Any] | None = None, compression: Any = Compression.none,
                          backward_passes_per_step: int = 1, op: Any = ops.Average,
                          bucket_bytes: int = BUCKET_BYTES) -> ServerSideOptimizer:
    """``optimizer`` run by the servers (``DistributedOptimizer(..., update_on_kvstore=True)``).

    Args:
        optimizer: a ``torch.optim`` SGD, Adam or AdamW, or a pskv optimizer (then
            ``named_parameters`` is required; the result is a ``torch.optim.Optimizer``
            over them whose ``lr`` is forwarded to it).
        named_parameters, backward_passes_per_step, op: as ``DistributedOptimizer``'s.
        compression: ``Compression.none`` or one of pskv's own (:class:`~pskv.torch.compression.StoreCompressor`).
        bucket_bytes: about how many bytes of gradients one ``pushpull`` carries.

    Raises:
        InvalidArgumentError: a store without servers, a torch optimizer pskv cannot run
            (naming it), a pskv optimizer without ``named_parameters``, or bad names.
        NotSupportedError: ``Compression.fp16``, or ``op`` other than Average and Sum.
    """
    job = runtime.current()
    if not (job.servers and job.kind.servers_optimize):
        raise InvalidArgumentError(f"update_on_kvstore=True needs servers that run optimizers (dist_sync: pskv "
                                   f"launch -s N with N > 0); the {job.kind.name!r} store only sums: pass "
                                   "update_on_kvstore=False")
    if compression is not Compression.none and not isinstance(compression, StoreCompressor):
        raise NotSupportedError("update_on_kvstore=True sends gradients as they are or compressed by pskv's own "
                                "compression: use Compression.none or e.g. Compression.twobit()")
    chosen = ops.reduce_op(op, None, "DistributedOptimizer")
    passes = _check_passes(backward_passes_per_step)
    given: PskvOptimizer | None = None
    if isinstance(optimizer, PskvOptimizer):
        if named_parameters is None:
            raise InvalidArgumentError("a pskv optimizer needs named_parameters=model.named_parameters()")
        pairs = list(named_parameters)
        given, optimizer = optimizer, torch.optim.Optimizer([p for _, p in pairs], {"lr": optimizer.learning_rate})
        named_parameters = pairs
    else:
        _mapped(optimizer)  # refused now rather than at the first step
    names = _parameter_names(optimizer, named_parameters)
    bases = (ServerSideOptimizer, optimizer.__class__)
    cls: type[ServerSideOptimizer] = type(optimizer.__class__.__name__, bases, {})
    wrapped = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups, defaults and hooks
    wrapped._steps = 0
    scale = 1.0 / job.store.num_workers if chosen == ops.Average else 1.0
    wrapped._updates = ServerUpdates(wrapped, names, given, scale, passes, bucket_bytes)
    wrapped._updates.compression = getattr(compression, "params", None)
    return wrapped
