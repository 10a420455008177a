"""Where a process stands in its job, read from the variables of whoever started it.

``pskv launch`` (``DMLC_WORKER_ID``), torchrun and PyTorchJob (``RANK``, ``WORLD_SIZE``,
``LOCAL_*``, ``MASTER_*``), Open MPI (``OMPI_COMM_WORLD_*``), PMI (MPICH, Intel MPI) and
SLURM (``SLURM_PROCID``, the compressed node and task lists). Every function takes the
environment as a mapping: :mod:`pskv.config` (the only module that reads ``os.environ``)
passes it in (:func:`pskv.config.rank_env`, :func:`pskv.config.slurm_allocation`), and
lists the variables in ``RANK_ENV_VARS`` (docs/env.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pskv.errors import InvalidArgumentError

__all__ = ["RANK_SOURCES", "MAX_HOSTLIST", "RankEnv", "rank_of", "allocation", "expand_hostlist",
           "expand_tasks_per_node", "given", "env_int"]


RANK_SOURCES = ("pskv", "torchrun", "mpi", "pmi", "slurm")
MAX_HOSTLIST = 1 << 16  # hosts one compressed SLURM host list may name


@dataclass(frozen=True)
class RankEnv:
    """Where this process stands in its job, as the program that started it said.

    Attributes:
        source: who said it: ``'pskv'`` (``pskv launch``: ``DMLC_WORKER_ID``),
            ``'torchrun'`` (torchrun, PyTorchJob), ``'mpi'`` (Open MPI), ``'pmi'``
            (MPICH, Intel MPI) or ``'slurm'`` (srun).
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: processes of the job (pskv: workers).
        local_rank: this process's index on its host, ``< local_world_size``.
        local_world_size: processes on this host.
        master_addr: the host processes meet at (``MASTER_ADDR``; SLURM: the first host of
            the step's node list, else the allocation's), or None when the source names none.
        master_port: the port there (``MASTER_PORT``; SLURM: derived from the job and step ids), or None.
    """

    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        if self.source not in RANK_SOURCES:
            raise InvalidArgumentError(f"RankEnv.source must be one of {', '.join(RANK_SOURCES)}, got {self.source!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"{self.source}: rank {self.rank} is not in 0..world_size-1 "
                                       f"(world_size {self.world_size})")
        if not 1 <= self.local_world_size <= self.world_size or not 0 <= self.local_rank < self.local_world_size:
            raise InvalidArgumentError(f"{self.source}: local rank {self.local_rank} of {self.local_world_size} "
                                       f"on this host is not possible in a job of {self.world_size}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise InvalidArgumentError(f"{self.source}: master port {self.master_port} is not a TCP port")


def rank_of(env: Mapping[str, str]) -> RankEnv | None:
    """This process's rank as ``pskv launch`` or a cluster manager set it; None if none did.

    Looks, in this order, at ``DMLC_WORKER_ID`` / ``DMLC_NUM_WORKER`` (``pskv launch``),
    torchrun's ``RANK`` / ``WORLD_SIZE`` (PyTorchJob too), Open MPI's
    ``OMPI_COMM_WORLD_*``, PMI's ``PMI_RANK`` / ``PMI_SIZE`` (MPICH, Intel MPI) and
    SLURM's ``SLURM_PROCID`` / ``SLURM_NTASKS``; the first source with its rank variable
    set wins (:data:`RANK_ENV_VARS` lists every variable read), except that PMI's rank and
    size equal to SLURM's, without ``MPI_LOCALRANKID``, are srun's (``--mpi=pmi2``) and
    SLURM's variables are read. ``MASTER_ADDR`` /
    ``MASTER_PORT``, when set, are the master of every source.

    Raises:
        InvalidArgumentError: a source's variables are partial (a rank without a size),
            not integers, out of range, or contradict each other; the message names the
            variable and its value.
    """
    addr, port = _master(env)
    if given(env, "DMLC_WORKER_ID"):
        rank, size = _pair(env, "DMLC_WORKER_ID", "DMLC_NUM_WORKER")
        local, local_size = _local(env, "PSKV_LOCAL_RANK", "LOCAL_WORLD_SIZE", size)
        for var, value in (("RANK", rank), ("WORLD_SIZE", size)):  # pskv launch sets both; they must agree
            if given(env, var) and env_int(env, var) != value:
                raise InvalidArgumentError(f"environment variable {var}={env[var]!r} contradicts "
                                           f"DMLC_WORKER_ID={env['DMLC_WORKER_ID']!r} / "
                                           f"DMLC_NUM_WORKER={env.get('DMLC_NUM_WORKER')!r}")
        return RankEnv("pskv", rank, size, local, local_size, addr, port)
    if given(env, "RANK") or given(env, "WORLD_SIZE"):
        rank, size = _pair(env, "RANK", "WORLD_SIZE")
        local, local_size = _local(env, "LOCAL_RANK", "LOCAL_WORLD_SIZE", size)
        return RankEnv("torchrun", rank, size, local, local_size, addr, port)
    if given(env, "OMPI_COMM_WORLD_RANK") or given(env, "OMPI_COMM_WORLD_SIZE"):
        rank, size = _pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        local, local_size = _local(env, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", size)
        return RankEnv("mpi", rank, size, local, local_size, addr, port)
    if (given(env, "PMI_RANK") or given(env, "PMI_SIZE")) and not _set_by_srun(env):
        rank, size = _pair(env, "PMI_RANK", "PMI_SIZE")
        local, local_size = _local(env, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", size)
        return RankEnv("pmi", rank, size, local, local_size, addr, port)
    if given(env, "SLURM_PROCID"):
        rank, size = _pair(env, "SLURM_PROCID", "SLURM_NTASKS")
        local, local_size = _slurm_local(env, size)
        if addr is None:
            nodelist = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if given(env, v)),
                            "SLURM_NODELIST")
            if given(env, nodelist):
                addr = expand_hostlist(env[nodelist], nodelist)[0]
        if port is None and given(env, "SLURM_JOB_ID"):
            port = _slurm_port(env)
        return RankEnv("slurm", rank, size, local, local_size, addr, port)
    return None


def allocation(env: Mapping[str, str]) -> list[tuple[str, int]]:
    """The hosts of the SLURM allocation this process runs in, each with its number of tasks
    (``SLURM_JOB_NODELIST`` or ``SLURM_NODELIST``, and ``SLURM_TASKS_PER_NODE``; 1 each
    without it); ``[]`` outside an allocation.

    Raises:
        InvalidArgumentError: malformed lists, or lists of different lengths (naming both).
    """
    var = "SLURM_JOB_NODELIST" if given(env, "SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    if not given(env, var):
        return []
    hosts = expand_hostlist(env[var], var)
    if not given(env, "SLURM_TASKS_PER_NODE"):
        return [(host, 1) for host in hosts]
    counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    if len(counts) != len(hosts):
        raise InvalidArgumentError(f"environment variable SLURM_TASKS_PER_NODE={env['SLURM_TASKS_PER_NODE']!r} "
                                   f"counts {len(counts)} nodes, {var}={env[var]!r} names {len(hosts)}")
    return list(zip(hosts, counts))


def given(env: Mapping[str, str], var: str) -> bool:
    return env.get(var, "") != ""


def env_int(env: Mapping[str, str], var: str, low: int = 0) -> int:
    raw = env[var]
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidArgumentError(f"environment variable {var}={raw!r} is not a valid int") from None
    if value < low:
        raise InvalidArgumentError(f"environment variable {var}={raw!r} must be >= {low}")
    return value


def _pair(env: Mapping[str, str], rank_var: str, size_var: str) -> tuple[int, int]:
    """A source's rank and size: both set, integers, rank < size."""
    missing = [var for var in (rank_var, size_var) if not given(env, var)]
    if missing:
        present = rank_var if missing[0] == size_var else size_var
        raise InvalidArgumentError(f"environment variable {present}={env[present]!r} is set but {missing[0]} is not "
                                   "(set both or neither)")
    size = env_int(env, size_var, low=1)
    rank = env_int(env, rank_var)
    if rank >= size:
        raise InvalidArgumentError(f"environment variable {rank_var}={env[rank_var]!r} must be < "
                                   f"{size_var}={env[size_var]!r}")
    return rank, size


def _local(env: Mapping[str, str], rank_var: str, size_var: str, size: int) -> tuple[int, int]:
    """A source's local rank and local size (0 and 1 when neither is set)."""
    if not given(env, rank_var):
        if given(env, size_var) and env_int(env, size_var, low=1) > size:
            raise InvalidArgumentError(f"environment variable {size_var}={env[size_var]!r} is more than the "
                                       f"job's {size} processes")
        return 0, 1 if not given(env, size_var) else env_int(env, size_var, low=1)
    if not given(env, size_var):
        raise InvalidArgumentError(f"environment variable {rank_var}={env[rank_var]!r} is set but {size_var} "
                                   "is not (set both or neither)")
    return _checked_local(env, rank_var, env_int(env, rank_var), size_var, env_int(env, size_var, low=1), size)


def _checked_local(env: Mapping[str, str], rank_var: str, local: int, size_var: str, local_size: int,
                   size: int, limit: str = "") -> tuple[int, int]:
    """``limit``: the local size and where it came from, when it is not ``size_var``'s value itself."""
    if local_size > size:
        raise InvalidArgumentError(f"environment variable {size_var}={env[size_var]!r} is more than the job's "
                                   f"{size} processes")
    if local >= local_size:
        raise InvalidArgumentError(f"environment variable {rank_var}={env[rank_var]!r} must be < "
                                   f"{limit or f'{size_var}={env[size_var]!r}'}")
    return local, local_size


def _set_by_srun(env: Mapping[str, str]) -> bool:
    """PMI_RANK / PMI_SIZE are srun's own task rank and count (its PMI-2 plugin sets them: ``srun --mpi=pmi2``,
    ``MpiDefault=pmi2``), with none of Hydra's local variables: SLURM's then say more (the local rank, the master)."""
    return (not given(env, "MPI_LOCALRANKID") and not given(env, "MPI_LOCALNRANKS") and given(env, "SLURM_PROCID")
            and env.get("PMI_RANK", "").strip() == env["SLURM_PROCID"].strip()
            and env.get("PMI_SIZE", "").strip() == env.get("SLURM_NTASKS", "").strip())


def _slurm_port(env: Mapping[str, str]) -> int:
    """15000 + the job id's last 4 digits, moved by 7919 per step (``SLURM_STEP_ID``): two steps of one
    allocation, each a job of its own, meet at ports of their own."""
    step = env.get("SLURM_STEP_ID", "").strip()
    offset = 7919 * int(step) if _DIGITS.fullmatch(step) else 0  # a batch or interactive step has no number
    return 15000 + (env_int(env, "SLURM_JOB_ID") + offset) % 10000


def _slurm_local(env: Mapping[str, str], size: int) -> tuple[int, int]:
    """SLURM_LOCALID and this node's task count: the step's (SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]), else
    SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE[SLURM_NODEID]. The step's comes first: a step inherits
    SLURM_NTASKS_PER_NODE from its allocation even when it runs fewer tasks per node."""
    tasks_var = "SLURM_STEP_TASKS_PER_NODE" if given(env, "SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    if given(env, "SLURM_NTASKS_PER_NODE") and tasks_var != "SLURM_STEP_TASKS_PER_NODE":
        size_var, local_size = "SLURM_NTASKS_PER_NODE", env_int(env, "SLURM_NTASKS_PER_NODE", low=1)
        limit = f"{size_var}={env[size_var]!r}"
    elif given(env, tasks_var):
        size_var = tasks_var
        counts = expand_tasks_per_node(env[size_var], size_var)
        node = env_int(env, "SLURM_NODEID") if given(env, "SLURM_NODEID") else 0
        if node >= len(counts):
            raise InvalidArgumentError(f"environment variable SLURM_NODEID={env['SLURM_NODEID']!r} has no entry "
                                       f"in {size_var}={env[size_var]!r}")
        local_size = counts[node]
        limit = f"{local_size}, this node's tasks: entry {node} of {size_var}={env[size_var]!r}"
    else:
        size_var, local_size, limit = "", 1, ""
    if not given(env, "SLURM_LOCALID"):
        if size_var:
            raise InvalidArgumentError(f"environment variable {size_var}={env[size_var]!r} is set but "
                                       "SLURM_LOCALID is not")
        return 0, 1
    if not size_var:
        raise InvalidArgumentError(f"environment variable SLURM_LOCALID={env['SLURM_LOCALID']!r} is set but neither "
                                   "SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is")
    if local_size > size:  # the allocation's tasks per node may be more than a smaller step's tasks
        limit = f"{size}, SLURM_NTASKS={env['SLURM_NTASKS']!r} (fewer than {limit})"
        local_size = size
    return _checked_local(env, "SLURM_LOCALID", env_int(env, "SLURM_LOCALID"), size_var, local_size, size, limit)


def _master(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    addr = env.get("MASTER_ADDR") or None
    port = None
    if given(env, "MASTER_PORT"):
        port = env_int(env, "MASTER_PORT", low=1)
        if port > 65535:
            raise InvalidArgumentError(f"environment variable MASTER_PORT={env['MASTER_PORT']!r} is not a TCP port")
        if addr is None:
            raise InvalidArgumentError(f"environment variable MASTER_PORT={env['MASTER_PORT']!r} is set but "
                                       "MASTER_ADDR is not")
    return addr, port


_HOST_PART = re.compile(r"([^\[\],]*)(?:\[([^\[\]]*)\])?")
# a number: ASCII only (str.isdigit() takes '²', which int() refuses) and short (int() refuses 4300 digits)
_DIGITS = re.compile(r"[0-9]{1,18}")


def expand_hostlist(text: str, var: str = "SLURM_JOB_NODELIST") -> list[str]:
    """SLURM's compressed host list as host names: ``'node[01-03,07],gpu5'`` ->
    ``['node01', 'node02', 'node03', 'node07', 'gpu5']``. Ranges keep their zero
    padding; several bracket groups in one name (``'r[1-2]n[1-2]'``) give every
    combination, in SLURM's order.

    Raises:
        InvalidArgumentError: malformed text (unbalanced brackets, a bad range) or more
            than :data:`MAX_HOSTLIST` hosts; the message names ``var`` and the text.
    """
    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"environment variable {var}={text!r}: {why}")

    hosts: list[str] = []
    depth, start = 0, 0
    names = []
    for i, ch in enumerate(text + ","):  # split on commas outside brackets
        if ch == "[":
            depth += 1
            if depth > 1:
                raise bad("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise bad("']' without '['")
        elif ch == "," and depth == 0:
            names.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise bad("'[' without ']'")
    for name in names:
        if not name:
            raise bad("an empty host name")
        combos = [""]
        pos = 0
        while pos < len(name):
            m = _HOST_PART.match(name, pos)
            assert m is not None
            if m.end() == pos:
                raise bad(f"cannot read {name!r}")
            prefix, ranges = m.group(1), m.group(2)
            parts = [prefix]
            if ranges is not None:
                parts = [prefix + n for n in _expand_ranges(ranges, bad)]
            if len(hosts) + len(combos) * len(parts) > MAX_HOSTLIST:  # counted before the product is built
                raise bad(f"more than {MAX_HOSTLIST} hosts")
            combos = [c + p for c in combos for p in parts]
            pos = m.end()
        hosts.extend(combos)
    return hosts


def _expand_ranges(ranges: str, bad: Any) -> list[str]:
    out: list[str] = []
    for item in ranges.split(","):
        item = item.strip()
        low, sep, high = item.partition("-")
        if not _DIGITS.fullmatch(low) or (sep and not _DIGITS.fullmatch(high)):
            raise bad(f"{item!r} is not a number or a range of numbers")
        if not sep:
            out.append(low)
            continue
        a, b = int(low), int(high)
        if b < a:
            raise bad(f"range {item!r} runs backwards")
        if b - a + 1 + len(out) > MAX_HOSTLIST:
            raise bad(f"more than {MAX_HOSTLIST} hosts")
        out.extend(str(n).zfill(len(low)) for n in range(a, b + 1))
    return out


_TASKS = re.compile(r"\s*([0-9]{1,18})(?:\(x([0-9]{1,18})\))?\s*\Z")  # as _DIGITS


def expand_tasks_per_node(text: str, var: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """SLURM_TASKS_PER_NODE (or ``var``, e.g. SLURM_STEP_TASKS_PER_NODE) as one count per node:
    ``'2(x3),1'`` -> ``[2, 2, 2, 1]``.

    Raises:
        InvalidArgumentError: a malformed entry or more than :data:`MAX_HOSTLIST` nodes (naming ``var``).
    """
    counts: list[int] = []
    for item in text.split(","):
        m = _TASKS.match(item)
        if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise InvalidArgumentError(f"environment variable {var}={text!r}: {item!r} is not 'N' or 'N(xM)'")
        times = int(m.group(2) or 1)
        if len(counts) + times > MAX_HOSTLIST:
            raise InvalidArgumentError(f"environment variable {var}={text!r}: more than {MAX_HOSTLIST} nodes")
        counts.extend([int(m.group(1))] * times)
    return counts
