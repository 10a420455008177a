"""pskv's settings: the only module that reads ``os.environ``.

Two frozen dataclasses:

* :class:`Config` — settings of a store in this process (``PSKV_*``);
* :class:`ClusterConfig` — the cluster contract between the launcher (or a cluster
  manager) and each process, compatible with MXNet / ps-lite (``DMLC_*``, ``PS_*``).

Precedence everywhere: an explicit argument, then the environment, then the default.
Every variable is listed in ``docs/env.md``; a test keeps the two in step.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, TypeVar

from pskv.errors import InvalidArgumentError
from pskv.ranks import RankEnv, allocation, env_int, expand_hostlist, expand_tasks_per_node, given, rank_of

__all__ = ["Config", "ClusterConfig", "ENV_VARS", "CLUSTER_ENV_VARS", "LOG_LEVELS", "log_level_from_env",
           "RANK_ENV_VARS", "RankEnv", "rank_env", "expand_hostlist", "expand_tasks_per_node",
           "LAUNCHER_ENV_VARS", "omp_num_threads_set", "slurm_allocation", "TORCH_ENV_VARS", "torch_store_name"]

T = TypeVar("T")


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
        "a sum/copy batch is split over the kernel threads when each thread gets at least this many bytes (default 1048576)",
    ),
    "PSKV_ENGINE_THREADS": (
        "engine_threads",
        "threads that run non-blocking (block=False) operations (default 2)",
    ),
    "PSKV_DEFAULT_TIMEOUT": (
        "default_timeout",
        "seconds a blocking call waits for queued work before raising OperationTimeoutError (default 300)",
    ),
}

CLUSTER_ENV_VARS: dict[str, tuple[str, str]] = {
    "DMLC_ROLE": ("role", "worker, server or scheduler (default worker)"),
    "DMLC_PS_ROOT_URI": ("root_uri", "the scheduler's host"),
    "DMLC_PS_ROOT_PORT": ("root_port", "the scheduler's port"),
    "DMLC_NUM_SERVER": ("num_servers", "number of server processes"),
    "DMLC_NUM_WORKER": ("num_workers", "number of worker processes"),
    "DMLC_NODE_HOST": ("node_host", "address this node binds and advertises (default: 127.0.0.1 when the scheduler is on loopback, else this host's address on the route to the scheduler)"),
    "DMLC_INTERFACE": ("interface", "network interface whose IPv4 address this node binds, if DMLC_NODE_HOST is unset"),
    "DMLC_WORKER_ID": ("rank", "this worker's rank, if the launcher assigns it (else by arrival)"),
    "PSKV_SERVER_RANK": ("server_rank", "this server's rank, if the launcher assigns it (else by arrival)"),
    # BytePS's name first: the later entry wins when both are set
    "BYTEPS_LOCAL_RANK": ("local_rank", "BytePS's name for PSKV_LOCAL_RANK (used when PSKV_LOCAL_RANK is unset)"),
    "PSKV_LOCAL_RANK": ("local_rank", "this worker's index among the workers on its host (default: the cluster manager's local rank, e.g. torchrun's LOCAL_RANK, SLURM_LOCALID, when DMLC_WORKER_ID is unset; else its rank when the scheduler is on loopback, else 0)"),
    "PSKV_LOG_LEVEL": ("log_level", "DEBUG, INFO, WARNING or ERROR: the least severe of pskv's own log records a process shows, time-stamped (default: INFO in servers and the scheduler, WARNING in workers); pskv launch passes it to every process"),
    "PS_VERBOSE": ("verbose", "1 logs connections, 2 logs every message (default 0)"),
    "PS_HEARTBEAT_INTERVAL": ("heartbeat_interval", "seconds between heartbeats; 0 disables (default 1)"),
    "PS_HEARTBEAT_TIMEOUT": ("heartbeat_timeout", "seconds without a heartbeat before a node counts as dead (default 10)"),
    "MXNET_KVSTORE_BIGARRAY_BOUND": ("bigarray_bound", "MXNet's placement: arrays with at least this many elements are split over all servers, smaller ones go whole to one; the same in every process of a job (default 0: pskv's even placement, every value cut into equal slices of at least 16 KiB over up to all servers; docs/distributed.md)"),
    "PSKV_KEEP_FREED_BYTES": ("keep_freed_bytes", "bytes of freed memory a server or worker process keeps for its next messages instead of handing it back to the kernel (glibc malloc settings; default 1073741824; 0: malloc's defaults)"),
    "PSKV_IO_THREADS": ("io_threads", "ZeroMQ I/O threads of a server or worker process (default 0: pskv's choice, 2)"),
    "PSKV_DATA_CHANNEL": ("data_channel", "how workers send arrays to servers on other hosts: tcp (TCP connections, pskv.transport.stream; sealed with AES-GCM in a job with PSKV_CURVE_KEY_FILE, pskv.transport.sealed) or zmq (ZeroMQ, CURVE in a keyed job) (default tcp)"),
    "PSKV_PART_BYTES": ("part_bytes", "bytes of one part of a value on a server and of one socket message's values: longer slices are cut, so big values travel as a pipeline of pieces; the same in every worker of a job (default: 1048576 between hosts, 4194304 when every node is on one host; chosen from the link and the model, docs/distributed.md; 0: no cut)"),
    "PSKV_CALL_WINDOW": ("call_window", "messages of one call of one key a worker keeps unanswered per server between hosts: the next goes as a reply comes, so W workers' flows into a server stay even (default 4; 0: no limit; pskv.worker.pacing)"),
    "PSKV_MAX_TABLE_BYTES": ("max_table_bytes", "bytes of row-sparse keys (their ranges of rows) one server holds at most: an init that would pass it is refused (default 17179869184)"),
    "PSKV_STARTUP_TIMEOUT": ("startup_timeout", "seconds to wait for every node to register (default 60)"),
    "PSKV_REQUEST_TIMEOUT": ("request_timeout", "seconds a request waits for its reply before OperationTimeoutError (default 300)"),
    "PSKV_STALL_REPORT": ("stall_report", "seconds a sync round may wait before its server logs which workers are missing (default 30; 0 off)"),
    "PSKV_JOB_ID": ("job_id", "an id of this job (set by pskv launch); names the servers' shared-memory files"),
    "PSKV_CURVE_KEY_FILE": ("curve_key_file", "a CURVE cluster key file (pskv keygen): authenticate and encrypt all traffic with it (default: off)"),
    "PSKV_CHECKPOINT_DIR": ("checkpoint_dir", "where kv.save_checkpoint() without a path writes ckpt-<n> directories (pskv launch --checkpoint-dir)"),
    "PSKV_STATE_DIR": ("state_dir", "the directory under which servers write the checkpoints workers name (kv.save_checkpoint(path)), besides PSKV_CHECKPOINT_DIR (default: the server's working directory at start); optimizer-state files are written by the worker, anywhere"),
    "PSKV_RESUME_FROM": ("resume_from", "a checkpoint directory: servers load their shards from it at start, workers' init keeps the saved values (set by pskv launch on a restart)"),
    "PSKV_RESTART_COUNT": ("restart_count", "how many times pskv launch has restarted this job (0: first run)"),
    "PSKV_RECOVERY_TIMEOUT": ("recovery_timeout", "seconds a dead worker's rank stays open for a replacement process (pskv launch --restart-workers); 0: a dead worker fails the job (default 0)"),
    "PSKV_MIN_WORKERS": ("min_workers", "an elastic job's (pskv launch -n MIN:MAX) fewest workers; below it for PSKV_ELASTIC_TIMEOUT the job fails"),
    "PSKV_MAX_WORKERS": ("max_workers", "an elastic job's most workers (a worker's DMLC_WORKER_ID is then its slot); 0: not elastic (default 0)"),
    "PSKV_ELASTIC_TIMEOUT": ("elastic_timeout", "seconds an elastic job may stay below PSKV_MIN_WORKERS before it fails (default 600)"),
    "PSKV_LAUNCH_TOKEN": ("launch_token", "the scheduler's: the token (64 hex digits) the launcher's ROSTER reports of exits and drains must carry"),
    "PSKV_SERVER_RECOVERY": ("server_recovery", "1: a dead server may be replaced by a new process that loads the newest checkpoint; workers keep every push since it to send again (pskv launch --restart-servers; default 0)"),
    "PSKV_SHM": ("shm", "1: workers on a server's host exchange arrays through shared memory; 0: sockets only (default 1)"),
    "PSKV_SHM_ROWS_BYTES": ("shm_rows_bytes", "bytes of the shared-memory buffer each worker has with each server on its host for the rows of row-sparse keys (pushes and row pulls; made when a job creates its first row-sparse key); a message whose rows do not fit goes through the socket; 0: rows through sockets only (default 16777216)"),
    "PSKV_SERVER_MODULES": ("server_modules", "comma-separated modules a server imports at start (they register controllers)"),
    "PSKV_MAX_MESSAGE_BYTES": ("max_message_bytes", "bytes of one received message; a bigger one is discarded unread and logged (default 2147483648)"),
    "PSKV_MAX_FRAMES": ("max_frames", "frames of one received message; a message of more is discarded without building them (default 200002)"),
    "PSKV_SEND_QUEUE_BYTES": ("send_queue_bytes", "bytes of replies queued for one peer that does not read them; more drops the peer (default 268435456)"),
    "PSKV_SLOW_PEER_TIMEOUT": ("slow_peer_timeout", "seconds a peer with queued replies may take none of them before it is dropped (default 30)"),
    "PSKV_TIMELINE": ("timeline", "a directory: each worker and server writes its timeline there, <role>-<rank>.json (Chrome trace-event JSON: push, pull, wait, merge, update spans per key and round; docs/observability.md); empty: off (default)"),
}


def _parse(cls: type[T], table: dict[str, tuple[str, str]], environ: Mapping[str, str] | None,
           overrides: dict[str, Any]) -> T:
    env = os.environ if environ is None else environ
    types = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    read: dict[str, str] = {}  # setting -> the set variable that gave its value (the later of two names wins)
    for var, (name, _doc) in table.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        kind = str(types[name])
        convert: Any = float if "float" in kind else int if "int" in kind else str
        try:
            values[name] = convert(raw)
        except ValueError:
            raise InvalidArgumentError(f"environment variable {var}={raw!r} is not a valid {convert.__name__}") from None
        read[name] = var
    unknown = set(overrides) - set(types)
    if unknown:
        raise InvalidArgumentError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(types)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return replace(cls(), **values)  # type: ignore[type-var, no-any-return]
    except InvalidArgumentError as exc:  # a value out of range: name the variable it came from
        message = str(exc)
        for name, var in read.items():
            if overrides.get(name) is None and message.startswith((f"{name} ", f"{name}:")):
                raise InvalidArgumentError(f"environment variable {var}={env[var]!r}: {message}") from None
        raise


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
        return _parse(cls, ENV_VARS, environ, overrides)


ROLES = ("worker", "server", "scheduler")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # PSKV_LOG_LEVEL's values


@dataclass(frozen=True)
class ClusterConfig:
    """The cluster contract of one process (MXNet / ps-lite compatible).

    Attributes:
        role: ``'worker'``, ``'server'`` or ``'scheduler'``.
        root_uri: the scheduler's host.
        root_port: the scheduler's port (0: unset).
        num_servers: number of servers.
        num_workers: number of workers.
        node_host: address this node binds and advertises ("" = see ``interface``).
        interface: network interface whose address is bound when ``node_host`` is
            unset; with neither, nodes bind 127.0.0.1 in a :attr:`local_job`, else
            this host's address on the route to the scheduler
            (:func:`pskv.transport.addresses.bind_host`).
        rank: the worker rank the launcher assigned, or -1 (assigned at registration).
        server_rank: the server rank the launcher assigned, or -1 (by arrival).
        local_rank: this worker's index among the workers on its host (set by
            ``pskv launch``; selects a device per worker); -1: not set (see
            :meth:`local_rank_of`).
        verbose: 0 quiet, 1 connections, 2 every message.
        heartbeat_interval: seconds between heartbeats (0 disables liveness checks).
        heartbeat_timeout: seconds of silence after which a node counts as dead.
        bigarray_bound: 0: the even placement of values' partitions over the servers
            (:mod:`pskv.partition`); > 0: MXNet's rule, arrays of at least this many
            elements split over all servers, smaller ones whole on one.
        keep_freed_bytes: freed memory a server's or worker's process keeps for reuse
            (:func:`pskv.transport.memory.keep_freed_memory`); 0: malloc's defaults.
        io_threads: ZeroMQ I/O threads of a server's or worker's context; 0: pskv's
            choice (:data:`pskv.transport.reactor.IO_THREADS`).
        part_bytes: most bytes of one part on a server (longer slices are cut into
            pieces, :func:`pskv.partition.split`) and of the values of one socket
            message; big values travel as a pipeline of pieces. 0: no cut. Every worker
            of a job must use the same value. -1 (the default): chosen from the link and
            the model, :attr:`part_size`.
        data_channel: ``"tcp"``: workers send to servers on other hosts over TCP
            connections (:mod:`pskv.transport.stream`; in a job with ``curve_key_file``
            sealed with keys agreed from it, :mod:`pskv.transport.sealed`); ``"zmq"``: over ZeroMQ.
        call_window: between hosts, the most messages of one call of one key a worker keeps
            unanswered per server (:mod:`pskv.worker.pacing`); 0: no limit. -1 (the default):
            4 between hosts, none on one host (:attr:`window`).
        max_table_bytes: bytes of row-sparse keys (their ranges of rows) one server holds at
            most (:mod:`pskv.server.rows`); an init that would pass it is refused.
        startup_timeout: seconds to wait for every node to register.
        request_timeout: seconds a request waits for its reply.
        server_modules: modules a server imports at start (controllers register there).
        stall_report: seconds an open sync round may wait before its server logs which
            workers have not pushed (0 disables).
        shm: 1 lets workers on a server's host use shared memory for array data.
        shm_rows_bytes: bytes of each (worker, server) shared buffer for the rows of
            row-sparse keys on one host (0: rows through sockets only).
        job_id: an id of the job; names the servers' shared-memory directories.
        curve_key_file: a CURVE cluster key file; every socket then authenticates and
            encrypts with it, the data connections too (docs/security.md). Empty: plain TCP.
        checkpoint_dir: where ``kv.save_checkpoint()`` without a path writes ``ckpt-<n>``.
        state_dir: servers write the checkpoints a request names only inside this
            directory or ``checkpoint_dir`` (:mod:`pskv.server.paths`). Empty: the server's
            working directory at start. (Optimizer-state files are the worker's.)
        resume_from: a checkpoint directory the job resumes from (servers load their
            shards at start; workers' ``init`` keeps the saved values). Empty: fresh start.
        restart_count: how many times the launcher has restarted the job.
        server_recovery: 1: a dead server may be replaced (``--restart-servers``): its
            rank stays open for ``recovery_timeout`` seconds, workers keep every push
            since the newest checkpoint to send again, and array data goes through
            sockets (no shared memory).
        recovery_timeout: seconds a dead worker's rank stays open for a replacement
            (``is_recovery``): meanwhile servers keep its sync rounds waiting and
            barriers wait. 0: a dead worker fails the waits that need it at once.
        min_workers, max_workers: an elastic job's bounds (``pskv launch -n MIN:MAX``;
            :mod:`pskv.cluster.elastic`); ``max_workers`` 0: not elastic.
        elastic_timeout: seconds an elastic job may stay below ``min_workers`` before it fails.
        launch_token: the scheduler's: what the launcher's ROSTER reports must carry (hex).
        max_message_bytes: bytes of one received message (:mod:`pskv.transport.bounds`).
        max_frames: frames of one received message.
        send_queue_bytes: bytes of replies queued for one peer that reads none of them.
        slow_peer_timeout: seconds a peer with queued replies may take none before it is dropped.
        log_level: ``PSKV_LOG_LEVEL``, upper case (one of :data:`LOG_LEVELS`); empty: the
            role's default (:mod:`pskv.logs`).
        timeline: a directory where this worker or server writes its timeline
            (:mod:`pskv.timeline`); empty: off.
    """

    role: str = "worker"
    root_uri: str = ""
    root_port: int = 0
    num_servers: int = 0
    num_workers: int = 0
    node_host: str = ""
    interface: str = ""
    rank: int = -1
    server_rank: int = -1
    local_rank: int = -1
    verbose: int = 0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    bigarray_bound: int = 0
    part_bytes: int = -1
    call_window: int = -1
    max_table_bytes: int = 16 << 30
    data_channel: str = "tcp"
    io_threads: int = 0
    keep_freed_bytes: int = 1 << 30
    startup_timeout: float = 60.0
    request_timeout: float = 300.0
    server_modules: str = ""
    stall_report: float = 30.0
    shm: int = 1
    shm_rows_bytes: int = 16 << 20
    job_id: str = ""
    curve_key_file: str = ""
    checkpoint_dir: str = ""
    state_dir: str = ""
    resume_from: str = ""
    restart_count: int = 0
    recovery_timeout: float = 0.0
    server_recovery: int = 0
    min_workers: int = 0
    max_workers: int = 0
    elastic_timeout: float = 600.0
    launch_token: str = field(default="", repr=False)  # a secret: kept out of logs
    max_message_bytes: int = 2 << 30
    max_frames: int = 200_002
    send_queue_bytes: int = 256 << 20
    slow_peer_timeout: float = 30.0
    log_level: str = ""
    timeline: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidArgumentError(f"DMLC_ROLE must be one of {', '.join(ROLES)}, got {self.role!r}")
        for name in ("heartbeat_interval", "heartbeat_timeout", "startup_timeout", "request_timeout",
                     "recovery_timeout", "elastic_timeout"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        _check_elastic(self.min_workers, self.max_workers)
        if self.local_rank < -1:
            raise InvalidArgumentError(f"local_rank must be >= 0 (or -1: not set), got {self.local_rank}")
        if not 0 <= self.io_threads <= 64:
            raise InvalidArgumentError(f"io_threads must be in 0..64 (0: pskv's choice), got {self.io_threads}")
        if self.data_channel not in ("tcp", "zmq"):
            raise InvalidArgumentError(f"data_channel (PSKV_DATA_CHANNEL) must be tcp or zmq, got {self.data_channel!r}")
        for name, least, zero in (("bigarray_bound", 0, "even placement"), ("keep_freed_bytes", 0, "malloc's defaults"),
                                  ("shm_rows_bytes", 0, "rows through sockets"), ("call_window", -1, "no limit"),
                                  ("part_bytes", -1, "no cut")):  # -1: chosen by pskv
            if getattr(self, name) < least:
                raise InvalidArgumentError(f"{name} must be >= 0 (0: {zero}), got {getattr(self, name)}")
        for name in ("max_message_bytes", "max_frames", "send_queue_bytes", "max_table_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.slow_peer_timeout > 0:
            raise InvalidArgumentError(f"slow_peer_timeout must be > 0, got {self.slow_peer_timeout}")
        if self.log_level and self.log_level.upper() not in LOG_LEVELS:
            raise InvalidArgumentError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        object.__setattr__(self, "log_level", self.log_level.upper())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ClusterConfig:
        """Build a ClusterConfig from ``DMLC_*`` / ``PS_*`` / ``PSKV_*`` variables.

        Where ``DMLC_NUM_WORKER``, ``DMLC_PS_ROOT_URI``, ``DMLC_PS_ROOT_PORT`` or (in a
        worker) ``DMLC_WORKER_ID`` is unset, a cluster manager's variables fill it in
        (:func:`rank_env`: torchrun / PyTorchJob, Open MPI, PMI, SLURM): the number of
        workers is its world size, a worker's rank and local rank its own, the
        scheduler's host ``MASTER_ADDR`` (SLURM: the node list's first host) and its port
        the master port + 1 (torch.distributed keeps the master port). ``DMLC_NUM_SERVER``
        is never guessed.

        Raises:
            InvalidArgumentError: a variable holds a value of the wrong type or range, or a
                cluster manager's variables are partial or contradict ``DMLC_NUM_WORKER``.
        """
        env = os.environ if environ is None else environ
        return _parse(cls, CLUSTER_ENV_VARS, env, {**_elastic_beats(env), **_from_manager(env, overrides), **overrides})

    def require_cluster(self) -> None:
        """Check that the variables a distributed store needs are set.

        Raises:
            InvalidArgumentError: naming every missing or invalid variable.
        """
        problems = []
        if not self.root_uri:
            problems.append("DMLC_PS_ROOT_URI (the scheduler's host) is not set")
        if not 0 < self.root_port < 65536:
            problems.append("DMLC_PS_ROOT_PORT (the scheduler's port) is not set or not a port")
        if self.num_servers < 1:
            problems.append("DMLC_NUM_SERVER must be >= 1")
        if self.num_workers < 1:
            problems.append("DMLC_NUM_WORKER must be >= 1")
        if problems:
            raise InvalidArgumentError(
                "a distributed store needs the cluster environment (pskv launch sets it): " + "; ".join(problems)
            )

    @property
    def elastic(self) -> bool:
        """True in an elastic job (``-n MIN:MAX``): workers join and leave at commits."""
        return self.max_workers > 0

    @property
    def uses_shm(self) -> bool:
        """True if co-located workers and servers exchange arrays through shared memory.

        Off with ``server_recovery``: a replacement server's pushes are replayed over sockets.
        """
        return bool(self.shm) and not self.server_recovery

    @cached_property  # read on every call's message cut: computed once
    def part_size(self) -> int:
        """Bytes of one partition and of one socket message's values: ``part_bytes`` if set, else
        4 MiB when every node is on this host (memory is the link: fewer, bigger messages cost
        less CPU) and 1 MiB between hosts (:mod:`pskv.partition` says why)."""
        if self.part_bytes >= 0:
            return self.part_bytes
        return 4 << 20 if self.local_job else 1 << 20

    @cached_property
    def part_pieces(self) -> int:
        """The fewest partitions a slice of a value is cut into (each of at least
        :data:`pskv.partition.MIN_PIECE_BYTES`): 8 between hosts, so one value's exchange is a
        pipeline that keeps both directions of a link busy, and at least 2 per server, so a
        partition's round (a piece from every worker) stays small as the job grows; 1 on one host."""
        return 1 if self.local_job else max(8, 2 * self.num_servers)

    @cached_property
    def window(self) -> int:
        """The most messages of one call of one key a worker keeps unanswered per server
        (:mod:`pskv.worker.pacing`): ``call_window`` if set, else 4 between hosts and 0 (no
        limit) on one host, where the link is memory; 0 in a job resumed from a checkpoint,
        whose servers may run an optimizer."""
        if self.resume_from:
            return 0
        if self.call_window >= 0:
            return self.call_window
        return 0 if self.local_job else 4

    @cached_property  # read on every call's message cut: computed once
    def message_bytes(self) -> int:
        """The most value bytes one socket message of a call carries (a bigger partition alone):
        :attr:`part_size` on one host; between hosts one partition's share, ``part_size //
        part_pieces``, so each piece of a slice is a message of its own and is answered as
        soon as its round completes, while small values still share messages."""
        return self.part_size // self.part_pieces

    @property
    def local_job(self) -> bool:
        """True if the scheduler is on loopback (``DMLC_PS_ROOT_URI`` ``127.x.y.z``, ``::1`` or
        ``localhost``): every node of the job runs on this host."""
        if self.root_uri == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.root_uri).is_loopback
        except ValueError:  # a host name other than localhost
            return False

    def local_rank_of(self, rank: int) -> int:
        """The local rank of worker ``rank``: as set (``PSKV_LOCAL_RANK``, ``BYTEPS_LOCAL_RANK``, or the
        cluster manager's when ``DMLC_WORKER_ID`` is unset), else ``rank`` in a :attr:`local_job` (every
        worker is on this host), else 0 (one worker per host, as in an MXJob pod)."""
        if self.local_rank >= 0:
            return self.local_rank
        return rank if self.local_job else 0

    @property
    def scheduler_address(self) -> str:
        """The scheduler's ZeroMQ endpoint."""
        return f"tcp://{self.root_uri}:{self.root_port}"


def _elastic_beats(env: Mapping[str, str]) -> dict[str, float]:
    """An elastic job's heartbeats where the environment sets none: every 0.5 s, dead after 3 s (a worker that
    hangs stalls the others that long; one that exits is reported by the launcher at once)."""
    if (env.get("PSKV_MAX_WORKERS") or "0").strip() in ("", "0"):
        return {}
    beats = {"heartbeat_interval": 0.5, "heartbeat_timeout": 3.0}
    return {name: value for name, value in beats.items() if env.get(f"PS_{name.upper()}") is None}


def _check_elastic(min_workers: int, max_workers: int) -> None:
    """An elastic job's bounds: ``1 <= MIN <= MAX``, or both 0 (not elastic)."""
    if (min_workers, max_workers) != (0, 0) and not 1 <= min_workers <= max_workers:
        raise InvalidArgumentError(f"min_workers and max_workers must be 1 <= MIN <= MAX (or both 0: not elastic), "
                                   f"got {min_workers}:{max_workers}")


def log_level_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``PSKV_LOG_LEVEL`` alone, checked and upper-cased (``''`` when unset): what ``pskv launch`` passes on.

    Raises:
        InvalidArgumentError: a value other than DEBUG, INFO, WARNING or ERROR (naming the variable).
    """
    only = {"PSKV_LOG_LEVEL": CLUSTER_ENV_VARS["PSKV_LOG_LEVEL"]}
    return _parse(ClusterConfig, only, environ, {}).log_level


# -- the rank of a process started by a cluster manager -----------------------------------

def _from_manager(env: Mapping[str, str], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """ClusterConfig settings a cluster manager gives where the ``DMLC_*`` variables are unset."""
    role = overrides.get("role") or env.get("DMLC_ROLE") or "worker"
    unset = {var for var in ("DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_WORKER_ID")
             if not given(env, var)}
    if role != "worker":
        unset.discard("DMLC_WORKER_ID")
    if not unset:
        return {}
    found = rank_env(env)
    if found is None:
        return {}
    out: dict[str, Any] = {}
    if "DMLC_NUM_WORKER" in unset:
        out["num_workers"] = found.world_size
    if "DMLC_WORKER_ID" in unset:
        if given(env, "DMLC_NUM_WORKER") and env_int(env, "DMLC_NUM_WORKER") != found.world_size:
            raise InvalidArgumentError(f"environment variable DMLC_NUM_WORKER={env['DMLC_NUM_WORKER']!r} contradicts "
                                       f"the {found.source} job's {found.world_size} processes, whose rank this worker "
                                       "would take (set DMLC_WORKER_ID, or unset DMLC_NUM_WORKER)")
        out["rank"] = found.rank
        if not given(env, "PSKV_LOCAL_RANK") and not given(env, "BYTEPS_LOCAL_RANK"):
            out["local_rank"] = found.local_rank
    if "DMLC_PS_ROOT_URI" in unset and found.master_addr:
        out["root_uri"] = found.master_addr
    if "DMLC_PS_ROOT_PORT" in unset and found.master_port:
        out["root_port"] = found.master_port + 1 if found.master_port < 65535 else found.master_port - 1
    return {name: value for name, value in out.items() if overrides.get(name) is None}


# variable -> (source, meaning), in the order rank_env() looks. docs/env.md mirrors this table.
RANK_ENV_VARS: dict[str, tuple[str, str]] = {
    "RANK": ("torchrun", "torchrun / PyTorchJob: this process's rank, 0..WORLD_SIZE-1 (pskv launch sets it for workers)"),
    "WORLD_SIZE": ("torchrun", "torchrun / PyTorchJob: number of processes (pskv launch: workers)"),
    "LOCAL_RANK": ("torchrun", "torchrun: this process's index on its host (default 0)"),
    "LOCAL_WORLD_SIZE": ("torchrun", "torchrun: processes on this host (needed with LOCAL_RANK; default 1)"),
    "MASTER_ADDR": ("torchrun", "torch.distributed's rendezvous host (pskv launch: the first worker's host); also the scheduler's host when DMLC_PS_ROOT_URI is unset"),
    "MASTER_PORT": ("torchrun", "torch.distributed's rendezvous port (pskv launch: a free port, not the scheduler's); the scheduler's port is MASTER_PORT+1 when DMLC_PS_ROOT_PORT is unset"),
    "OMPI_COMM_WORLD_RANK": ("mpi", "Open MPI (mpirun): this process's rank"),
    "OMPI_COMM_WORLD_SIZE": ("mpi", "Open MPI: number of processes"),
    "OMPI_COMM_WORLD_LOCAL_RANK": ("mpi", "Open MPI: this process's index on its host"),
    "OMPI_COMM_WORLD_LOCAL_SIZE": ("mpi", "Open MPI: processes on this host"),
    "PMI_RANK": ("pmi", "MPICH / Intel MPI (PMI): this process's rank"),
    "PMI_SIZE": ("pmi", "MPICH / Intel MPI: number of processes"),
    "MPI_LOCALRANKID": ("pmi", "MPICH / Intel MPI (Hydra): this process's index on its host (default 0)"),
    "MPI_LOCALNRANKS": ("pmi", "MPICH / Intel MPI (Hydra): processes on this host (default 1)"),
    "SLURM_PROCID": ("slurm", "SLURM (srun): this task's rank"),
    "SLURM_NTASKS": ("slurm", "SLURM: number of tasks"),
    "SLURM_LOCALID": ("slurm", "SLURM: this task's index on its node"),
    "SLURM_NTASKS_PER_NODE": ("slurm", "SLURM: tasks per node, when the allocation asked for a fixed number"),
    "SLURM_TASKS_PER_NODE": ("slurm", "SLURM: tasks of each node, compressed ('2(x3),1'); this node's entry is the one at SLURM_NODEID"),
    "SLURM_NODEID": ("slurm", "SLURM: this node's index in the allocation (default 0)"),
    "SLURM_JOB_NODELIST": ("slurm", "SLURM: the allocation's hosts, compressed ('node[01-03,07],gpu5'); the first is the master host"),
    "SLURM_NODELIST": ("slurm", "SLURM: the older name of SLURM_JOB_NODELIST"),
    "SLURM_JOB_ID": ("slurm", "SLURM: the job's id; without MASTER_PORT the master port is 15000 + its last 4 digits (as PyTorch Lightning)"),
    "SLURM_STEP_ID": ("slurm", "SLURM (srun): the step's id; the master port moves by 7919 per step (modulo 10000), so concurrent steps meet apart"),
    "SLURM_STEP_NODELIST": ("slurm", "SLURM (srun): the step's hosts, compressed; the first is the master host (before SLURM_JOB_NODELIST's)"),
    "SLURM_STEP_TASKS_PER_NODE": ("slurm", "SLURM (srun): the step's tasks of each node; this node's entry (at SLURM_NODEID) wins over an inherited SLURM_NTASKS_PER_NODE"),
}

# variables the launcher itself looks at (pskv launch); docs/env.md mirrors this table.
LAUNCHER_ENV_VARS: dict[str, tuple[str, str]] = {
    "OMP_NUM_THREADS": ("pskv launch", "OpenMP threads per process: when it is set (or an --env pair sets it), pskv launch leaves it; else each worker gets max(1, CPUs of its host // workers there), as torchrun does"),
}


# variables pskv.torch reads (through torch_store_name); docs/env.md mirrors this table.
TORCH_ENV_VARS: dict[str, tuple[str, str]] = {
    "PSKV_TORCH_STORE": ("pskv.torch", "the store type pskv.torch.init() opens when given none (dist_sync, byteps, horovod, nccl, ...); default: dist_sync in a worker of a job with servers, else horovod"),
}


def torch_store_name(environ: Mapping[str, str] | None = None) -> str:
    """``PSKV_TORCH_STORE``, stripped (``''`` when unset): the store type :func:`pskv.torch.init` opens
    when given none. The name is checked where it is used (``StoreType.parse``)."""
    env = os.environ if environ is None else environ
    return env.get("PSKV_TORCH_STORE", "").strip()


def omp_num_threads_set(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``OMP_NUM_THREADS`` is set here (``pskv launch`` then leaves it to the workers)."""
    env = os.environ if environ is None else environ
    return env.get("OMP_NUM_THREADS", "") != ""


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """This process's rank as ``pskv launch`` or a cluster manager set it; None if none did.

    :func:`pskv.ranks.rank_of` of this process's environment (or ``environ``): the sources,
    their order and the checks are described there; :data:`RANK_ENV_VARS` lists every
    variable read.

    Raises:
        InvalidArgumentError: a source's variables are partial (a rank without a size),
            not integers, out of range, or contradict each other; the message names the
            variable and its value.
    """
    return rank_of(os.environ if environ is None else environ)


def slurm_allocation(environ: Mapping[str, str] | None = None) -> list[tuple[str, int]]:
    """The hosts of the SLURM allocation this process runs in, with their task counts
    (:func:`pskv.ranks.allocation` of this process's environment); ``[]`` outside one.

    Raises:
        InvalidArgumentError: malformed lists, or lists of different lengths (naming both).
    """
    return allocation(os.environ if environ is None else environ)
