"""Sparse gradients of :class:`~pskv.torch.DistributedOptimizer`: rows travel, not whole tables.

``nn.Embedding(sparse=True)`` leaves a sparse COO gradient holding the rows a batch
touched. Unless ``sparse_as_dense=True`` (Horovod's argument: then they travel dense in
their buckets, :mod:`pskv.torch.buckets`), :class:`SparseGradients` takes the buckets'
place in the optimizer and sends such a parameter's gradient as rows: each rank sends the
rows it touched, and gets back the sum (``op=Average``: the average, with the
predivide factor's scaling) as a coalesced sparse COO tensor holding the **union of the
rows any rank touched** (a row whose sum is zero included), so ``torch.optim.SGD``,
``SparseAdam`` and the others step on it unchanged. Two mechanisms, one per kind of store:

* **a store with servers** (``dist_sync``, ``dist_sync_device``): one row-sparse key per
  parameter (pskv's row-sparse path, :mod:`pskv.kvstore.dist_rows`), declared
  ``summed`` (a round stores the sum of the rows pushed even when the servers run an
  optimizer): ``push`` of this rank's rows, then ``pull`` of the key's present rows — the
  round's union. Each server gets and sends only the rows of its range.
* **the all-reduce stores** (``horovod``, ``nccl``; and ``byteps``, whose servers only
  sum) have no row-sparse keys: the rows are gathered, as Horovod's ``sparse_allreduce``
  gathers indices and values — a sum of the counts, then one sum of buffers in which
  each rank fills only its own segment (exact: ``x + 0 == x``), summed by row on every
  rank alike. The buffers' length is rounded up to a power of two (few keys per name
  where keys are kept).

Which parameters have sparse gradients is decided **before anything of the first step
travels**, so the first step's rows travel as rows too (a big table's dense gradient
would be a huge message): where the module is known (``DistributedDataParallel``), by
torch DDP's rule — the weights of ``nn.Embedding`` / ``nn.EmbeddingBag`` with
``sparse=True`` (:func:`sparse_parameters`), the same on every rank, no collective; for an
optimizer, which sees only parameters, at the first step's first gradient hook (or its
``synchronize()`` on a rank without any): one small sum tells every rank which parameters
have a sparse gradient on any rank — already there, or of such a module whose forward
ran since the wrapper was made (global forward hooks note them, removed once a forward that
used the parameters ends, or the sum is made). Those travel as rows (sent at ``synchronize()``, in a fixed order, after the
buckets: an embedding's gradient is the last one backward makes anyway) and the other
parameters are cut into buckets without them, before any is sent (through the servers'
row-sparse keys the buckets' keys are declared then, not when the optimizer is wrapped: a
table whose rows travel gets no dense key on the servers). A
sparse gradient no rank foresaw (``F.embedding(..., sparse=True)`` without a module)
travels dense in the first step; one more sum after it moves it to rows from the second
step on. A gradient missing on a rank is no rows there (Horovod's rule: another rank may
have made it); a dense one for such a parameter is sent as its non-zero rows.
``Compression`` does not apply to rows (nor in Horovod). Ranks agree on failure: a
gradient whose row ids are out of range is refused on its rank and fails the exchange of
every other rank (``CollectiveFailedError``) for that step; the next step works as
before. bfloat16 parameters keep travelling dense on a store with servers (its row-sparse
keys do not hold bfloat16).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Sequence
from typing import Any

import torch

from pskv.arrays.rowsparse import coo_parts
from pskv.errors import CollectiveFailedError, InvalidArgumentError, RemoteError
from pskv.torch import ops, runtime
from pskv.torch.buckets import GradientBuckets, Reduction

__all__ = ["SparseGradients", "gradient_buckets", "sparse_parameters"]

Named = Sequence[tuple[str, torch.Tensor]]


def gradient_buckets(named: Named, prefix: str, reduction: Reduction, sparse_as_dense: bool,
                     sparse: set[torch.Tensor] | None = None, **cut: Any) -> GradientBuckets | SparseGradients:
    """The buckets of ``named``: plain ones (every gradient dense) with ``sparse_as_dense``, on a job of one
    process, without parameters, or none of them in ``sparse``; else :class:`SparseGradients` over them
    (``sparse``: the parameters known to have sparse gradients, e.g. :func:`sparse_parameters`; None:
    decided at the first step). ``cut``: ``GradientBuckets``' bucket sizes."""
    known_dense = sparse is not None and not any(p in sparse for _, p in named)
    if sparse_as_dense or not named or runtime.size() == 1 or known_dense:
        return GradientBuckets(named, prefix, reduction, **cut)
    return SparseGradients(named, prefix, reduction, sparse, **cut)


def sparse_parameters(module: torch.nn.Module) -> set[torch.Tensor]:
    """The parameters of ``module`` whose gradients are sparse: the weights of its ``nn.Embedding`` and
    ``nn.EmbeddingBag`` with ``sparse=True`` (torch DDP's rule, ``expect_sparse_gradient``)."""
    return {w for w in map(_sparse_weight, module.modules()) if w is not None}


def _sparse_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The weight of an ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True``; else None."""
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
        return module.weight
    return None


def _has_rows(grad: torch.Tensor | None) -> bool:
    return grad is not None and grad.is_sparse and grad.sparse_dim() == 1


class _SparseForwards:
    """The parameters of ``params`` that a forward of a module making sparse gradients used, until the first
    outermost forward that used any of ``params`` ends, or :meth:`close` (global forward hooks, removed then:
    later forwards of any module pay nothing, even when the first step never comes, e.g. a wrapper that
    ``CrossBarrier`` took the optimizer from)."""

    def __init__(self, params: Collection[torch.Tensor]) -> None:
        self._params = set(params)
        self.found: set[torch.Tensor] = set()
        self._depth = 0  # module forwards under way (nested)
        self._used = False  # a module with one of params ran forward
        self._hooks = [torch.nn.modules.module.register_module_forward_pre_hook(self._enter),
                       torch.nn.modules.module.register_module_forward_hook(self._leave)]

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        self._depth += 1
        weight = _sparse_weight(module)
        if weight is not None and weight in self._params:
            self.found.add(weight)
        self._used = self._used or any(p in self._params for p in module.parameters(recurse=False))

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth <= 0 and self._used:
            self.close()

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


class SparseGradients:
    """:class:`~pskv.torch.buckets.GradientBuckets` of the dense gradients, and the rows of the sparse ones.

    The same calls as ``GradientBuckets`` (the optimizer and DDP do not tell them apart): ``ready``
    marks a parameter, ``launch_all`` sends the buckets left, ``wait`` waits for them and
    exchanges the rows. Without ``sparse`` the first ``ready`` (or ``launch_all``) agrees on which
    parameters travel as rows, and the first ``wait`` learns of any sparse gradient no rank foresaw.
    """

    def __init__(self, named: Named, prefix: str, reduction: Reduction,
                 sparse: set[torch.Tensor] | None = None, **cut: Any) -> None:
        self._named = list(named)
        self._prefix = prefix
        self._reduction = reduction
        self._cut = cut
        self.rows: dict[torch.Tensor, str] = {}  # parameter -> name, of those whose rows travel
        self._marked: set[torch.Tensor] = set()
        self._seen: list[int] | None = None  # this rank's sparse gradients at the first step (1 each)
        job = runtime.current()
        self._exchange = ServerRows(job, prefix) if job.servers and not job.kind.summation_only \
            else GatheredRows(prefix)
        self._forwards: _SparseForwards | None = None
        self._defer = sparse is None and isinstance(self._exchange, ServerRows)  # declare() waits for _agree()
        if sparse is None:  # decided at the first step (_agree), learnt again after it (_learn)
            self._learnt = False
            self._forwards = _SparseForwards([p for _, p in self._named])
            weakref.finalize(self, self._forwards.close)  # a wrapper dropped before its first step leaves no hook
            self.dense = GradientBuckets(self._named, prefix, reduction, **cut)
        else:  # known (the module's): rows from the first step, the same on every rank
            self._learnt = True
            self.rows = {p: name for name, p in self._named if p in sparse and self._exchange.takes(p)}
            self.dense = GradientBuckets([(n, p) for n, p in self._named if p not in self.rows], prefix, reduction,
                                         **cut)

    def __contains__(self, param: torch.Tensor) -> bool:
        return param in self.dense or param in self.rows

    @property
    def names(self) -> list[str]:
        """The dense buckets' collective names, in sending order."""
        return self.dense.names

    @property
    def sent(self) -> int:
        """How many dense buckets were sent since the last :meth:`wait`."""
        return self.dense.sent

    @property
    def pending(self) -> bool:
        """Whether a parameter was marked ready or a bucket sent since the last :meth:`wait`."""
        return self.dense.pending or bool(self._marked)

    def _layout_name(self) -> str:
        return f"{self._prefix}:sparse-layout"

    def declare(self, extra: Sequence[tuple[str, Sequence[torch.Tensor]]] = ()) -> None:
        """Declare the buckets' and the rows' keys, in one meeting each (collectives). Before the first step's
        layout is agreed, where rows go to the servers, only ``extra``'s: the others once it is (:meth:`_agree`),
        so that a table whose rows travel gets no dense key (rank 0's zeros sent whole) there. (Elsewhere
        declaring costs no meeting, and checks the compression when the wrapper is made.)"""
        if self._defer and self._forwards is not None:
            if extra:
                ops.declare_groups(list(extra))
            return
        self.dense.declare(extra)
        if self.rows:
            self._exchange.declare([(name, p) for p, name in self.rows.items()])

    def ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this step: its bucket may go (its rows go at :meth:`wait`)."""
        if self._forwards is not None:
            self._agree()
        if param in self.rows:
            self._marked.add(param)
        else:
            self.dense.ready(param)

    def launch_all(self) -> list[torch.Tensor]:
        """Send every bucket not sent yet (see ``GradientBuckets.launch_all``); the parameters whose missing
        gradient became zeros, and those of the rows without a gradient. At the first step, note first which
        gradients are sparse."""
        if self._forwards is not None:
            self._agree()
        if not self._learnt:
            self._seen = [int(_has_rows(p.grad)) for _, p in self._named]
        return [*self.dense.launch_all(), *(p for p in self.rows if p.grad is None)]

    def wait(self) -> None:
        """Wait for the buckets, exchange the rows, write the results into the gradients; the first error
        raised once both are done (each fails on every rank alike)."""
        error: Exception | None = None
        try:
            self.dense.wait()
        except Exception as exc:  # raised once the rows are exchanged too: every rank makes the same calls
            error = exc
        try:
            if self.rows:
                self._exchange.reduce(list(self.rows.items()), self._reduction)
        except Exception as exc:
            error = error or exc
        finally:
            self._marked.clear()
        if error is not None:
            raise error
        if not self._learnt and self._seen is not None:
            self._learnt = True
            self._learn(self._seen, f"{self._prefix}:dense")

    def reset(self) -> None:
        """Forget this step's marks (after :meth:`wait`, or a state reload)."""
        self.dense.reset()
        self._marked.clear()
        self._seen = None

    def _agree(self) -> None:
        """Before anything of the first step is sent: the parameters with a sparse gradient on some rank, or of
        a module making them whose forward ran, travel as rows from now on (a sum, then declaring keys)."""
        assert self._forwards is not None
        self._forwards.close()
        found, self._forwards = self._forwards.found, None
        seen = [int(p in found or _has_rows(p.grad)) for _, p in self._named]
        if not self._learn(seen, self._prefix if self._defer else f"{self._prefix}:rows") and self._defer:
            self.dense.declare()  # the buckets cut when the wrapper was made

    def _learn(self, seen: list[int], prefix: str) -> bool:
        """Every rank's ``seen`` summed: the parameters sparse on some rank and not rows yet travel as rows from
        now on, and the others get new buckets named ``prefix...``; whether there were such. Collectives: a
        sum, then (if any is new) declaring the new keys."""
        counts = torch.tensor(seen, dtype=torch.int64)
        ops.allreduce_(counts, name=self._layout_name(), op=ops.Sum)
        new = [(name, p) for (name, p), n in zip(self._named, counts.tolist())
               if n and p not in self.rows and self._exchange.takes(p)]
        if not new:
            return False
        self.rows.update({p: name for name, p in new})
        self.dense = GradientBuckets([(n, p) for n, p in self._named if p not in self.rows], prefix,
                                     self._reduction, **self._cut)
        self.dense.declare()
        self._exchange.declare(new)
        return True


def _scales(reduction: Reduction) -> tuple[float, float]:
    """What the rows are multiplied by before the sum and after it (``op=Average``: divided by the size)."""
    after = reduction.postscale_factor
    if reduction.op == ops.Average:
        after /= runtime.size()
    return reduction.prescale_factor, after


def _rows_of(param: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, rows)`` of ``param``'s gradient: sorted unique int64 ids (on the gradient's device) and their
    rows summed; no rows for a missing gradient, the non-zero rows of a dense one.

    Raises:
        InvalidArgumentError: ids out of range (or more than one sparse dimension), naming the parameter.
    """
    grad = param.grad
    if grad is None:
        return (torch.zeros(0, dtype=torch.int64, device=param.device),
                torch.zeros((0, *param.shape[1:]), dtype=param.dtype, device=param.device))
    if not grad.is_sparse:
        grad = grad.to_sparse(1)
    try:
        ids, rows = coo_parts(grad)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"DistributedOptimizer: the sparse gradient of {name!r}: {exc}") from None
    return torch.from_numpy(ids).to(rows.device), rows


def _sparse(ids: torch.Tensor, rows: torch.Tensor, shape: torch.Size, scale: float) -> torch.Tensor:
    """A coalesced sparse COO tensor of ``shape`` holding ``rows * scale`` at the sorted unique ``ids``."""
    values = rows * scale if scale != 1.0 else rows
    return torch.sparse_coo_tensor(ids.reshape(1, -1), values, shape, is_coalesced=True, check_invariants=False)


def _failed_elsewhere(name: str, exc: Exception, where: str = "another rank") -> CollectiveFailedError:
    return CollectiveFailedError(where, f"DistributedOptimizer: the sparse gradient of {name!r}", type(exc).__name__,
                                 str(exc))


class ServerRows:
    """Rows through the servers: one row-sparse key per parameter, pushed, then its present rows pulled."""

    def __init__(self, job: runtime.Runtime, prefix: str) -> None:
        self._job = job
        self._store = job.store
        self._prefix = prefix

    def _key_of(self, name: str) -> str:
        return self._job.key(f"rows.{self._prefix}.{name}")  # names new again after a re-init

    @staticmethod
    def takes(param: torch.Tensor) -> bool:
        """Whether a row-sparse key can hold ``param``'s rows (rows of at least one element, not bfloat16)."""
        return param.dim() >= 1 and param.numel() > 0 and param.dtype is not torch.bfloat16

    def declare(self, rows: Named) -> None:
        """Create the keys (no rows yet), in one meeting of every rank."""
        empty = [torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                         torch.zeros((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape,
                                         check_invariants=False) for _, p in rows]
        self._store.init([self._key_of(name) for name, _ in rows], empty, summed=True)

    def reduce(self, rows: Sequence[tuple[torch.Tensor, str]], reduction: Reduction) -> None:
        """Push every parameter's rows, pull each key's sum, write it into ``.grad``; the first error after."""
        before, after = _scales(reduction)
        started: list[tuple[torch.Tensor, str, Any]] = []
        for param, name in rows:
            key = self._key_of(name)
            try:
                ids, values = _rows_of(param, name)
            except InvalidArgumentError as exc:  # its place in the round, refused: the others' pull fails
                started.append((param, name, exc))
                try:
                    self._store.refuse_push(key, exc)
                except InvalidArgumentError:
                    pass
                continue
            pushed = self._store.push(key, _sparse(ids, values, param.shape, before), block=False)
            started.append((param, name, (pushed, self._store.pull(key, block=False))))
        error: Exception | None = None
        for param, name, handles in started:
            if isinstance(handles, Exception):
                error = error or handles
                continue
            try:
                handles[0].wait()
                summed = handles[1].wait()
            except RemoteError as exc:  # the servers refused the round: a rank's rows were refused
                error = error or _failed_elsewhere(name, exc)
                continue
            except Exception as exc:
                error = error or exc
                continue
            param.grad = _sparse(summed._indices()[0], summed._values(), param.shape, after)
        if error is not None:
            raise error


class GatheredRows:
    """Rows through sums: every rank's ids and rows gathered (an all-reduce store has no row-sparse keys)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    @staticmethod
    def takes(param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient can travel as rows: a parameter of at least one dimension."""
        return param.dim() >= 1 and param.numel() > 0

    def declare(self, rows: Named) -> None:
        """Nothing to declare: the buffers' keys are made by their first sum."""

    def reduce(self, rows: Sequence[tuple[torch.Tensor, str]], reduction: Reduction) -> None:
        """Gather every rank's rows of every parameter (two sums), sum them by id, write them into ``.grad``.

        Raises:
            InvalidArgumentError: this rank's gradient has ids out of range (after telling the others).
            CollectiveFailedError: another rank's has (on every other rank).
        """
        size, rank = runtime.size(), runtime.rank()
        before, after = _scales(reduction)
        mine: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        counts = torch.zeros(len(rows), size, dtype=torch.int64)
        errors: dict[int, InvalidArgumentError] = {}
        for i, (param, name) in enumerate(rows):
            try:
                ids, values = _rows_of(param, name)
                mine.append((ids, values))
                counts[i, rank] = ids.numel()
            except InvalidArgumentError as exc:
                mine.append(None)
                counts[i, rank], errors[i] = -1, exc
        ops.allreduce_(counts, name=f"{self._prefix}:rows.counts.{len(rows)}", op=ops.Sum)
        _check_counts(counts, rows, errors, rank)
        buffers, caps = [], []
        for (param, _), part, n in zip(rows, mine, counts):
            cap = 1 << max(0, int(n.sum()) - 1).bit_length()  # a power of two, at least 1
            start = int(n[:rank].sum())
            ids = torch.zeros(cap, dtype=torch.int64, device=param.device)
            values = torch.zeros((cap, *param.shape[1:]), dtype=param.dtype, device=param.device)
            assert part is not None  # no errors past _check_counts
            ids[start:start + part[0].numel()] = part[0]
            values[start:start + part[0].numel()] = part[1] * before if before != 1.0 else part[1]
            buffers += [ids, values]
            caps.append(str(cap))
        ops.grouped_allreduce_(buffers, name=f"{self._prefix}:rows.{'.'.join(caps)}", op=ops.Sum)
        for i, (param, _) in enumerate(rows):
            total = int(counts[i].sum())
            ids, values = buffers[2 * i][:total], buffers[2 * i + 1][:total]
            summed = torch.sparse_coo_tensor(ids.reshape(1, -1), values, param.shape).coalesce()
            param.grad = summed * after if after != 1.0 else summed


def _check_counts(counts: torch.Tensor, rows: Sequence[tuple[torch.Tensor, str]],
                  errors: dict[int, InvalidArgumentError], rank: int) -> None:
    """Raise on every rank if some rank's rows were refused (a count of -1): its own error on that rank,
    ``CollectiveFailedError`` naming it on the others."""
    for i, (_, name) in enumerate(rows):
        if i in errors:
            raise errors[i]
        bad = [r for r in range(counts.shape[1]) if int(counts[i, r]) < 0]
        if bad:
            raise _failed_elsewhere(name, InvalidArgumentError("its row ids are out of range for the parameter's "
                                                               f"{rows[i][0].shape[0]} rows"), f"rank {bad[0]}")
