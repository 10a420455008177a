"""pskv's settings: the only module that reads ``os.environ``.

Precedence everywhere: an explicit argument, then the environment, then the default
below. Every variable is listed in ``docs/env.md``; keep the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from pskv.errors import InvalidArgumentError

__all__ = ["Config", "ENV_VARS"]


def _default_kernel_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


# variable name -> (Config field, one-line meaning). docs/env.md mirrors this table.
ENV_VARS: dict[str, tuple[str, str]] = {
    "PSKV_KERNEL_THREADS": (
        "kernel_threads",
        "threads that sum and copy large CPU arrays (default: min(4, CPU count))",
    ),
    "PSKV_KERNEL_PARALLEL_BYTES": (
        "kernel_parallel_bytes",
        "arrays at least this many bytes are split over the kernel threads (default 1048576)",
    ),
    "PSKV_ENGINE_THREADS": (
        "engine_threads",
        "threads that run non-blocking (block=False) operations (default 2)",
    ),
    "PSKV_DEFAULT_TIMEOUT": (
        "default_timeout",
        "seconds a blocking call waits for queued work before raising TimeoutError (default 300)",
    ),
}


@dataclass(frozen=True)
class Config:
    """Resolved settings of one store.

    Attributes:
        kernel_threads: threads for large CPU sums/copies (1 disables threading).
        kernel_parallel_bytes: size from which CPU kernels use several threads.
        engine_threads: threads running non-blocking operations.
        default_timeout: seconds a blocking operation may wait behind queued work.
    """

    kernel_threads: int = _default_kernel_threads()
    kernel_parallel_bytes: int = 1 << 20
    engine_threads: int = 2
    default_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.kernel_threads < 1:
            raise InvalidArgumentError(f"kernel_threads must be >= 1, got {self.kernel_threads}")
        if self.kernel_parallel_bytes < 0:
            raise InvalidArgumentError(f"kernel_parallel_bytes must be >= 0, got {self.kernel_parallel_bytes}")
        if self.engine_threads < 1:
            raise InvalidArgumentError(f"engine_threads must be >= 1, got {self.engine_threads}")
        if not self.default_timeout > 0:
            raise InvalidArgumentError(f"default_timeout must be > 0, got {self.default_timeout}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a Config from the environment; keyword ``overrides`` win over it.

        Raises:
            InvalidArgumentError: a variable holds a value of the wrong type or range,
                or an override names an unknown setting.
        """
        env = os.environ if environ is None else environ
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for var, (name, _doc) in ENV_VARS.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            convert = float if types[name] in ("float", float) else int
            try:
                values[name] = convert(raw)
            except ValueError:
                raise InvalidArgumentError(f"environment variable {var}={raw!r} is not a valid {convert.__name__}") from None
        unknown = set(overrides) - set(types)
        if unknown:
            raise InvalidArgumentError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(types)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)
