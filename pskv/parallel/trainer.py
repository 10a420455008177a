"""Trainer: ties a data-parallel group (or a plain module) to a pskv store and an optimizer.

Each parameter is a store key named after it. The first forward broadcasts rank 0's
parameters to every worker and device; then each step sends every gradient with
``pushpull(names, grads, out=..., priority=-index)``:

* ``update_on_kvstore=True``: the optimizer runs in the store (on the servers for the
  ``dist_*`` stores) and the new weights come back into every device's parameters;
* ``update_on_kvstore=False``: the store only sums gradients; the optimizer runs here.

MXNet's rules pick the mode: ``dist_async`` forces True (an explicit False raises), a
store without optimizer capability (``byteps``) forces False (an explicit True raises),
and no store (one device, a non-distributed store name) means False. A ``torch.optim``
optimizer runs only here, on every worker (:mod:`pskv.parallel.torch_optim`).

Communication overlaps the backward pass: gradients are grouped into buckets in reverse
parameter order (roughly the order autograd produces them) and a bucket is sent — one
non-blocking ``pushpull`` — as soon as every device has produced all its gradients. When
the servers run the optimizer of a synchronous ``dist`` store, a bucket travels as chunk
keys of one piece per server, each updated and answered while the next are still pushed
(:mod:`pskv.parallel.chunks`). :meth:`Trainer.step` sends what is left, waits, and (without
``update_on_kvstore``) runs the optimizer. ``rescale_grad`` is 1 / global batch size:
the per-worker batch times the number of workers for the synchronous stores of several
processes (``dist_sync*``, ``byteps``, ``horovod``, ``nccl``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from pskv.errors import InvalidArgumentError, InvalidTypeError
from pskv.kvstore import KVStoreBase, StoreType, create
from pskv.kvstore.types import BUILTIN_TYPES
from pskv.optimizer import Optimizer
from pskv.parallel.chunks import StoreKeys, chunk_bytes
from pskv.parallel.embedding import StoreTable, wait_handles
from pskv.parallel.executor_group import DataParallelExecutorGroup
from pskv.parallel.fit import fit
from pskv.parallel.torch_optim import TorchOptimizerStep, local_updater, make_optimizer
from pskv.parallel.trainer_tables import TrainerTables

__all__ = ["Trainer"]

# Stores whose pushes of one round are summed over all workers before the update.
DEFAULT_BUCKET_BYTES = 1 << 20


def _trainable(
    target: DataParallelExecutorGroup | torch.nn.Module,
) -> tuple[DataParallelExecutorGroup | None, list[str], list[list[torch.Tensor]], int]:
    """The group (or None), the trainable parameters' names, their copies per device, the number of devices.

    Raises:
        InvalidTypeError: ``target`` is neither a group nor a module.
    """
    if isinstance(target, DataParallelExecutorGroup):
        names = [n for n in target.param_names if target.grad_req[n] != "null"]
        index = {n: i for i, n in enumerate(target.param_names)}
        return target, names, [list(target.param_arrays[index[n]]) for n in names], len(target.devices)
    if isinstance(target, torch.nn.Module):
        named = [(n, p) for n, p in target.named_parameters() if p.requires_grad]
        return None, [n for n, _ in named], [[p] for _, p in named], 1
    raise InvalidTypeError(f"Trainer needs a DataParallelExecutorGroup or a torch.nn.Module, "
                           f"got {type(target).__name__}")


class Trainer:
    """Trains a :class:`DataParallelExecutorGroup` (or a plain ``torch.nn.Module``) through a store.

    Args:
        target: the group, or a module whose trainable parameters are used (one device;
            call ``loss.backward()`` yourself, then :meth:`step` with the batch size).
        optimizer: an optimizer name (``'sgd'``, ``'adam'``...), an
            :class:`~pskv.optimizer.Optimizer`, or a ``torch.optim.Optimizer`` over the
            model's parameters (``update_on_kvstore=False`` only: it steps on every worker;
            :mod:`pskv.parallel.torch_optim`).
        optimizer_params: hyperparameters when ``optimizer`` is a name.
        kvstore: a store, a store name, or None. With one device, a single-process or
            custom store's name means no store (nothing to sum), as in MXNet; a multi-process
            one's (``dist_*``, ``byteps``, ``horovod``, ``nccl``) always makes the store.
        update_on_kvstore: run the optimizer in the store (None: decide by MXNet's rules).
        overlap: send gradients during backward (groups whose parameters all have
            ``grad_req='write'``; plain modules only with ``update_on_kvstore=False``).
        bucket_bytes: gradients are sent in groups of about this many bytes: a group
            is closed by the parameter that makes it reach the size (0: one key per
            parameter).
        prefix: prepended to parameter names to make the store keys (several models
            in one store need distinct prefixes).
        compression_params: compress the gradients sent to the store (MXNet's
            ``compression_params``: ``{'type': '2bit', 'threshold': 0.5}``; the store's
            ``set_gradient_compression``). A store is then used even for one device.

    Raises:
        InvalidArgumentError: an impossible ``update_on_kvstore`` (a torch optimizer
            with ``update_on_kvstore`` True, given or by default), several devices
            without a store, ``compression_params`` without a store, or a store that
            holds keys already with another compression.
    """

    def __init__(self, target: DataParallelExecutorGroup | torch.nn.Module,
                 optimizer: str | Optimizer | torch.optim.Optimizer = "sgd",
                 optimizer_params: Mapping[str, Any] | None = None, kvstore: str | KVStoreBase | None = "device",
                 update_on_kvstore: bool | None = None, overlap: bool = True,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, prefix: str = "",
                 compression_params: Mapping[str, Any] | None = None) -> None:
        group, names, leaves, self._num_devices = _trainable(target)
        self._group: DataParallelExecutorGroup | None = group
        # embedding tables in the store (pskv.parallel.Embedding): rows pulled and pushed by their modules
        self._tables = TrainerTables(group.replicas if group is not None else [target])  # type: ignore[list-item]
        if not names and not self._tables:
            raise InvalidArgumentError("the model has no trainable parameters")
        if not isinstance(prefix, str):
            raise InvalidTypeError(f"prefix must be a str, got {type(prefix).__name__}")
        self.names = names
        self._prefix = prefix
        self._leaves = leaves  # [param][device] -> the torch Parameter
        self._target = target
        self._optimizer = make_optimizer(optimizer, optimizer_params, [copies[0] for copies in leaves])
        self._kv, self._owns_kv = (self._tables.store(kvstore), False) if self._tables else self._make_store(
            kvstore, compression_params is not None)
        if compression_params is not None:
            if self._kv is None:
                raise InvalidArgumentError("compression_params need a store to compress for (kvstore=...)")
            self._kv.set_gradient_compression(compression_params)
        self.update_on_kvstore = self._resolve_update_on_kvstore(update_on_kvstore)
        self._tables.check_update_on_kvstore(self.update_on_kvstore)
        self._updater = local_updater(self._optimizer, self.update_on_kvstore, update_on_kvstore, self._kv)
        workers = self._kv.num_workers if self._kv is not None and self._kv.store_type.multiprocess and self._kv.store_type.sync else 1
        self._worker_factor = workers
        self._set_up_buckets(bucket_bytes)
        self.overlap = self._resolve_overlap(overlap)
        self._init_step_state()
        self._attach()

    # -- set-up ---------------------------------------------------------------------------
    def _set_up_buckets(self, bucket_bytes: int) -> None:
        """Group the parameters into buckets, name their store keys, and give them flat buffers.

        Raises:
            InvalidArgumentError: ``bucket_bytes`` is not an int >= 0.
        """
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise InvalidArgumentError(f"bucket_bytes must be an int >= 0, got {bucket_bytes!r}")
        # Per-key multipliers are keyed by parameter: then every parameter is its own bucket.
        per_param = bool(self._optimizer.lr_mult or self._optimizer.wd_mult)
        self._buckets = self._make_buckets(0 if per_param else bucket_bytes)
        self._bucket_of = {i: b for b, members in enumerate(self._buckets) for i in members}
        self.keys = [self._prefix + self.names[m[0]] if len(m) == 1 else f"{self._prefix}bucket{b}"
                     for b, m in enumerate(self._buckets)]
        self._flatten()
        # what travels: the buckets' keys, or their chunks when the servers run the optimizer (parallel/chunks.py)
        self._store_keys = StoreKeys(self.keys, [w[0] for w in self._weights],
                                     0 if per_param else chunk_bytes(self._kv, self.update_on_kvstore))

    def _resolve_overlap(self, requested: bool) -> bool:
        """Whether gradients are sent during backward (see the ``overlap`` argument)."""
        if self._group is not None:
            overlap = bool(requested) and all(self._group.grad_req[n] == "write" for n in self.names)
        else:
            overlap = bool(requested) and not self.update_on_kvstore
        return overlap and self._kv is not None

    def _init_step_state(self) -> None:
        """The per-step bookkeeping: gradient counts, bucket sends, batch sizes, errors, hooks."""
        self._lock = threading.Lock()
        self._counts = [0] * len(self.names)
        self._bucket_ready = [0] * len(self._buckets)
        self._sent = [False] * len(self._buckets)
        self._handles: list[Any] = []
        self._expected = self._num_devices
        self._params_ready = False
        self._optimizer_batch: int | None = None  # batch size the store's rescale_grad was set for
        self._batch_size: int | None = None
        self._errors: list[BaseException] = []
        self._hooks: list[Any] = []
        # set by UnevenSteps once it declared its counter key on the store (collective: once per trainer)
        self.uneven_key_ready = False

    def _attach(self) -> None:
        """Broadcast parameters before the first forward; with ``overlap``, send gradients as they are made."""
        if self._group is not None:
            self._group.add_forward_listener(self._on_forward)
        elif isinstance(self._target, torch.nn.Module):
            self._hooks.append(self._target.register_forward_pre_hook(lambda *_: self._ensure_params()))
        if self.overlap:
            self._install_grad_hooks()
        self._tables.attach(self.overlap)

    def _make_store(self, kvstore: str | KVStoreBase | None, wanted: bool = False) -> tuple[KVStoreBase | None, bool]:
        if kvstore is None:
            if self._num_devices > 1:
                raise InvalidArgumentError(f"{self._num_devices} devices need a store to sum their gradients "
                                           "(kvstore='device' or 'local')")
            return None, False
        if isinstance(kvstore, KVStoreBase):
            return kvstore, False
        if not isinstance(kvstore, str):
            raise InvalidTypeError(f"kvstore must be a store, a store name or None, got {type(kvstore).__name__}")
        if self._num_devices == 1 and not wanted and not (kvstore.lower() in BUILTIN_TYPES
                                                          and StoreType.parse(kvstore).multiprocess):
            return None, False
        return create(kvstore), True

    def _resolve_update_on_kvstore(self, requested: bool | None) -> bool:
        kv = self._kv
        if kv is None:
            if requested:
                raise InvalidArgumentError("update_on_kvstore=True needs a store (kvstore is None or not needed)")
            return False
        capable = kv.is_capable("optimizer")
        if not kv.store_type.sync:
            if requested is False:
                raise InvalidArgumentError("Please set update_on_kvstore=True when training in async mode "
                                           f"(store {kv.type!r} applies every push as it arrives)")
            if not capable:
                raise InvalidArgumentError(f"store {kv.type!r} is asynchronous but cannot run an optimizer")
            return True
        if not capable:
            if requested:
                raise InvalidArgumentError(f"update_on_kvstore=True, but store {kv.type!r} cannot run an optimizer")
            return False
        return True if requested is None else bool(requested)

    def _make_buckets(self, cap: int) -> list[list[int]]:
        """Parameter indices in reverse order, grouped into buckets (one dtype and device per bucket).

        A bucket takes parameters until it holds ``cap`` bytes or more (as DDP's buckets do):
        the parameter that crosses the cap closes it. So a small parameter (a bias, a batch
        norm's scale) travels with the big one next to it instead of costing a round of its
        own, and a bucket is at most one parameter beyond ``cap``; 0 gives one bucket per
        parameter.
        """
        buckets: list[list[int]] = []
        size, kind = 0, None
        for i in reversed(range(len(self.names))):
            p = self._leaves[i][0]
            nbytes = p.numel() * p.element_size()
            this = (p.dtype, tuple(str(c.device) for c in self._leaves[i]))
            if not buckets or size >= cap or this != kind:
                buckets.append([])
                size, kind = 0, this
            buckets[-1].append(i)
            size += nbytes
        return buckets

    def _flatten(self) -> None:
        """Give every bucket one flat weight and one flat gradient buffer per device, and make
        the parameters and their ``.grad`` views into them (no copies when sending)."""
        self._weights: list[list[torch.Tensor]] = []  # [bucket][device]
        self._grads: list[list[torch.Tensor]] = []
        self._spans: list[list[tuple[int, int]]] = []  # [bucket][member] -> (offset, numel)
        with torch.no_grad():
            for members in self._buckets:
                spans, offset = [], 0
                for i in members:
                    n = self._leaves[i][0].numel()
                    spans.append((offset, n))
                    offset += n
                self._spans.append(spans)
                weights, grads = [], []
                for d in range(self._num_devices):
                    first = self._leaves[members[0]][d]
                    flat_w = torch.empty(offset, dtype=first.dtype, device=first.device)
                    flat_g = torch.zeros(offset, dtype=first.dtype, device=first.device)
                    for i, (off, n) in zip(members, spans):
                        p = self._leaves[i][d]
                        flat_w[off:off + n].copy_(p.detach().reshape(-1))
                        if p.grad is not None:
                            flat_g[off:off + n].copy_(p.grad.reshape(-1))
                        p.data = flat_w[off:off + n].view(p.shape)
                        p.grad = flat_g[off:off + n].view(p.shape)
                    weights.append(flat_w)
                    grads.append(flat_g)
                self._weights.append(weights)
                self._grads.append(grads)
        if self._group is not None:  # the group's gradient buffers are now the views
            index = {n: k for k, n in enumerate(self._group.param_names)}
            for i, name in enumerate(self.names):
                self._group.grad_arrays[index[name]] = [p.grad for p in self._leaves[i]]

    def _adopt_grads(self, b: int) -> None:
        """Copy gradients that left the bucket's buffer (e.g. after ``zero_grad(set_to_none=True)``)
        back into it, and point ``.grad`` at it again."""
        for i, (off, n) in zip(self._buckets[b], self._spans[b]):
            for d, p in enumerate(self._leaves[i]):
                view = self._grads[b][d][off:off + n]
                g = p.grad
                if g is not None and g.data_ptr() == view.data_ptr():
                    continue
                with torch.no_grad():
                    if g is None:
                        view.zero_()
                    else:
                        view.copy_(g.reshape(-1))
                    p.grad = view.view(p.shape)

    def _install_grad_hooks(self) -> None:
        for i, copies in enumerate(self._leaves):
            for p in copies:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def _grad_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def ready(_param: torch.Tensor) -> None:
            with self._lock:
                self._counts[i] += 1
                if self._counts[i] != self._expected:
                    return
                b = self._bucket_of[i]
                self._bucket_ready[b] += 1
                if self._bucket_ready[b] != len(self._buckets[b]) or self._sent[b]:
                    return
                self._sent[b] = True
            try:
                self._send_bucket(b)
            except BaseException as exc:  # raised again by step(): never lost, never kills autograd silently
                self._errors.append(exc)
        return ready

    @property
    def tables(self) -> list[StoreTable]:
        """The embedding tables of the model (:class:`pskv.parallel.Embedding`), pushed and pulled by their modules."""
        return self._tables.tables

    @property
    def key_sizes(self) -> dict[str, tuple[int, int]]:
        """Each store key of the parameters: (elements, devices) of its flat buffer."""
        return self._store_keys.sizes(self._num_devices)

    @property
    def kvstore(self) -> KVStoreBase | None:
        """The store (None when there is nothing to sum)."""
        return self._kv

    @property
    def optimizer(self) -> Optimizer | TorchOptimizerStep:
        """The optimizer (a copy of it runs in the store with ``update_on_kvstore``; a torch
        optimizer is its ``torch_optimizer``)."""
        return self._optimizer

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate."""
        return self._optimizer.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        """Change the learning rate (in the store too; state is kept). Collective in distributed mode."""
        self._optimizer.set_learning_rate(lr)
        if self.update_on_kvstore and self._optimizer_batch is not None and self._kv is not None:
            self._kv.set_optimizer(self._optimizer)  # type: ignore[arg-type]  # a torch one is refused here

    # -- initialisation ---------------------------------------------------------------------
    def _on_forward(self, group: DataParallelExecutorGroup) -> None:
        self._finish_sends()  # outs of the last step's pushpulls must be in before this forward reads them
        self._ensure_params()
        if self.update_on_kvstore:
            self._ensure_optimizer(group.batch_size)
        self._tables.begin_step(self._optimizer_batch, group.batch_size)
        with self._lock:
            self._expected = len(group.active_devices)
            self._reset_counts()

    def _reset_counts(self) -> None:
        self._counts = [0] * len(self.names)
        self._bucket_ready = [0] * len(self._buckets)
        self._sent = [False] * len(self._buckets)

    def init_params(self) -> None:
        """Broadcast rank 0's parameters to every worker and device (done by the first forward)."""
        self._ensure_params()

    def sync_params(self) -> None:
        """Broadcast rank 0's current parameters again (after loading new ones). Collective."""
        self._finish_sends()
        self._params_ready = False
        self._ensure_params()

    def _ensure_params(self) -> None:
        if self._params_ready:
            return
        self._params_ready = True
        if self._kv is None:
            return
        with torch.no_grad():
            if self.update_on_kvstore and self._optimizer_batch is None and self._group is not None:
                self._ensure_optimizer(self._group.batch_size or 1)
            if self.keys:
                keys = self._store_keys
                self._kv.broadcast(keys.keys, [v[0] for b, w in enumerate(self._weights) for v in keys.views(b, w)],
                                   out=[v for b, w in enumerate(self._weights) for v in keys.views(b, w)])

    def _ensure_optimizer(self, batch_size: int) -> None:
        """Install the optimizer in the store with ``rescale_grad`` for ``batch_size`` (once)."""
        if self._optimizer_batch is not None or self._kv is None:
            return
        self._optimizer.rescale_grad = 1.0 / (batch_size * self._worker_factor)
        self._kv.set_optimizer(self._optimizer)  # type: ignore[arg-type]  # a torch one is refused here
        self._optimizer_batch = batch_size

    # -- communication ------------------------------------------------------------------------
    def _send_bucket(self, b: int) -> None:
        assert self._kv is not None
        self._adopt_grads(b)
        grads = self._grads[b]
        if self.update_on_kvstore:
            current = self._group.batch_size if self._group is not None else self._batch_size
            if self._optimizer_batch and current and current != self._optimizer_batch:
                factor = self._optimizer_batch / current  # the store's rescale_grad is for _optimizer_batch
                for g in grads:
                    g.mul_(factor)
            weights: list[torch.Tensor] | None = self._weights[b]
        else:
            weights = None
        priority = self._store_keys.priority(-min(self._buckets[b]))
        for key, value, out in self._store_keys.calls(b, grads, weights):
            handle = self._kv.pushpull(key, value, out=out, priority=priority,  # type: ignore[call-arg]
                                       block=False)
            with self._lock:
                self._handles.append(handle)

    def _finish_sends(self) -> None:
        with self._lock:
            handles, self._handles = self._handles, []
            errors, self._errors = self._errors, []
        wait_handles(handles, errors)

    def allreduce_grads(self) -> None:
        """Sum the gradients over devices and workers, in place (``update_on_kvstore=False`` only)."""
        if self.update_on_kvstore:
            raise InvalidArgumentError("allreduce_grads() is for update_on_kvstore=False; use step()")
        self._ensure_params()
        self._communicate()

    def _communicate(self) -> None:
        if self._kv is None:
            return
        with self._lock:
            todo = [b for b, sent in enumerate(self._sent) if not sent]
            for b in todo:
                self._sent[b] = True
        for b in todo:
            self._send_bucket(b)
        self._finish_sends()
        with self._lock:
            self._reset_counts()

    # -- the step -----------------------------------------------------------------------------
    def step(self, batch_size: int | None = None) -> None:
        """Finish this step: send the gradients not sent yet, wait, and update the parameters.

        Args:
            batch_size: samples this worker processed (default: the group's batch).
                ``rescale_grad`` becomes 1 / (batch_size x workers) for synchronous
                distributed stores, 1 / batch_size otherwise.

        Raises:
            InvalidArgumentError: no batch size for a plain module.
            KVStoreError: the store's (NodeFailedError, OperationTimeoutError...) and the optimizer's errors.
        """
        batch = self._batch(batch_size)
        self._ensure_params()
        if self.update_on_kvstore:
            self._ensure_optimizer(batch)
        if self._tables:
            if self._group is None:
                self._tables.begin_step(self._optimizer_batch, batch)
            self._tables.push()
        self._communicate()
        self._tables.finish()
        if not self.update_on_kvstore:
            self.update(batch)

    def _batch(self, batch_size: int | None) -> int:
        if batch_size is None:
            if self._group is None:
                raise InvalidArgumentError("step() of a Trainer over a plain module needs the batch size")
            batch_size = self._group.batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self._batch_size = batch_size
        return batch_size

    def update(self, batch_size: int | None = None) -> None:
        """Run the optimizer on the (already summed) gradients (``update_on_kvstore=False`` only).

        Device 0's parameters are updated and copied to the other devices.
        """
        if self.update_on_kvstore or self._updater is None:
            raise InvalidArgumentError("update() is for update_on_kvstore=False; use step()")
        batch = self._batch(batch_size)
        self._optimizer.rescale_grad = 1.0 / (batch * self._worker_factor)
        for b in range(len(self._buckets)):
            self._adopt_grads(b)
        with torch.no_grad():
            self._updater(list(self.keys), [g[0] for g in self._grads], [w[0] for w in self._weights])
            for copies in self._weights:
                for other in copies[1:]:
                    other.copy_(copies[0])

    def shadow_step(self, batch_size: int | None = None) -> None:
        """Take part in a step without data: exchange zero gradients and update like the others.

        For uneven data (:class:`pskv.parallel.uneven.UnevenSteps`): a worker that ran out
        of batches keeps joining the other workers' sync rounds, contributing nothing to
        the sums, and applies the same update, so every worker keeps the same parameters
        (and, with a local optimizer, the same optimizer state).
        """
        batch = self._batch(batch_size)
        self._ensure_params()
        self._finish_sends()
        with torch.no_grad():
            for b in range(len(self._buckets)):
                self._adopt_grads(b)
                for g in self._grads[b]:
                    g.zero_()
        with self._lock:
            self._reset_counts()
        if self.update_on_kvstore:
            self._ensure_optimizer(batch)
        if self._tables:
            self._tables.begin_step(self._optimizer_batch, batch)
            self._tables.push()  # nothing came: an empty push joins the round
        self._communicate()
        self._tables.finish()
        if not self.update_on_kvstore:
            self.update(batch)

    # -- optimizer states ---------------------------------------------------------------------
    def save_states(self, fname: str) -> None:
        """Save the optimizer state (with its config): the store's (in distributed mode rank 0
        writes each server's as ``<fname>.server<rank>``; collective) or this process's."""
        self._finish_sends()
        if self.update_on_kvstore:
            assert self._kv is not None
            self._ensure_params()
            if self._optimizer_batch is None:
                self._ensure_optimizer(self._batch_size or (self._group.batch_size if self._group else 1) or 1)
            self._kv.save_optimizer_states(fname, dump_optimizer=True)
        else:
            assert self._updater is not None
            self._updater.save_states(fname, dump_optimizer=True)

    def load_states(self, fname: str) -> None:
        """Load what :meth:`save_states` wrote (collective in distributed mode)."""
        self._finish_sends()
        if self.update_on_kvstore:
            assert self._kv is not None
            self._ensure_params()
            if self._optimizer_batch is None:
                self._ensure_optimizer(self._batch_size or (self._group.batch_size if self._group else 1) or 1)
            self._kv.load_optimizer_states(fname)
        else:
            assert self._updater is not None
            self._updater.load_states(fname)
            self._optimizer = self._updater.optimizer

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, train_data: Iterable[Any], eval_data: Iterable[Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        """Train for ``num_epoch`` epochs; see :func:`pskv.parallel.fit.fit` for the arguments."""
        return fit(self, train_data, eval_data, **kwargs)

    @property
    def group(self) -> DataParallelExecutorGroup | None:
        """The group this trainer drives (None for a plain module)."""
        return self._group

    def close(self) -> None:
        """Finish pending sends, remove hooks, and close the store if this trainer created it."""
        try:
            self._finish_sends()
            self._tables.finish()
        finally:
            self._tables.detach()
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if self._owns_kv and self._kv is not None:
                self._kv.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
