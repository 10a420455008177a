"""``DistributedOptimizer``: Horovod's optimizer wrapper on pskv's all-reduces.

``DistributedOptimizer(optimizer, named_parameters=model.named_parameters())`` returns an
object of a subclass of ``type(optimizer)`` made on the fly (so ``isinstance`` holds) that
shares the optimizer's ``param_groups``, ``state`` and hooks: ``step``, ``zero_grad``,
``state_dict``, LR schedulers and ``GradScaler`` work on it as on the optimizer. (Horovod
builds a second optimizer over the same groups; sharing the state as well means a wrapper
made after a checkpoint load keeps the loaded moments.)

A hook on each parameter (``register_post_accumulate_grad_hook``) counts its backward
passes; after ``backward_passes_per_step`` of them its gradient is final and it joins its
bucket (:mod:`pskv.torch.buckets`): complete buckets are averaged over the ranks while
backward goes on. ``step()`` = ``synchronize()`` (send what is left, a missing gradient as
zeros, wait, write the averages (sums with ``op=Sum``) into ``.grad``) + the optimizer's
own step. Horovod's rules hold: ``synchronize()`` + ``with skip_synchronize(): step()``
for clipping or AMP's unscaling; ``step()`` after ``synchronize()`` without it warns;
``zero_grad()`` between backward and step raises; a gradient computed more than
``backward_passes_per_step`` times before the step raises; ``gradient_predivide_factor``
divides before the sum and multiplies after it (``op=Average`` only). On a job of one
process no hook is set and ``step`` is the optimizer's.

Deliberate differences from Horovod: gradients are fused into buckets sent in a fixed
order (``groups`` / ``num_groups`` are accepted and ignored: the buckets take their
place); sparse gradients travel as rows from the first step on (:mod:`pskv.torch.sparse`;
dense with ``sparse_as_dense=True``); ``op=Adasum`` and process sets are not offered
(:class:`~pskv.errors.NotSupportedError`). A parameter that required a gradient when the
optimizer was wrapped and got none in a step is reduced as zeros, as in Horovod (so it
has a zero gradient afterwards, not None); one that did not require a gradient then is
never reduced (Horovod's rule too: wrap the optimizer once the model is set up). A
parameter wrapped again (a new wrapper made each epoch) is the new wrapper's alone: the old
one's hook is removed, so it no longer counts that parameter's passes.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.torch import ops, runtime, sparse
from pskv.torch.buckets import GradientBuckets, Reduction
from pskv.torch.compression import Compression

__all__ = ["DistributedOptimizer", "reset_all"]

_instances = itertools.count()  # one collective-name prefix per wrapper, the same on every rank
_HOOK_ATTRIBUTE = "_pskv_distributed_optimizer_hook"  # on a parameter: the hook of the wrapper that has it
_live: weakref.WeakSet[_DistributedOptimizer] = weakref.WeakSet()  # every wrapper, for reset_all()

_ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")
_STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed in front of the wrapped optimizer's class (never instantiated on its own)."""

    _parameter_names: dict[torch.Tensor, str]
    _buckets: GradientBuckets | sparse.SparseGradients
    _delay: dict[torch.Tensor, int]
    _hooks: list[Any]
    backward_passes_per_step: int
    _synchronized: bool
    _should_synchronize: bool

    def _set_up(self, names: dict[torch.Tensor, str], reduction: Reduction, backward_passes_per_step: int,
                sparse_as_dense: bool = False) -> None:
        self._parameter_names = names
        self.backward_passes_per_step = backward_passes_per_step
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = []
        wanted = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._delay = {p: backward_passes_per_step for p in wanted}
        prefix = f"DistributedOptimizer.{next(_instances)}"
        elastic = runtime.current().elastic  # a joiner could not make the first step's layout sum: dense there
        self._buckets = sparse.gradient_buckets([(names[p], p) for p in reversed(wanted)], prefix, reduction,
                                                sparse_as_dense or elastic)  # sparse gradients: as rows (sparse.py)
        _live.add(self)
        if runtime.size() > 1 or elastic:  # an elastic job may grow from one worker
            self._buckets.declare()
            for p in wanted:  # a parameter wrapped again (a new wrapper each epoch) leaves the old wrapper
                old = getattr(p, _HOOK_ATTRIBUTE, None)
                if old is not None:
                    old.remove()
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_gradient))
                setattr(p, _HOOK_ATTRIBUTE, self._hooks[-1])

    def _on_gradient(self, param: torch.Tensor) -> None:
        """The hook: one more backward pass of ``param``; after the last one its bucket may go."""
        if self._delay[param] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._delay[param] -= 1
        if self._delay[param] == 0:
            self._buckets.ready(param)

    def _pending(self) -> bool:
        return self._buckets.pending or any(d != self.backward_passes_per_step for d in self._delay.values())

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Expect ``passes`` backward passes per step from now on (Horovod's name)."""
        self.backward_passes_per_step = _check_passes(passes)
        self._restart()

    def _restart(self) -> None:
        self._buckets.reset()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def synchronize(self) -> None:
        """Send every gradient not sent yet (a missing one as zeros), wait, and write the averages (sums with
        ``op=Sum``) into ``.grad``."""
        if self._hooks:
            try:
                self._buckets.launch_all()
                self._buckets.wait()
            finally:
                self._restart()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it ``step()`` does not synchronize: ``synchronize(); clip; with skip_synchronize(): step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Synchronize (unless within :meth:`skip_synchronize`), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's ``zero_grad``; refused (AssertionError) while gradients of this step are being reduced."""
        if self._pending():
            raise AssertionError(_ZERO_GRAD_PENDING)
        super().zero_grad(*args, **kwargs)

    def reset(self) -> None:
        """Forget this step: its handles, its backward-pass counts and a ``synchronize()`` not stepped yet
        (an elastic job's membership changed: the step is redone, :mod:`pskv.torch.elastic`)."""
        self._restart()
        self._synchronized = False
        self._should_synchronize = True

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's ``load_state_dict``; forgets this step's pending reductions (Horovod does)."""
        self._restart()
        self._synchronized = False
        self._should_synchronize = True
        super().load_state_dict(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None = None,  # noqa: N802
                         compression: Any = Compression.none, backward_passes_per_step: int = 1, op: Any = ops.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False, update_on_kvstore: bool = False) -> _DistributedOptimizer:
    """``optimizer`` with its gradients averaged (summed: ``op=Sum``) over the job's ranks; Horovod's signature.

    Args:
        optimizer: any ``torch.optim.Optimizer``; the result shares its groups and state.
        named_parameters: ``(name, parameter)`` pairs covering every parameter of the
            optimizer (usually ``model.named_parameters()``; extra ones are ignored). None:
            ``allreduce.noname.<group>.<index>``.
        compression: ``Compression.none``, ``Compression.fp16`` (what gradients travel as) or one of pskv's
            own (``Compression.twobit()``, ...: the buckets' keys compressed by the store, :mod:`pskv.torch.compression`).
        backward_passes_per_step: backward passes accumulated locally per step.
        op: ``Average`` or ``Sum``.
        gradient_predivide_factor: with ``Average``, gradients are divided by it before the
            sum and multiplied by ``factor / size`` after it. Ignored, and not checked, with
            ``update_on_kvstore=True``.
        num_groups, groups: accepted for Horovod's programs; pskv's buckets fuse gradients.
        sparse_as_dense: sparse gradients travel dense, in the buckets (else as rows:
            :mod:`pskv.torch.sparse`). Ignored with ``update_on_kvstore=True``.
        update_on_kvstore: the servers run the optimizer (:mod:`pskv.torch.server_update`);
            then ``gradient_predivide_factor`` and ``sparse_as_dense`` are ignored.

    Raises:
        InvalidArgumentError: ``named_parameters`` holds something other than pairs, duplicate
            names, parameters without a name (both named),
            ``backward_passes_per_step`` < 1, a predivide factor with ``op`` other than Average
            (not checked with ``update_on_kvstore=True``, which ignores the factor).
        NotSupportedError: ``op=Adasum``.
    """
    del num_groups, groups  # accepted for Horovod's programs (see the module docstring)
    if op is ops.Adasum or op == ops.Adasum:
        raise NotSupportedError("DistributedOptimizer(op=Adasum): pskv offers no Adasum; use op=Average or op=Sum")
    if update_on_kvstore:  # the servers run it (pskv.torch.server_update, which imports this module)
        from pskv.torch.server_update import server_side_optimizer
        return server_side_optimizer(optimizer, named_parameters, compression, backward_passes_per_step, op)  # type: ignore[return-value]
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average")
    passes = _check_passes(backward_passes_per_step)
    names = _parameter_names(optimizer, named_parameters)
    if op == ops.Average:  # Horovod splits the average: 1/f before the sum, f/size after it
        reduction = Reduction(op, compression, 1.0 / gradient_predivide_factor, gradient_predivide_factor)
    else:
        reduction = Reduction(op, compression)
    bases = (_DistributedOptimizer, optimizer.__class__)
    cls: type[_DistributedOptimizer] = type(optimizer.__class__.__name__, bases, {})
    wrapped = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups, state, defaults and hooks
    wrapped._set_up(names, reduction, passes, sparse_as_dense)
    return wrapped


def _check_passes(passes: int) -> int:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        raise InvalidArgumentError(f"backward_passes_per_step must be > 0, got {passes!r}")
    return passes


def _parameter_names(optimizer: torch.optim.Optimizer, named: Iterable[Any] | None) -> dict[torch.Tensor, str]:
    """Each of the optimizer's parameters -> its name (checked: pairs, unique names, every parameter named)."""
    where = {p: (i, j) for i, group in enumerate(optimizer.param_groups) for j, p in enumerate(group["params"])}
    if named is None:
        return {p: f"allreduce.noname.{i}.{j}" for p, (i, j) in where.items()}
    pairs = list(named)
    if any(not (isinstance(pair, tuple) and len(pair) == 2) for pair in pairs):
        raise InvalidArgumentError("named_parameters should be a sequence of tuples (name, parameter), "
                                   "usually produced by model.named_parameters().")
    dups = sorted(str(name) for name, count in Counter(name for name, _ in pairs).items() if count > 1)
    if dups:
        raise InvalidArgumentError("Parameter names in named_parameters must be unique. Found duplicates: "
                                   + ", ".join(dups))
    names = {p: str(name) for name, p in pairs}
    unnamed = [f"param_groups[{i}]['params'][{j}] (shape {tuple(p.shape)})" for p, (i, j) in where.items()
               if p not in names]
    if unnamed:
        raise InvalidArgumentError("named_parameters was specified, but one or more model parameters were not "
                                   "named: " + ", ".join(unnamed))
    return {p: names[p] for p in where}


def reset_all() -> None:
    """:meth:`reset` every DistributedOptimizer of this process (an elastic job's view change)."""
    for wrapper in list(_live):
        wrapper.reset()
