"""The optimizer base class and its JSON config round trip.

An optimizer turns ``(key, weight, grad, state)`` into an in-place update of
``weight`` and ``state``. It works on whatever backend the weight lives on (NumPy,
torch CPU, torch CUDA) and never imports torch itself.

Gradient preprocessing (as MXNet): ``g = rescale_grad * grad``, then, if
``clip_gradient`` is set, ``g = clip(g, -clip_gradient, clip_gradient)``; weight
decay is applied by each rule. Each key has its own update count ``t`` (Adam's
bias correction uses it); ``num_update`` is the largest count and drives the
learning-rate scheduler.

Performance: the built-in rules make no full-size temporary per update. Each has a
NumPy form (:meth:`Optimizer._numpy_rule`, in-place ufuncs with ``out=``, in the same
order of operations as the plain formulas, so results are bit for bit those of the
formulas) and a torch form (:meth:`Optimizer._torch_rule`, fused in-place tensor ops
such as ``add_(x, alpha=)`` / ``addcmul_`` / ``addcdiv_``, on lists of tensors with
``torch._foreach_*``, so a list of keys updated together costs a few kernel calls).
What temporaries remain (a scaled gradient, ``sqrt(v) + eps``) live in scratch buffers
reused across calls (:mod:`pskv.optimizer._scratch`), never in the saved state. The
gradient is only read; rescaling and clipping write to scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from pskv.arrays import FLOAT_DTYPES, Array, ArrayMeta, describe
from pskv.errors import InvalidArgumentError, UnsupportedValueError
from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch, Workspace
from pskv.optimizer._validate import (
    as_bool,
    as_float,
    as_int,
    as_optional_float,
    check_key,
    check_mult,
    construct,
    mult_from_json,
    mult_to_json,
)
from pskv.optimizer.lr_scheduler import LRScheduler
from pskv.optimizer.registry import OPTIMIZERS, create, lookup, registered_class
from pskv.optimizer.rows import update_rows
from pskv.partition import Key

if TYPE_CHECKING:
    from pskv.optimizer.updater import Updater

__all__ = ["Optimizer", "Key", "State", "UpdateFn"]

State = tuple[Array, ...] | None
UpdateFn = Callable[[Any, Any, Any], None]  # what set_updater takes: updater(key, grad, weight); Updater is one

_LOW_PRECISION = frozenset({"float16", "bfloat16"})
# NumPy rules run over large arrays in blocks of this many bytes (of the compute dtype)
# per array, so that the rule's several passes find each block in the CPU cache: each
# array then travels through memory once per update instead of once per operation.
_BLOCK_BYTES = 512 * 1024


class Optimizer:
    """Base class of all optimizers (MXNet-compatible hyperparameters).

    Subclasses implement :meth:`_state_names` (names of the per-key state arrays),
    :meth:`_step` (the rule) and :meth:`_params` (their own hyperparameters), and
    are made available by name with :func:`register`.

    Args:
        learning_rate: the step size; ``None`` means the class default, or the
            scheduler's ``base_lr`` when ``lr_scheduler`` is given. With a scheduler,
            an explicit ``learning_rate`` overwrites the scheduler's ``base_lr``
            (MXNet behaviour).
        wd: weight decay (>= 0); each rule says how it is applied.
        rescale_grad: the gradient is multiplied by this first (> 0).
        clip_gradient: ``None`` (off) or the bound ``c`` (> 0) of ``clip(g, -c, c)``.
        lr_scheduler: ``None`` or an :class:`LRScheduler` (or its config dict).
        multi_precision: keep a float32 master copy of float16 / bfloat16 weights in
            the state and update that copy.
        begin_num_update: the count a key starts from before its first update.
        lazy_update: MXNet's flag for row-sparse gradients (:meth:`update_rows`): True
            updates only the rows a gradient holds (and their state rows); False runs
            the dense update of the gradient with its missing rows zero. ``None``
            means the class default (``default_lazy_update``: True for the built-in
            row-wise rules SGD, NAG, Adam, AdamW, AdaGrad and FTRL, as MXNet 1.x's
            SGD and Adam; False for RMSProp, which MXNet has no sparse form of, and
            for custom rules, which may not act row by row).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    name: ClassVar[str] = ""
    default_learning_rate: ClassVar[float] = 0.01
    aliases: ClassVar[tuple[str, ...]] = ()  # accepted constructor names not written to configs
    # True when the class's _numpy_rule / _torch_rule are in effect (see __init_subclass__)
    _fast_rules: ClassVar[bool] = False
    # whether _torch_rule reads the update count t: tensors of one list call are grouped
    # by t only if it does (a subclass whose rule starts reading t must set it to True)
    _rule_uses_count: ClassVar[bool] = True
    #: ``lazy_update`` when the constructor is not given one (see the class docstring)
    default_lazy_update: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

        def owner(attr: str) -> type:
            return next(c for c in cls.__mro__ if attr in c.__dict__)

        # The in-place rules are used unless a subclass overrides _step or _preprocess
        # below the class that defines them (the documented way to write a custom rule):
        # then the generic path (_preprocess, then _step) runs, as it always did.
        rules = [owner("_numpy_rule"), owner("_torch_rule")]
        cls._fast_rules = Optimizer not in rules and all(
            issubclass(r, owner(attr)) for r in rules for attr in ("_step", "_preprocess")
        )

    def __init__(
        self,
        *,
        learning_rate: float | None = None,
        wd: float = 0.0,
        rescale_grad: float = 1.0,
        clip_gradient: float | None = None,
        lr_scheduler: LRScheduler | Mapping[str, Any] | None = None,
        multi_precision: bool = False,
        begin_num_update: int = 0,
        lazy_update: bool | None = None,
    ) -> None:
        owner = type(self).__name__
        if isinstance(lr_scheduler, Mapping):
            lr_scheduler = LRScheduler.from_config(lr_scheduler)
        if lr_scheduler is not None and not isinstance(lr_scheduler, LRScheduler):
            raise InvalidArgumentError(f"{owner}: lr_scheduler must be an LRScheduler or None, got {lr_scheduler!r}")
        if learning_rate is None:
            learning_rate = lr_scheduler.base_lr if lr_scheduler is not None else self.default_learning_rate
        self._lr = as_float(owner, "learning_rate", learning_rate, ge=0.0)
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None:
            lr_scheduler.base_lr = self._lr
        self.wd = as_float(owner, "wd", wd, ge=0.0)
        self.rescale_grad = as_float(owner, "rescale_grad", rescale_grad, gt=0.0)
        self.clip_gradient = as_optional_float(owner, "clip_gradient", clip_gradient, gt=0.0)
        self.multi_precision = as_bool(owner, "multi_precision", multi_precision)
        self.begin_num_update = as_int(owner, "begin_num_update", begin_num_update, ge=0)
        self.lazy_update = as_bool(owner, "lazy_update", self.default_lazy_update if lazy_update is None else lazy_update)
        self.num_update = self.begin_num_update
        self._index_update_count: dict[Key, int] = {}
        self.lr_mult: dict[Key, float] = {}
        self.wd_mult: dict[Key, float] = {}
        self._workspace = Workspace()  # scratch buffers of the rules (never saved)

    # ----------------------------------------------------------- hyperparameters
    @property
    def learning_rate(self) -> float:
        """The current rate: ``lr_scheduler(num_update)`` if a scheduler is set, else the fixed rate."""
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler(self.num_update))
        return self._lr

    def set_learning_rate(self, lr: float) -> None:
        """Set the fixed learning rate.

        Args:
            lr: the new rate (>= 0).

        Raises:
            InvalidArgumentError: a scheduler is set (MXNet forbids this too) or ``lr`` is invalid.
        """
        if self.lr_scheduler is not None:
            raise InvalidArgumentError(
                "cannot set_learning_rate on an optimizer with an lr_scheduler; change the scheduler instead"
            )
        self._lr = as_float(type(self).__name__, "learning_rate", lr, ge=0.0)

    def set_lr_mult(self, args_lr_mult: Mapping[Key, float]) -> None:
        """Replace the per-key learning-rate multipliers (keys absent use 1.0).

        Args:
            args_lr_mult: store key -> multiplier (>= 0).

        Raises:
            InvalidArgumentError: a multiplier is invalid.
            KeyTypeError: a key is neither int nor str.
        """
        self.lr_mult = check_mult(type(self).__name__, "lr_mult", args_lr_mult)

    def set_wd_mult(self, args_wd_mult: Mapping[Key, float]) -> None:
        """Replace the per-key weight-decay multipliers (keys absent use 1.0).

        Args:
            args_wd_mult: store key -> multiplier (>= 0).

        Raises:
            InvalidArgumentError: a multiplier is invalid.
            KeyTypeError: a key is neither int nor str.
        """
        self.wd_mult = check_mult(type(self).__name__, "wd_mult", args_wd_mult)

    def _get_lr(self, key: Key) -> float:
        return self.learning_rate * self.lr_mult.get(key, 1.0)

    def _get_wd(self, key: Key) -> float:
        return self.wd * self.wd_mult.get(key, 1.0)

    # ------------------------------------------------------------ update counts
    def _update_count(self, key: Key) -> None:
        count = self._index_update_count.get(key, self.begin_num_update) + 1
        self._index_update_count[key] = count
        self.num_update = max(count, self.num_update)

    def get_update_count(self, key: Key) -> int:
        """How many updates ``key`` has had (``begin_num_update`` if none)."""
        return self._index_update_count.get(key, self.begin_num_update)

    @property
    def update_counts(self) -> dict[Key, int]:
        """A copy of the per-key update counts."""
        return dict(self._index_update_count)

    def set_update_counts(self, counts: Mapping[Key, int], num_update: int | None = None) -> None:
        """Replace the per-key counts (used by :class:`Updater` on restore / optimizer swap).

        Args:
            counts: key -> number of updates so far.
            num_update: the global count; defaults to the largest of ``counts`` and
                ``begin_num_update``.

        Raises:
            InvalidArgumentError: a count is negative or not an int.
        """
        owner = type(self).__name__
        new = {check_key(k): as_int(owner, f"count[{k!r}]", v, ge=0) for k, v in counts.items()}
        top = max([self.begin_num_update, *new.values()])
        self._index_update_count = new
        self.num_update = top if num_update is None else max(top, as_int(owner, "num_update", num_update, ge=0))

    # --------------------------------------------------------------- states
    def _state_names(self) -> tuple[str, ...]:
        """Names of the arrays :meth:`_step` keeps per key (subclasses override)."""
        return ()

    def _uses_master(self, dtype: str) -> bool:
        return self.multi_precision and dtype in _LOW_PRECISION

    def state_names(self, meta: ArrayMeta) -> tuple[str, ...]:
        """Names of the state arrays for a weight described by ``meta``.

        ``("weight32", ...)`` leads when a float32 master copy is kept.
        """
        inner = self._state_names()
        return ("weight32", *inner) if self._uses_master(meta.dtype) else inner

    def _check(self, key: Key, weight: Array) -> ArrayMeta:
        meta = describe(weight)
        if meta.dtype not in FLOAT_DTYPES:
            raise UnsupportedValueError(
                f"optimizer {self.name or type(self).__name__} cannot update key {key!r}: dtype {meta.dtype} "
                f"is not a floating-point dtype (supported: {', '.join(sorted(FLOAT_DTYPES))})"
            )
        return meta

    def create_state(self, key: Key, weight: Array) -> State:
        """New zero state for ``weight`` (same backend and device); ``None`` if the rule keeps none.

        With ``multi_precision`` and a float16 / bfloat16 weight the first array is a
        float32 copy of the weight and the others are float32.

        Args:
            key: the store key.
            weight: the weight array.

        Raises:
            UnsupportedValueError: ``weight`` is not a floating-point array.
        """
        meta = self._check(key, weight)
        w = _math.detach(weight)
        if self._uses_master(meta.dtype):
            master = _math.cast(w, "float32")
            arrays = [master] + [_math.zeros_like(master) for _ in self._state_names()]
        else:
            arrays = [_math.zeros_like(w) for _ in self._state_names()]
        return tuple(arrays) if arrays else None

    create_state_multi_precision = create_state

    def _checked(self, key: Key, weight: Array, state: State) -> tuple[Key, ArrayMeta, tuple[Array, ...]]:
        """``key`` checked, ``weight``'s description, and ``state``'s arrays (as many as the rule keeps)."""
        key = check_key(key)
        meta = self._check(key, weight)
        names = self.state_names(meta)
        arrays = () if state is None else tuple(state)
        if len(arrays) != len(names):
            raise InvalidArgumentError(
                f"key {key!r}: {type(self).__name__} expects state arrays {names}, got {len(arrays)} array(s)"
            )
        return key, meta, arrays

    def update(self, key: Key, weight: Array, grad: Array, state: State) -> None:
        """Apply one update to ``weight`` and ``state`` in place and count it for ``key``.

        ``grad`` must have the weight's shape, dtype, backend and device
        (:class:`~pskv.optimizer.Updater` checks and converts this).

        Args:
            key: the store key (selects lr_mult / wd_mult and the update count).
            weight: the weight, updated in place.
            grad: the gradient (not modified).
            state: what :meth:`create_state` returned for this key and weight.

        Raises:
            KeyTypeError: ``key`` is neither int nor str.
            UnsupportedValueError: ``weight`` is not a floating-point array.
            InvalidArgumentError: ``state`` does not have the expected number of arrays.
        """
        key, meta, arrays = self._checked(key, weight, state)
        self._apply([(key, weight, grad, arrays, self._uses_master(meta.dtype))])

    update_multi_precision = update

    def update_rows(self, key: Key, weight: Array, indices: Any, grad_rows: Array, state: State) -> None:
        """Apply one update from a row-sparse gradient: the rows ``indices`` hold ``grad_rows``, others zero.

        With ``lazy_update`` only those rows of ``weight`` and of its state change; the
        key's update count grows by one either way. Arguments and the errors of the rows:
        :func:`pskv.optimizer.rows.update_rows`; the others are :meth:`update`'s.
        """
        key, meta, _ = self._checked(key, weight, state)
        update_rows(self, key, meta, weight, indices, grad_rows, state)

    # ----------------------------------------------------------- the update engine
    def _apply(self, items: Sequence[tuple[Key, Array, Array, tuple[Array, ...], bool]]) -> None:
        """Update already validated keys (the work behind :meth:`update` and the Updater).

        ``items`` holds ``(key, weight, grad, state, master)``: ``grad`` has the shape,
        dtype, backend and device of ``weight``; ``state`` is the key's state tuple
        (``()`` for none) and ``master`` says whether it starts with a float32 master
        copy. Counts are taken key by key, in order, and each key's rate is read after
        its own count (as one ``update`` call per key would). Torch tensors that share
        device, dtype, master use, rate, decay and (if the rule reads it, see
        ``_rule_uses_count``) count are updated together, with ``torch._foreach_*`` ops.
        """
        groups: dict[Any, list[tuple[Array, Array, tuple[Array, ...], int]]] | None = None
        for key, w, g, st, master in items:
            self._update_count(key)
            lr, wd, t = self._get_lr(key), self._get_wd(key), self._index_update_count[key]
            if isinstance(w, np.ndarray):
                self._apply_numpy(w, g, st, master, lr, wd, t)
            else:
                if groups is None:
                    groups = {}
                tkey = t if self._rule_uses_count else None
                groups.setdefault((w.device, w.dtype, master, lr, wd, tkey), []).append((w, g, st, t))
        if groups:
            torch = _math.torch_ops()
            with torch.no_grad():
                for (_, _, master, lr, wd, _), group in groups.items():
                    self._apply_torch(group, master, lr, wd, group[0][3])

    def _apply_numpy(self, w: Array, g: Array, st: tuple[Array, ...], master: bool, lr: float, wd: float,
                     t: int) -> None:
        if not self._fast_rules:
            self._apply_generic(w, g, st, master, lr, wd, t)
            return
        block = _BLOCK_BYTES // (4 if master else w.itemsize)
        n = w.size
        if n >= 2 * block and w.flags.c_contiguous and g.flags.c_contiguous and all(a.flags.c_contiguous for a in st):
            # The rules are element-wise: running them block by block gives the same bits.
            wf, gf, sf = w.reshape(-1), g.reshape(-1), [a.reshape(-1) for a in st]
            for i in range(0, n, block):
                j = i + block
                self._numpy_block(wf[i:j], gf[i:j], tuple(a[i:j] for a in sf), master, lr, wd, t)
        else:
            self._numpy_block(w, g, st, master, lr, wd, t)

    def _numpy_block(self, w: Array, g: Array, st: tuple[Array, ...], master: bool, lr: float, wd: float,
                     t: int) -> None:
        if master:
            target = st[0]
            scratch = self._workspace.numpy(target)
            g32 = scratch(0)
            np.copyto(g32, g, casting="unsafe")  # float16 -> float32 is exact
            self._numpy_rule(target, self._numpy_preprocess(g32, scratch), st[1:], lr, wd, t, scratch)
            np.copyto(w, target, casting="unsafe")
        else:
            scratch = self._workspace.numpy(w)
            self._numpy_rule(w, self._numpy_preprocess(g, scratch), st, lr, wd, t, scratch)

    def _apply_torch(self, items: list[tuple[Array, Array, tuple[Array, ...], int]], master: bool, lr: float,
                     wd: float, t: int) -> None:
        """Update a group of tensors (one device and dtype; called under ``torch.no_grad()``).

        ``t`` is the first item's count: the items share it when the rule reads it.
        """
        if not self._fast_rules:
            for w, g, st, count in items:
                self._apply_generic(w.detach(), g.detach(), st, master, lr, wd, count)
            return
        ws = [it[0] for it in items]
        gs = [it[1] for it in items]
        sts = [it[2] for it in items]
        if master:
            targets = [st[0] for st in sts]
            scratch = self._workspace.torch(targets)
            g32 = scratch(0)
            _math.torch_ops()._foreach_copy_(g32, gs)
            g, scale = self._torch_preprocess(g32, scratch)
            self._torch_rule(targets, g, scale, [st[1:] for st in sts], lr, wd, t, scratch)
            _math.torch_ops()._foreach_copy_(ws, targets)
        else:
            scratch = self._workspace.torch(ws)
            g, scale = self._torch_preprocess(gs, scratch)
            self._torch_rule(ws, g, scale, sts, lr, wd, t, scratch)

    def _apply_generic(self, w: Array, g: Array, st: tuple[Array, ...], master: bool, lr: float, wd: float,
                       t: int) -> None:
        """The plain path for custom rules: ``_step(weight, _preprocess(grad), ...)``."""
        if master:
            target = st[0]
            self._step(target, self._preprocess(_math.cast(g, "float32")), st[1:], lr, wd, t)
            _math.assign(w, target)
        else:
            self._step(w, self._preprocess(g), st, lr, wd, t)

    def _numpy_preprocess(self, g: Array, scratch: NumpyScratch) -> Array:
        """``clip(rescale_grad * g)`` in scratch slot 0, or ``g`` itself when that is a no-op."""
        if self.rescale_grad != 1.0:
            s0 = scratch(0)
            np.multiply(g, self.rescale_grad, out=s0)
            g = s0
        if self.clip_gradient is not None:
            s0 = scratch(0)
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=s0)
            g = s0
        return g

    def _torch_preprocess(self, gs: list[Array], scratch: TorchScratch) -> tuple[list[Array], float]:
        """``(g, scale)`` with ``scale * g`` the preprocessed gradient.

        Without clipping the rescale factor is returned as ``scale`` (the rules fold it
        into their coefficients); with clipping ``clip(rescale_grad * g)`` is written to
        scratch slot 0 (unless ``gs`` already is slot 0, e.g. a master-weight cast).
        """
        if self.clip_gradient is None:
            return gs, self.rescale_grad
        s0 = scratch(0)
        _math.mul_into(s0, gs, self.rescale_grad)
        _math.clamp_(s0, -self.clip_gradient, self.clip_gradient)
        return s0, 1.0

    def _preprocess(self, g: Array) -> Array:
        """``clip(rescale_grad * g)`` as a new array (or ``g`` itself); the generic path's preprocessing."""
        if self.rescale_grad != 1.0:
            g = g * self.rescale_grad
        if self.clip_gradient is not None:
            g = _math.clip(g, -self.clip_gradient, self.clip_gradient)
        return g

    # ------------------------------------------------------------------ rules
    def _numpy_rule(self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int,
                    scratch: NumpyScratch) -> None:
        """The rule on NumPy arrays, in place, without new full-size arrays.

        ``g`` is the preprocessed gradient: read-only, except that it may *be*
        ``scratch(0)``, so the rule may write slot 0 once it no longer reads ``g`` (or
        element by element while reading it). ``scratch(i)`` for ``i >= 1`` is free.
        """
        raise NotImplementedError

    def _torch_rule(self, weights: list[Array], g: list[Array], scale: float, states: list[tuple[Array, ...]],
                    lr: float, wd: float, t: int, scratch: TorchScratch) -> None:
        """The rule on a list of tensors (one device and dtype), in place.

        The preprocessed gradient of ``weights[i]`` is ``scale * g[i]``; ``g`` is
        read-only except that it may be ``scratch(0)`` (as in :meth:`_numpy_rule`).
        Runs under ``torch.no_grad()``.
        """
        raise NotImplementedError

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        """The rule: update ``weight`` and ``state`` in place (``grad`` is preprocessed, read-only).

        Custom optimizers override this (and :meth:`_state_names`); built-in ones
        implement :meth:`_numpy_rule` / :meth:`_torch_rule`, which this runs.
        """
        if type(self)._numpy_rule is Optimizer._numpy_rule:
            raise NotImplementedError(f"{type(self).__name__} implements no update rule (_step)")
        state = tuple(state)
        if isinstance(weight, np.ndarray):
            self._numpy_rule(weight, grad, state, lr, wd, t, self._workspace.numpy(weight))
        else:
            with _math.torch_ops().no_grad():
                self._torch_rule([weight], [grad], 1.0, [state], lr, wd, t, self._workspace.torch([weight]))

    # --------------------------------------------------------------- config
    def _params(self) -> dict[str, Any]:
        """The subclass's own hyperparameters, by constructor name (JSON-safe)."""
        return {}

    def to_config(self) -> dict[str, Any]:
        """A JSON-safe ``{"name": ..., "params": {...}}`` that :meth:`from_config` turns back into this optimizer.

        ``lr_mult`` / ``wd_mult`` are lists of ``[key, multiplier]`` pairs so int and
        str keys survive JSON. Update counts are state, not configuration: they are
        not included.

        Raises:
            InvalidArgumentError: the class (or its scheduler) is not registered.
        """
        if registered_class(self.name) is not type(self):
            raise InvalidArgumentError(f"{type(self).__name__} is not a registered optimizer; cannot build a config")
        params: dict[str, Any] = {
            "learning_rate": self.lr_scheduler.base_lr if self.lr_scheduler is not None else self._lr,
            "wd": self.wd,
            "rescale_grad": self.rescale_grad,
            "clip_gradient": self.clip_gradient,
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.to_config(),
            "multi_precision": self.multi_precision,
            "begin_num_update": self.begin_num_update,
            "lazy_update": self.lazy_update,
            "lr_mult": mult_to_json(self.lr_mult),
            "wd_mult": mult_to_json(self.wd_mult),
        }
        params.update(self._params())
        return {"name": self.name, "params": params}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Optimizer:
        """Build an optimizer from :meth:`to_config` output (dispatching on ``name``).

        Args:
            config: ``{"name": <registered name>, "params": {...}}``.

        Raises:
            InvalidArgumentError: malformed config, unknown name (lists the known
                ones), unknown or invalid parameters, or a name that is not a
                subclass of the class this was called on.
        """
        if not isinstance(config, Mapping) or set(config) != {"name", "params"}:
            raise InvalidArgumentError(f"an optimizer config is a dict with keys 'name' and 'params', got {config!r}")
        opt_cls = lookup(config["name"])
        if not issubclass(opt_cls, cls):
            raise InvalidArgumentError(f"config names {opt_cls.__name__}, which is not a {cls.__name__}")
        params = config["params"]
        if not isinstance(params, Mapping):
            raise InvalidArgumentError(f"optimizer params must be a dict, got {params!r}")
        params = dict(params)
        lr_mult = mult_from_json("lr_mult", params.pop("lr_mult", []))
        wd_mult = mult_from_json("wd_mult", params.pop("wd_mult", []))
        opt: Optimizer = construct(f"optimizer {opt_cls.name!r}", opt_cls, params, opt_cls.aliases)
        opt.set_lr_mult(lr_mult)
        opt.set_wd_mult(wd_mult)
        return opt

    create_optimizer = staticmethod(create)
    register: Any  # MXNet's Optimizer.register: set to pskv.optimizer.base.register below the class

    # --------------------------------------------------------------- misc
    def get_updater(self) -> Updater:
        """An :class:`~pskv.optimizer.Updater` driving this optimizer (:func:`pskv.optimizer.get_updater`)."""
        from pskv.optimizer.updater import get_updater  # at call time: updater imports this module

        return get_updater(self)

    def __repr__(self) -> str:
        try:
            params = self.to_config()["params"]
        except InvalidArgumentError:
            return f"{type(self).__name__}(lr={self.learning_rate!r})"
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items() if v is not None and v != [])
        return f"{type(self).__name__}({shown})"


_T = TypeVar("_T", bound="type[Optimizer]")


def register(cls: _T) -> _T:
    """Class decorator: register an optimizer under its lower-cased class name.

    Registering the same class again (e.g. after a module reload) replaces it.

    Args:
        cls: an :class:`Optimizer` subclass.

    Raises:
        InvalidArgumentError: ``cls`` is not an Optimizer subclass, or a different
            class already holds the name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise InvalidArgumentError(f"only Optimizer subclasses can be registered, got {cls!r}")
    OPTIMIZERS.add(cls.__name__, cls)
    cls.name = cls.__name__.lower()
    return cls


Optimizer.register = staticmethod(register)  # type: ignore[assignment]  # MXNet's Optimizer.register
