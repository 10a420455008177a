"""DataParallelExecutorGroup: one PyTorch module replicated over devices, each batch split over them.

MXNet's group bound one executor per device; here a replica of a ``torch.nn.Module``
stands for each executor. Each mini-batch is split along its batch axis in proportion
to the devices' workloads, every replica runs forward (and backward) on its slice —
concurrently, on a small thread pool, when there are several devices — and outputs,
input gradients and parameters are merged back as if one device had run the whole
batch.

Gradients follow MXNet's convention: a replica's gradient is the **sum** over its
samples (a loss with ``reduction='mean'`` is rescaled by the slice size), so summing
the replicas' gradients gives the gradient of the whole batch, and the optimizer's
``rescale_grad`` (1 / global batch size; the :class:`~pskv.parallel.Trainer` sets it)
turns the sum into a mean.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from pskv.errors import InvalidArgumentError, InvalidTypeError, ShapeMismatchError
from pskv.parallel.data import as_list, batch_arrays
from pskv.parallel.layouts import InputDesc, check_output_layouts, input_descs, integer_dtype, output_axis
from pskv.parallel.split import check_workload, split_batch

__all__ = ["DataParallelExecutorGroup", "GRAD_REQS"]

GRAD_REQS = ("write", "add", "null")
Factory = Callable[[], torch.nn.Module]


def _device(name: str | torch.device) -> torch.device:
    """``name`` as a device this machine has.

    Raises:
        InvalidArgumentError: not a device name, or a CUDA device PyTorch cannot see here.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"device {name!r} is not a device name: {exc}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidArgumentError(f"device {device} needs CUDA, but PyTorch sees no CUDA device here")
        if (device.index or 0) >= count:
            raise InvalidArgumentError(f"device {device} does not exist: PyTorch sees {count} CUDA device(s)")
    return device


def _to_tensor(x: Any, device: torch.device | None = None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if device is None else x.to(device, non_blocking=True)
    if isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
        return t if device is None else t.to(device)
    raise InvalidTypeError(f"batch arrays must be numpy arrays or torch tensors, got {type(x).__name__}")


class DataParallelExecutorGroup:
    """A module replicated over ``devices``; each mini-batch is split over them by ``workload``.

    Args:
        module: a ``torch.nn.Module`` (moved to ``devices[0]`` and used as its replica;
            deep copies serve the other devices) or a factory called once per device
            (the other replicas then copy the first one's parameters). May be None with
            ``shared_group``.
        devices: device names or ``torch.device`` objects: ``'cpu'``, ``'cuda:0'``...; a
            device may repeat (several CPU replicas).
        workload: relative share of each device in a batch (default equal).
        loss: ``loss(output, *labels)`` -> loss of a slice. Its gradient must be the sum
            over the slice's samples: a per-sample vector is summed, and a loss module
            with ``reduction='mean'`` is multiplied by the slice size. Without a loss,
            :meth:`backward` needs ``out_grads``.
        data_shapes: bind right away (see :meth:`bind_exec`).
        label_shapes: bind right away (see :meth:`bind_exec`).
        for_training: False binds for inference only (no gradients, no backward).
        inputs_need_grad: compute gradients with respect to the data inputs.
        grad_req: ``'write'``, ``'add'`` or ``'null'``, or a dict / list of them per parameter.
        fixed_param_names: parameters that are never updated (their req is ``'null'``).
        shared_group: share this group's replicas (parameters and gradients) with
            another group, e.g. one bound for another batch shape.
        concurrent: run replicas in parallel threads (default: when there are several
            devices).
        output_layouts: per output, its layout (``'TNC'``: the batch axis is 1; no
            ``'N'``: not batched, device 0's copy is the merged one) — MXNet read them
            from the symbol's ``__layout__``. Default: the first data input's batch
            axis if every device's output holds its samples there (so a time-major
            model's outputs are merged, shaped and scored along that axis, like its
            inputs), else axis 0 if it holds them there; a 0-d output is not batched.

    Raises:
        InvalidArgumentError, InvalidTypeError: bad arguments, naming them.
    """

    def __init__(self, module: torch.nn.Module | Factory | None, devices: Sequence[str | torch.device] = ("cpu",),
                 workload: Sequence[float] | None = None, loss: Callable[..., torch.Tensor] | None = None,
                 data_shapes: Iterable[Any] | None = None, label_shapes: Iterable[Any] | None = None,
                 for_training: bool = True, inputs_need_grad: bool = False,
                 grad_req: str | Mapping[str, str] | Sequence[str] = "write",
                 fixed_param_names: Iterable[str] = (), shared_group: DataParallelExecutorGroup | None = None,
                 concurrent: bool | None = None, output_layouts: Sequence[str | None] | None = None) -> None:
        self.devices = [_device(d) for d in devices]
        self.output_layouts = check_output_layouts(output_layouts)
        self.workload = check_workload(workload, len(self.devices))
        self.loss = loss
        self.for_training = bool(for_training)
        self.inputs_need_grad = bool(inputs_need_grad) and self.for_training
        self.fixed_param_names = set(fixed_param_names)
        self.shared_group = shared_group
        if shared_group is not None:
            if [str(d) for d in shared_group.devices] != [str(d) for d in self.devices]:
                raise InvalidArgumentError(
                    f"shared_group lives on {[str(d) for d in shared_group.devices]}, "
                    f"this group on {[str(d) for d in self.devices]}: they must match"
                )
            self.replicas: list[torch.nn.Module] = shared_group.replicas
        elif module is None:
            raise InvalidArgumentError("give a module (or a factory) or a shared_group")
        else:
            self.replicas = self._replicate(module)
        self.param_names = [n for n, _ in self.replicas[0].named_parameters()]
        self.aux_names = [n for n, _ in self.replicas[0].named_buffers()]
        unknown = self.fixed_param_names - set(self.param_names)
        if unknown:
            raise InvalidArgumentError(f"fixed_param_names names unknown parameters: {sorted(unknown)}")
        self.grad_req = self._resolve_grad_req(grad_req)
        self._apply_grad_req()
        self.param_arrays: list[list[torch.Tensor]] = [
            [dict(r.named_parameters())[n] for r in self.replicas] for n in self.param_names
        ]
        self.grad_arrays: list[list[torch.Tensor | None]] = []
        self._alloc_grads()
        workers = len(self.devices) if (concurrent if concurrent is not None else len(self.devices) > 1) else 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="pskv-group") if workers > 1 else None
        self._forward_listeners: list[Callable[[DataParallelExecutorGroup], None]] = []
        self.data_shapes: list[InputDesc] = []
        self.label_shapes: list[InputDesc] = []
        self.batch_size = 0
        self.slices: list[slice] = []
        self._outputs: list[list[torch.Tensor]] | None = None
        self._losses: list[torch.Tensor | None] = []
        self._inputs: list[list[torch.Tensor]] = []
        self._output_shapes: list[tuple[str, tuple[int, ...]]] | None = None
        self._last_train = False
        if data_shapes is not None:
            self.bind_exec(data_shapes, label_shapes)

    # -- construction ------------------------------------------------------------------
    def _replicate(self, module: torch.nn.Module | Factory) -> list[torch.nn.Module]:
        if isinstance(module, torch.nn.Module):
            first = module.to(self.devices[0])
            return [first] + [copy.deepcopy(first).to(d) for d in self.devices[1:]]
        if not callable(module):
            raise InvalidTypeError(f"module must be a torch.nn.Module or a factory, got {type(module).__name__}")
        replicas = []
        for d in self.devices:
            made = module()
            if not isinstance(made, torch.nn.Module):
                raise InvalidTypeError(f"the module factory returned {type(made).__name__}, not a torch.nn.Module")
            replicas.append(made.to(d))
        state = replicas[0].state_dict()
        for r in replicas[1:]:
            r.load_state_dict(state)
        return replicas

    def _resolve_grad_req(self, grad_req: str | Mapping[str, str] | Sequence[str]) -> dict[str, str]:
        if isinstance(grad_req, str):
            reqs = dict.fromkeys(self.param_names, grad_req)
        elif isinstance(grad_req, Mapping):
            unknown = set(grad_req) - set(self.param_names)
            if unknown:
                raise InvalidArgumentError(f"grad_req names unknown parameters: {sorted(unknown)}")
            reqs = {n: grad_req.get(n, "write") for n in self.param_names}
        else:
            reqs_list = list(grad_req)
            if len(reqs_list) != len(self.param_names):
                raise InvalidArgumentError(
                    f"grad_req has {len(reqs_list)} entries for {len(self.param_names)} parameters"
                )
            reqs = dict(zip(self.param_names, reqs_list))
        for name, req in reqs.items():
            if req not in GRAD_REQS:
                raise InvalidArgumentError(f"grad_req of parameter {name!r} is {req!r}; use one of {GRAD_REQS}")
        for name in reqs:
            if name in self.fixed_param_names or not self.for_training:
                reqs[name] = "null"
        return reqs

    def _apply_grad_req(self) -> None:
        for r in self.replicas:
            for name, p in r.named_parameters():
                p.requires_grad_(self.grad_req[name] != "null")

    def _alloc_grads(self) -> None:
        """Persistent gradient buffers, so ``grad_arrays`` stays valid between steps."""
        self.grad_arrays = []
        for name, params in zip(self.param_names, self.param_arrays):
            if self.grad_req[name] == "null":
                self.grad_arrays.append([None] * len(params))
                continue
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self.grad_arrays.append([p.grad for p in params])

    # -- binding -----------------------------------------------------------------------
    def bind_exec(self, data_shapes: Iterable[Any], label_shapes: Iterable[Any] | None = None,
                  shared_group: DataParallelExecutorGroup | None = None, reshape: bool = False) -> None:
        """Bind for inputs of these shapes: fixes the batch size and each device's slice.

        Args:
            data_shapes: ``DataDesc`` objects (their ``layout`` picks the batch axis,
                ``'N'``; no layout: axis 0) or ``(name, shape)`` pairs.
            label_shapes: the same for labels (optional).
            shared_group: share parameters with that group (only before the first bind).
            reshape: re-bind a bound group for new shapes (same as :meth:`reshape`).

        Raises:
            InvalidArgumentError: no data, inputs with different batch sizes, or a
                rebind without ``reshape=True``.
        """
        if self.data_shapes and not reshape:
            raise InvalidArgumentError("the group is already bound; use reshape() or bind_exec(..., reshape=True)")
        if shared_group is not None and shared_group is not self.shared_group:
            raise InvalidArgumentError("give shared_group when building the group, not at bind time")
        data = input_descs(data_shapes, "data_shapes")
        labels = input_descs(label_shapes, "label_shapes")
        if not data:
            raise InvalidArgumentError("bind_exec needs at least one data shape")
        sizes = {d.shape[d.axis] for d in data + labels if d.axis >= 0}
        if len(sizes) != 1:
            raise InvalidArgumentError(
                "all split inputs must share one batch size; got "
                + ", ".join(f"{d.name}={d.shape}" for d in data + labels)
            )
        self.data_shapes, self.label_shapes = data, labels
        self._set_batch_size(sizes.pop())
        self._output_shapes = None

    def reshape(self, data_shapes: Iterable[Any], label_shapes: Iterable[Any] | None = None) -> None:
        """Re-bind for new input shapes (e.g. a different batch size); parameters are kept."""
        self.bind_exec(data_shapes, label_shapes, reshape=True)

    def _set_batch_size(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.slices = split_batch(batch_size, self.workload)

    def _check_bound(self, op: str) -> None:
        if not self.data_shapes:
            raise InvalidArgumentError(f"cannot {op}: bind the group first (bind_exec)")

    @property
    def active_devices(self) -> list[int]:
        """Indices of the devices that got a non-empty slice of the current batch."""
        return [i for i, s in enumerate(self.slices) if s.stop > s.start]

    # -- computation ---------------------------------------------------------------------
    def _run(self, fn: Callable[[int], Any], devices: Sequence[int]) -> list[Any]:
        if self._pool is None or len(devices) < 2:
            return [fn(i) for i in devices]
        futures = [self._pool.submit(fn, i) for i in devices]
        return [f.result() for f in futures]

    def _split(self, x: Any, desc: InputDesc, i: int) -> torch.Tensor:
        return self._slice(x, desc, i).to(self.devices[i], non_blocking=True)

    def _slice(self, x: Any, desc: InputDesc, i: int) -> torch.Tensor:
        """Device ``i``'s slice of ``x`` along ``desc``'s batch axis (all of it for -1), where ``x`` is."""
        t = _to_tensor(x)
        if desc.axis >= 0:
            t = t.narrow(desc.axis, self.slices[i].start, self.slices[i].stop - self.slices[i].start)
        return t

    def _inputs_for(self, arrays: list[Any], descs: list[InputDesc], what: str) -> list[InputDesc]:
        """Descriptions matching ``arrays``; the batch size follows the batch (auto-reshape)."""
        if len(arrays) != len(descs):
            raise InvalidArgumentError(f"the batch has {len(arrays)} {what} arrays, the group was bound for {len(descs)}")
        sizes = set()
        for x, d in zip(arrays, descs):
            shape = tuple(x.shape)
            if len(shape) != len(d.shape) or any(a != b for k, (a, b) in enumerate(zip(shape, d.shape)) if k != d.axis):
                raise ShapeMismatchError(d.name, f"forward ({what} input)", d.shape, shape)
            if d.axis >= 0:
                sizes.add(shape[d.axis])
        if len(sizes) > 1:
            raise InvalidArgumentError(f"the batch's {what} arrays have different batch sizes: {sorted(sizes)}")
        if sizes and sizes != {self.batch_size}:
            self._set_batch_size(sizes.pop())
        return descs

    def add_forward_listener(self, listener: Callable[[DataParallelExecutorGroup], None]) -> None:
        """Call ``listener(group)`` at the start of every :meth:`forward` (the Trainer uses it)."""
        self._forward_listeners.append(listener)

    def forward(self, data_batch: Any, is_train: bool | None = None) -> None:
        """Split the batch by workload and run every replica's forward (and loss) on its slice.

        Args:
            data_batch: a ``DataBatch`` (``.data`` and ``.label`` lists), a ``(data,
                label)`` pair (arrays or lists of arrays) or a bare data array; NumPy
                arrays or tensors. A batch size other than the bound one re-splits
                (the last, smaller batch of an epoch just works).
            is_train: train mode (dropout, batch statistics, autograd); default
                ``for_training``.

        Raises:
            ShapeMismatchError: the batch does not fit the bound shapes.
        """
        self._check_bound("forward")
        train = self.for_training if is_train is None else bool(is_train)
        if train and not self.for_training:
            raise InvalidArgumentError("forward(is_train=True) on a group bound with for_training=False")
        data, labels = batch_arrays(data_batch)
        self._inputs_for(data, self.data_shapes, "data")
        if labels and self.label_shapes:
            self._inputs_for(labels, self.label_shapes, "label")
        elif labels and not self.label_shapes:
            self.label_shapes = [InputDesc(f"label{k}", tuple(x.shape), 0) for k, x in enumerate(labels)]
        for listener in self._forward_listeners:
            listener(self)
        self._last_train = train
        devices = self.active_devices
        n = len(self.devices)
        self._inputs = [[] for _ in range(n)]
        outputs: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._outputs = outputs
        self._losses = [None] * n

        def run(i: int) -> None:
            replica = self.replicas[i]
            replica.train(train)
            xs = [self._split(x, d, i) for x, d in zip(data, self.data_shapes)]
            if self.inputs_need_grad and train:
                xs = [x.detach().requires_grad_(True) if x.is_floating_point() else x for x in xs]
            ys = [self._split(y, d, i) for y, d in zip(labels, self.label_shapes)]
            with torch.set_grad_enabled(train):
                out = replica(*xs)
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                if self.loss is not None and ys:
                    self._losses[i] = self._slice_loss(outs[0], ys, self.slices[i].stop - self.slices[i].start)
            self._inputs[i] = xs
            outputs[i] = outs
        self._run(run, devices)

    def _slice_loss(self, out: torch.Tensor, ys: list[torch.Tensor], n: int) -> torch.Tensor:
        assert self.loss is not None
        value = self.loss(out, *ys)
        if value.ndim > 0:
            return value.sum()
        if getattr(self.loss, "reduction", None) == "mean":
            return value * n
        return value

    def backward(self, out_grads: Any = None) -> None:
        """Backward on every replica: gradients of the loss, or of the outputs given ``out_grads``.

        Gradients are written (``grad_req='write'``) or added (``'add'``) to each
        replica's parameters' ``.grad`` (the tensors in :attr:`grad_arrays`).

        Args:
            out_grads: gradients of the outputs, as for one device on the whole batch
                (split like the batch). Required when the group has no loss.

        Raises:
            InvalidArgumentError: not bound for training, no forward before, or no
                loss and no ``out_grads``.
        """
        if not self.for_training:
            raise InvalidArgumentError("backward() needs a group bound with for_training=True")
        if self._outputs is None or not self._last_train:
            raise InvalidArgumentError("backward() needs a forward(is_train=True) first")
        grads = as_list(out_grads)
        if not grads and self.loss is None:
            raise InvalidArgumentError("the group has no loss: give backward(out_grads=...)")
        for name, gs in zip(self.param_names, self.grad_arrays):
            if self.grad_req[name] == "write":
                for g in gs:
                    if g is not None:
                        g.zero_()
        devices = self.active_devices
        outputs, losses = self._outputs, self._losses

        def run(i: int) -> None:
            if grads:
                outs = outputs[i][: len(grads)]
                slices = [self._split(g, InputDesc(f"out_grad{k}", tuple(g.shape),
                                                self._output_axis(k, [tuple(g.shape)], [self.batch_size])), i)
                          for k, g in enumerate(grads)]
                for k, (out, piece) in enumerate(zip(outs, slices)):
                    if out.shape != piece.shape:
                        raise InvalidArgumentError(f"backward: out_grads[{k}] gives device {i} a slice of shape "
                                                   f"{tuple(piece.shape)} for its output {k} of shape {tuple(out.shape)}")
                torch.autograd.backward(outs, grad_tensors=slices)
            else:
                loss = losses[i]
                if loss is None:
                    raise InvalidArgumentError("backward() with a loss needs labels in the forward batch")
                loss.backward()
        self._run(run, devices)

    # -- results -----------------------------------------------------------------------
    def get_outputs(self, merge_multi_context: bool = True) -> list[Any]:
        """Outputs of the last forward: merged over devices (concatenated on the batch axis,
        on ``devices[0]``) or, with ``merge_multi_context=False``, ``[[out_dev0, out_dev1...], ...]``."""
        if self._outputs is None:
            raise InvalidArgumentError("no outputs yet: call forward() first")
        devices = self.active_devices
        per_output = [[self._outputs[i][k] for i in devices] for k in range(len(self._outputs[devices[0]]))]
        if not merge_multi_context:
            return per_output
        merged = []
        sizes = [self.slices[i].stop - self.slices[i].start for i in devices]
        for k, outs in enumerate(per_output):
            axis = self._output_axis(k, [tuple(t.shape) for t in outs], sizes)
            merged.append(torch.cat([t.to(self.devices[0]) for t in outs], dim=axis)
                          if len(outs) > 1 and axis >= 0 else outs[0])
        return merged

    def _output_axis(self, k: int, shapes: list[tuple[int, ...]], sizes: list[int]) -> int:
        """The batch axis of output ``k`` (see :func:`~pskv.parallel.layouts.output_axis`)."""
        default = max(self.data_shapes[0].axis, 0) if self.data_shapes else 0
        return output_axis(k, shapes, sizes, self.output_layouts, default)

    def get_loss(self) -> float:
        """The summed loss of the last forward over all devices (a Python float)."""
        values = [v for v in self._losses if v is not None]
        if not values:
            raise InvalidArgumentError("no loss yet: forward() a batch with labels on a group with a loss")
        return float(sum(float(v.detach()) for v in values))

    def get_input_grads(self, merge_multi_context: bool = True) -> list[Any]:
        """Gradients with respect to the data inputs (needs ``inputs_need_grad=True``)."""
        if not self.inputs_need_grad:
            raise InvalidArgumentError("get_input_grads() needs a group built with inputs_need_grad=True")
        devices = self.active_devices
        per_input: list[list[torch.Tensor]] = []
        for k in range(len(self.data_shapes)):
            grads = [self._inputs[i][k].grad for i in devices]
            if any(g is None for g in grads):
                raise InvalidArgumentError("no input gradients yet: call backward() first")
            per_input.append([g for g in grads if g is not None])
        if not merge_multi_context:
            return per_input
        merged = []
        for gs, d in zip(per_input, self.data_shapes):
            axis = max(d.axis, 0)
            merged.append(torch.cat([g.to(self.devices[0]) for g in gs], dim=axis) if len(gs) > 1 else gs[0])
        return merged

    @property
    def output_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """``[(name, shape), ...]`` of the merged outputs for the bound batch size.

        Found once by running replica 0 in inference mode on zeros of its slice's shape.
        """
        self._check_bound("get output shapes")
        if self._output_shapes is None:
            replica, device = self.replicas[0], self.devices[0]
            i = self.active_devices[0]
            n = self.slices[i].stop - self.slices[i].start
            xs = []
            first = next(replica.parameters(), None)  # a module without parameters: the default dtype
            dtype = torch.get_default_dtype() if first is None else first.dtype
            for d in self.data_shapes:
                shape = list(d.shape)
                if d.axis >= 0:
                    shape[d.axis] = n
                xs.append(torch.zeros(shape, device=device, dtype=integer_dtype(d.dtype) or dtype))
            was_training = replica.training
            replica.eval()
            try:
                with torch.no_grad():
                    out = replica(*xs)
            finally:
                replica.train(was_training)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            shapes = []
            for k, o in enumerate(outs):
                shape = list(o.shape)
                axis = self._output_axis(k, [tuple(shape)], [n])
                if axis >= 0:
                    shape[axis] = shape[axis] * self.batch_size // n
                shapes.append((f"output{k}", tuple(shape)))
            self._output_shapes = shapes
        return self._output_shapes

    def update_metric(self, eval_metric: Any, labels: Any, pre_sliced: bool = False) -> None:
        """Accumulate ``eval_metric`` on every device's outputs against its slice of ``labels``.

        Each label is sliced along its batch axis (its layout's ``'N'`` in ``label_shapes``;
        default 0), as in :meth:`forward`.

        Args:
            eval_metric: an object with MXNet's ``update(labels, preds)``.
            labels: the batch's label arrays (or, with ``pre_sliced``, one list per device).

        Raises:
            InvalidArgumentError: no forward yet, or a label's batch axis does not hold the batch.
        """
        if self._outputs is None:
            raise InvalidArgumentError("update_metric() needs a forward() first")
        labels = as_list(labels)
        descs = []
        if not pre_sliced:
            for k, y in enumerate(labels):
                t = _to_tensor(y)
                axis = self.label_shapes[k].axis if k < len(self.label_shapes) else 0
                if axis >= 0 and (t.ndim <= axis or t.shape[axis] != self.batch_size):
                    raise InvalidArgumentError(f"update_metric: label {k} of shape {tuple(t.shape)} does not hold "
                                               f"the batch of {self.batch_size} on its batch axis {axis}")
                descs.append(InputDesc(f"label{k}", tuple(t.shape), axis))
        for n, i in enumerate(self.active_devices):
            if pre_sliced:
                device_labels = as_list(labels[n])
            else:
                device_labels = [self._slice(y, d, i) for y, d in zip(labels, descs)]
            eval_metric.update(device_labels, [o.detach() for o in self._outputs[i]])

    # -- parameters ----------------------------------------------------------------------
    def get_params(self, arg_params: dict[str, Any] | None = None,
                   aux_params: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Parameters (arg) and buffers (aux, e.g. BatchNorm statistics), averaged over devices.

        Entries already in the given dicts are updated in place (MXNet's contract);
        missing ones are added as new CPU tensors. Integer buffers (counters) are taken
        from device 0. Returns the two dicts.
        """
        arg_params = {} if arg_params is None else arg_params
        aux_params = {} if aux_params is None else aux_params
        with torch.no_grad():
            for name, copies in zip(self.param_names, self.param_arrays):
                self._store_mean(arg_params, name, copies)
            buffers = [dict(r.named_buffers()) for r in self.replicas]
            for name in self.aux_names:
                self._store_mean(aux_params, name, [b[name] for b in buffers])
        return arg_params, aux_params

    @staticmethod
    def _store_mean(target: dict[str, Any], name: str, copies: list[torch.Tensor]) -> None:
        if copies[0].is_floating_point() and len(copies) > 1:
            value = torch.stack([c.detach().to("cpu", torch.float64) for c in copies]).mean(0)
        else:
            value = copies[0].detach().to("cpu")
        old = target.get(name)
        if old is None:
            target[name] = value.to(copies[0].dtype).clone()
        elif isinstance(old, np.ndarray):
            np.copyto(old, value.numpy().astype(old.dtype, copy=False))
        else:
            old.copy_(value)

    def set_params(self, arg_params: Mapping[str, Any], aux_params: Mapping[str, Any] | None = None,
                   allow_extra: bool = False) -> None:
        """Copy parameters and buffers into every replica.

        Raises:
            InvalidArgumentError: a name the module does not have (unless ``allow_extra``).
            ShapeMismatchError: a value's shape differs from the parameter's.
        """
        aux_params = aux_params or {}
        extra = (set(arg_params) - set(self.param_names)) | (set(aux_params) - set(self.aux_names))
        if extra and not allow_extra:
            raise InvalidArgumentError(f"set_params got names the module does not have: {sorted(extra)} "
                                       "(pass allow_extra=True to ignore them)")
        with torch.no_grad():
            for r in self.replicas:
                for table, values in ((dict(r.named_parameters()), arg_params), (dict(r.named_buffers()), aux_params)):
                    for name, value in values.items():
                        if name not in table:
                            continue
                        target, src = table[name], _to_tensor(value)
                        if tuple(src.shape) != tuple(target.shape):
                            raise ShapeMismatchError(name, "set_params", tuple(target.shape), tuple(src.shape))
                        target.copy_(src)

    # -- monitoring ----------------------------------------------------------------------
    def install_monitor(self, monitor: Any) -> None:
        """Let ``monitor`` (a :class:`~pskv.parallel.Monitor`) see every forward's outputs."""
        monitor.install(self)

    def close(self) -> None:
        """Stop the replica threads (the group is unusable afterwards)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __repr__(self) -> str:
        return (f"<DataParallelExecutorGroup devices={[str(d) for d in self.devices]} workload={self.workload} "
                f"batch_size={self.batch_size} params={len(self.param_names)}>")

