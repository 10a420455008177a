"""Monitor: statistics of layer outputs and weights every ``interval`` batches (MXNet's ``mx.mon.Monitor``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from pskv.errors import InvalidArgumentError

__all__ = ["Monitor"]


def _norm_stat(x: torch.Tensor) -> torch.Tensor:
    """MXNet's default statistic: ``norm(x) / sqrt(x.size)``."""
    x = x.detach().float()
    return x.norm() / max(1, x.numel()) ** 0.5


class Monitor:
    """Collects ``stat_func`` of matching submodules' outputs (and of the weights) on selected batches.

    Install it on a group (``group.install_monitor(mon)``), call :meth:`tic` before a
    batch's forward and :meth:`toc` after it; every ``interval``-th batch is recorded.

    Args:
        interval: record every this many batches.
        stat_func: tensor -> statistic tensor (default: ``norm(x) / sqrt(x.numel())``).
        pattern: regular expression on qualified names (``'fc1'``, ``'fc1.weight'``...).
        sort: sort the records of a batch by name.
        monitor_all: also record parameters (weights) at :meth:`toc`.
    """

    def __init__(self, interval: int, stat_func: Callable[[torch.Tensor], Any] | None = None,
                 pattern: str = ".*", sort: bool = False, monitor_all: bool = True) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise InvalidArgumentError(f"Monitor interval must be an int >= 1, got {interval!r}")
        self.interval = interval
        self.stat_func = stat_func or _norm_stat
        self.re = re.compile(pattern)
        self.sort = sort
        self.monitor_all = monitor_all
        self.step = 0
        self.activated = False
        self.queue: list[tuple[int, str, Any]] = []
        self._groups: list[Any] = []
        self._handles: list[Any] = []

    def install(self, group: Any) -> None:
        """Hook every matching submodule of every replica of ``group`` (called by ``install_monitor``)."""
        self._groups.append(group)
        for device, replica in enumerate(group.replicas):
            for name, module in replica.named_modules():
                if name and self.re.match(name):
                    self._handles.append(module.register_forward_hook(self._hook(f"{name}_output", device)))

    def _hook(self, name: str, device: int) -> Callable[..., None]:
        def record(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            if not self.activated:
                return
            outs = output if isinstance(output, (tuple, list)) else [output]
            for k, o in enumerate(outs):
                if isinstance(o, torch.Tensor):
                    label = name if len(outs) == 1 else f"{name}{k}"
                    self.queue.append((self.step, f"dev{device}:{label}", self.stat_func(o)))
        return record

    def tic(self) -> None:
        """Start recording if this batch is one of every ``interval``."""
        if self.step % self.interval == 0:
            self.queue = []
            self.activated = True
        self.step += 1

    def toc(self) -> list[tuple[int, str, str]]:
        """Stop recording; returns ``[(batch, name, statistic as text), ...]`` (empty when inactive)."""
        if not self.activated:
            return []
        if self.monitor_all:
            for group in self._groups:
                for name, copies in zip(group.param_names, group.param_arrays):
                    if self.re.match(name):
                        for device, p in enumerate(copies):
                            self.queue.append((self.step, f"dev{device}:{name}", self.stat_func(p)))
        self.activated = False
        records = sorted(self.queue, key=lambda r: r[1]) if self.sort else self.queue
        self.queue = []
        out = []
        for step, name, value in records:
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy()
            out.append((step, name, str(value)))
        return out

    def toc_print(self) -> None:
        """:meth:`toc` and print the records."""
        for step, name, value in self.toc():
            print(f"Batch: {step:7d} {name:30s} {value}")

    def uninstall(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
