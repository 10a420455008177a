"""``TorchGroup``: the job's ranks as one torch.distributed process group, owned by a store.

The ``horovod`` and ``nccl`` stores (:mod:`pskv.kvstore.horovod`) run their collectives
here. The group is the store's own (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on a
``PrefixStore``), not torch's default group: a script may also call
``torch.distributed.init_process_group`` for its own use, and may create several stores.

Rendezvous: the rank's ``MASTER_ADDR:MASTER_PORT`` holds a ``TCPStore``. Rank 0 opens it,
unless something answers there already (torchrun's agent holds its own store there and
its workers join it, ``TORCHELASTIC_USE_AGENT_STORE``): then rank 0 joins it as a client
like everyone else. A store rank 0 opened stays open for the process's life, and later
groups of the process (a store closed and made again) meet there, under a prefix of their own. One
process without rank variables gets a group of one on a store bound to port 0 of
127.0.0.1.

Collectives fail together (pskv's rule): before its data moves, every call is described
(operation, keys, shapes, dtypes, root) and the ranks' descriptions are compared in one
small all-gather; if they differ, every rank raises :class:`~pskv.errors.CollectiveMismatchError`
naming each rank's call — never a sum of different things or a hang. A collective that
fails (a peer closed its connection, or nothing came within the timeout) is followed by a
roll call on the rendezvous store: the ranks that do not answer within
:data:`ROLL_CALL_SECONDS` (a quarter of the timeout at most) are named in :class:`~pskv.errors.NodeFailedError` (``node``:
``'rank 1'``). After a failure the group is unusable; every later call raises the same error.
A rank whose own peers are alive (rank 3 of 4 when rank 1 died: its ring neighbours are 0
and 2) would wait in the collective past the roll call and be named with the dead: so a
rank that fails calls the roll by a key of the store, and a rank waiting longer than
:data:`ALARM_SLICE` looks for that key between slices of its wait and comes too. Rank 0,
which holds the store, stays at the roll call until every rank that answered has read it,
so none of them finds the store gone and blames rank 0.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
import time
from dataclasses import dataclass
from typing import Any

from pskv.errors import CollectiveMismatchError, NodeFailedError, NotSupportedError, OperationTimeoutError

__all__ = ["ALARM_SLICE", "GroupSpec", "TorchGroup", "ROLL_CALL_SECONDS", "load_torch"]

#: Seconds the survivors of a failed collective wait for each other at the roll call (at most a quarter
#: of the timeout): a dead rank never answers, so a failure report takes this long.
ROLL_CALL_SECONDS = 5.0
#: Seconds a collective waits before it first looks (and then between looks) whether another rank called the roll
#: for it: a collective that ends sooner costs no look at the store.
ALARM_SLICE = 0.5
_DESCRIPTION_BYTES = 512  # a call's description in a mismatch report (longer ones are cut)
_GROUPS_MADE: dict[str, int] = {}  # per rendezvous address: groups this process made (the store prefix)
# per rendezvous address: the TCPStore rank 0 opened there, kept for the process's life. A store closed
# and made again (hvd.shutdown(); hvd.init()) meets at the same one: were the first store's TCPStore
# freed with its group, the others could join it just before it went and lose their rendezvous.
_OPENED: dict[str, Any] = {}


@dataclass(frozen=True)
class GroupSpec:
    """Where and how a group meets.

    Attributes:
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of processes.
        master_addr: host of the rendezvous store (None: a group of one on a private store).
        master_port: its port.
        backend: ``'gloo'`` (CPU tensors) or ``'nccl'`` (CUDA tensors).
        timeout: seconds any collective (and the rendezvous) may take.
        device: where the backend's tensors live (``'cpu'`` or ``'cuda:<n>'``).
    """

    rank: int
    world_size: int
    master_addr: str | None
    master_port: int
    backend: str
    timeout: float
    device: str = "cpu"


def load_torch() -> Any:
    """``torch``, with torch.distributed.

    Raises:
        NotSupportedError: PyTorch is not installed, or has no torch.distributed.
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise NotSupportedError("the horovod and nccl stores run on torch.distributed: pip install 'pskv[torch]'") \
            from None
    if not dist.is_available():
        raise NotSupportedError("this PyTorch build has no torch.distributed (the horovod and nccl stores need it)")
    return torch


class TorchGroup:
    """The job's ranks as one process group.

    Raises (constructor):
        NotSupportedError: no PyTorch / torch.distributed, or the backend is missing.
        NodeFailedError: the rendezvous did not complete within the timeout (naming the address).
    """

    def __init__(self, spec: GroupSpec) -> None:
        self._torch = torch = load_torch()
        dist = torch.distributed
        self.spec = spec
        self._seq = 0  # collectives started so far (the same on every rank)
        self._call = ""  # the current call's name, e.g. 'pushpull#3' (set by agree)
        self._failure: BaseException | None = None
        delta = datetime.timedelta(seconds=spec.timeout)
        if spec.backend == "gloo" and not dist.is_gloo_available():
            raise NotSupportedError("this PyTorch build has no Gloo backend (torch.distributed.is_gloo_available())")
        self._store, where = self._rendezvous(dist, delta)
        made = _GROUPS_MADE.get(where, 0)
        _GROUPS_MADE[where] = made + 1
        prefix = f"pskv/group-{made}/"
        self._calls = dist.PrefixStore(prefix + "rollcall/", self._store)
        self._where = where
        try:
            pg_store = dist.PrefixStore(prefix + "pg/", self._store)
            if spec.backend == "nccl":
                if not dist.is_nccl_available():
                    raise NotSupportedError("this PyTorch build has no NCCL backend (CUDA tensors need it)")
                torch.cuda.set_device(torch.device(spec.device))
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = delta  # the watchdog ends a collective stuck longer than this
                self._pg = dist.ProcessGroupNCCL(pg_store, spec.rank, spec.world_size, options)
            else:
                self._pg = dist.ProcessGroupGloo(pg_store, spec.rank, spec.world_size, delta)
        except RuntimeError as exc:
            raise NodeFailedError(f"the rendezvous at {where}",
                                  f"rank {spec.rank} of {spec.world_size} could not form the {spec.backend} group "
                                  f"within {spec.timeout:g} s: {_first_line(exc)}") from None

    def _rendezvous(self, dist: Any, delta: datetime.timedelta) -> tuple[Any, str]:
        """The TCPStore every rank meets at, and its address."""
        spec = self.spec
        if spec.master_addr is None:
            store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=delta, wait_for_workers=False)
            return store, f"127.0.0.1:{store.port}"
        where = f"{spec.master_addr}:{spec.master_port}"
        if spec.rank == 0 and where in _OPENED:
            return _OPENED[where], where
        if spec.rank == 0 and not _listening(spec.master_addr, spec.master_port):
            try:
                opened = _OPENED[where] = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size,
                                                        is_master=True, timeout=delta, wait_for_workers=False)
                return opened, where
            except RuntimeError as exc:
                if "EADDRINUSE" not in str(exc) and "address already in use" not in str(exc).lower():
                    raise NodeFailedError(f"the rendezvous at {where}",
                                          f"rank 0 cannot open the store: {_first_line(exc)}") from None
        try:  # every other rank; rank 0 too when torchrun's agent holds the store
            return dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size, is_master=False,
                                 timeout=delta), where
        except RuntimeError as exc:
            raise NodeFailedError(f"the rendezvous at {where}",
                                  f"rank {spec.rank} found no store there within {spec.timeout:g} s: "
                                  f"{_first_line(exc)}") from None

    @property
    def failed(self) -> BaseException | None:
        """The error that broke the group, or None."""
        return self._failure

    # -- collectives ---------------------------------------------------------------------
    def agree(self, description: str, timeout: float | None = None) -> None:
        """Every rank made the same call (``description``), or every rank raises.

        Raises:
            CollectiveMismatchError: the ranks' descriptions differ (each rank's is named).
            NodeFailedError, OperationTimeoutError: see :meth:`_run`.
        """
        torch = self._torch
        self._seq += 1
        name = self._call = f"{description.split(' ', 1)[0]}#{self._seq}"
        digest = int.from_bytes(hashlib.blake2b(description.encode(), digest_size=8).digest(), "little", signed=True)
        mine = torch.tensor([digest], dtype=torch.int64, device=self.spec.device)
        every = [torch.zeros_like(mine) for _ in range(self.spec.world_size)]
        self._run(name, lambda: self._pg.allgather([every], [mine]), timeout)
        if all(int(t.item()) == digest for t in every):
            return
        raw = description.encode()[:_DESCRIPTION_BYTES]
        text = torch.zeros(_DESCRIPTION_BYTES, dtype=torch.uint8, device=self.spec.device)
        text[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        texts = [torch.zeros_like(text) for _ in range(self.spec.world_size)]
        self._run(name, lambda: self._pg.allgather([texts], [text]), timeout)
        said = [bytes(t.cpu().numpy().tobytes()).rstrip(b"\0").decode(errors="replace") for t in texts]
        raise CollectiveMismatchError(f"{name}: the ranks made different calls: "
                                      + "; ".join(f"rank {r}: {s}" for r, s in enumerate(said)))

    def allreduce(self, what: str, tensor: Any, timeout: float | None = None) -> None:
        """Sum ``tensor`` (contiguous, on the group's device) over every rank, in place (``what``: its keys)."""
        self._run(f"{self._call} ({what})", lambda: self._pg.allreduce([tensor]), timeout)

    def broadcast(self, what: str, tensor: Any, root: int, timeout: float | None = None) -> None:
        """Rank ``root``'s ``tensor`` into every rank's ``tensor``, in place (``what``: its keys)."""
        opts = self._torch.distributed.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self._run(f"{self._call} ({what})", lambda: self._pg.broadcast([tensor], opts), timeout)

    def _run(self, name: str, start: Any, timeout: float | None) -> None:
        """Start a collective and wait for it (``timeout``: at most the group's).

        Raises:
            NodeFailedError: it failed and the roll call names the ranks that did not answer
                (or the rendezvous store is gone); the group is unusable afterwards.
            OperationTimeoutError: it did not finish in time although every rank answered
                the roll call (a rank is in another, slower call).
        """
        if self._failure is not None:
            raise self._failure
        limit = self.spec.timeout if timeout is None else min(timeout, self.spec.timeout)
        began = time.monotonic()
        try:
            work = start()
            if self.spec.backend == "nccl":
                work.wait(datetime.timedelta(seconds=limit))
                self._torch.cuda.current_stream().synchronize()
            else:
                self._wait(work, name, began + limit)
        except RuntimeError as exc:
            self._failure = self._diagnose(name, exc, time.monotonic() - began)
            raise self._failure from None

    def _wait(self, work: Any, name: str, end: float) -> None:
        """Wait for a Gloo collective until ``end``, in slices: between them, whether another rank called the roll.

        Raises:
            RuntimeError: it failed, timed out, or a peer that saw it fail called the roll.
        """
        while True:
            try:
                work.wait(datetime.timedelta(seconds=max(0.001, min(ALARM_SLICE, end - time.monotonic()))))
                return
            except RuntimeError as exc:
                if time.monotonic() >= end or "timed out" not in str(exc).lower() or work.is_completed():
                    raise
            try:
                called = self._calls.check([f"{name}/alarm"])
            except RuntimeError as exc:
                raise RuntimeError(f"the rendezvous store is unreachable: {_first_line(exc)}") from None
            if called:
                raise RuntimeError("another rank saw this collective fail and called the roll")

    def _diagnose(self, name: str, exc: BaseException, waited: float) -> BaseException:
        """Who failed: the ranks missing at this collective's roll call."""
        spec = self.spec
        detail = _first_line(exc)
        missing = self._roll_call(name)
        if missing is None:
            return NodeFailedError("rank 0" if spec.master_addr is not None else "the group",
                                   f"{name} failed on rank {spec.rank} and the rendezvous store at {self._where} "
                                   f"is gone (rank 0 or the launcher holding it died): {detail}")
        if missing:
            who = ", ".join(f"rank {r}" for r in missing)
            return NodeFailedError(who, f"{name} failed on rank {spec.rank} after {waited:.1f} s and {who} did not "
                                        f"answer the roll call (dead or stuck): {detail}")
        return OperationTimeoutError(f"{name} failed on rank {spec.rank} after {waited:.1f} s although every rank "
                                     f"is alive (a rank is in another call?): {detail}")

    def _roll_call(self, name: str) -> list[int] | None:
        """Ranks that did not come to this collective's roll call; None if the store is unreachable."""
        spec = self.spec
        try:
            self._calls.set(f"{name}/alarm", b"1")  # the ranks still waiting in the collective come too
            self._calls.set(f"{name}/{spec.rank}", b"1")
            keys = {r: f"{name}/{r}" for r in range(spec.world_size) if r != spec.rank}
            deadline = time.monotonic() + min(ROLL_CALL_SECONDS, spec.timeout / 4)
            keys = self._absent(keys, deadline)
            self._calls.set(f"{name}/read/{spec.rank}", b"1")
            if spec.rank == 0:  # the store's holder: the others' last reads must find it
                answered = {r: f"{name}/read/{r}" for r in range(1, spec.world_size) if r not in keys}
                self._absent(answered, time.monotonic() + min(ROLL_CALL_SECONDS, spec.timeout / 4))
            return sorted(keys)
        except RuntimeError:
            return None

    def _absent(self, keys: dict[int, str], deadline: float) -> dict[int, str]:
        """The ranks of ``keys`` whose key is still not in the store at ``deadline`` (or sooner, once all are)."""
        while keys and time.monotonic() < deadline:
            keys = {r: k for r, k in keys.items() if not self._calls.check([k])}
            if keys:
                time.sleep(0.05)  # polled until the deadline: the peers' answers are store keys
        return keys

    def close(self) -> None:
        """Release the group (its connections); idempotent."""
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None and hasattr(pg, "shutdown"):
            try:
                pg.shutdown()
            except RuntimeError:  # a broken group: its connections are gone already
                pass


def _listening(host: str, port: int) -> bool:
    """Something accepts connections at ``host:port`` already (torchrun's agent store): join it, don't open one."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
