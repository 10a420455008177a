"""The single-process stores ('local', 'device'): every operation, form and error."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from tests.conftest import Arrays

SHAPE = (4, 4)


def assert_all(x: object, value: float) -> None:
    np.testing.assert_array_equal(Arrays.np(x), np.full(Arrays.np(x).shape, value, dtype=Arrays.np(x).dtype))


# -- create / registry ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["local", "device", "LOCAL", "local_update_cpu", "local_allreduce_cpu",
                                  "local_allreduce_device"])
def test_create_known_types(make_store, name):
    kv = make_store(name)
    assert kv.type == name.lower()
    assert (kv.rank, kv.num_workers, kv.local_rank) == (0, 1, 0)


def test_create_unknown_type_lists_known_types():
    with pytest.raises(ValueError, match="known types: .*device.*local") as info:
        pskv.create("FooBar")
    assert isinstance(info.value, pskv.KVStoreError)


def test_dist_store_without_cluster_environment_says_what_is_missing(monkeypatch):
    for var in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(pskv.InvalidArgumentError, match="DMLC_PS_ROOT_URI.*DMLC_NUM_WORKER"):
        pskv.create("dist_sync")


def test_byteps_without_cluster_environment_says_what_is_missing(monkeypatch):
    for var in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(pskv.InvalidArgumentError, match="DMLC_PS_ROOT_URI"):
        pskv.create("byteps")


def test_create_name_must_be_str():
    with pytest.raises(TypeError, match="must be a string"):
        pskv.create(3)  # type: ignore[arg-type]


def test_create_unknown_setting():
    with pytest.raises(pskv.InvalidArgumentError, match="unknown setting"):
        pskv.create("local", no_such_setting=1)


def test_register_custom_store():
    class SummingStore(pskv.KVStoreBase):
        def __init__(self):
            self.log = []

        def broadcast(self, key, value, out=None, priority=0):
            for o in out:
                o[...] = value

        def pushpull(self, key, value, out=None, priority=0):
            total = sum(value)
            for o in (value if out is None else out):
                o[...] = total

        def set_optimizer(self, optimizer):
            raise pskv.NotSupportedError("no optimizer")

        @classmethod
        def is_capable(cls, capability):
            cls._capability(capability)
            return False

        def save_optimizer_states(self, fname, dump_optimizer=False):
            raise pskv.NotSupportedError("no optimizer")

        def load_optimizer_states(self, fname):
            raise pskv.NotSupportedError("no optimizer")

        type = "summingstore"
        rank = 0
        num_workers = 1

    try:
        assert pskv.KVStoreBase.register(SummingStore) is SummingStore
        kv = pskv.create("SummingStore")
        assert isinstance(kv, SummingStore)
        assert "summingstore" in pskv.known_types()
        assert type(kv).is_capable(pskv.KVStoreBase.OPTIMIZER) is False
        outs = [np.zeros(3), np.zeros(3)]
        kv.pushpull(0, [np.ones(3), np.ones(3)], out=outs)
        assert_all(outs[1], 2)
        with pytest.raises(pskv.NotSupportedError, match="summingstore.*push"):
            kv.push(0, np.ones(3))
        with pytest.raises(pskv.NotSupportedError, match="summingstore.*restore_rows"):  # an optional capability
            kv.restore_rows(0, np.zeros(0, np.int64), np.zeros((0, 3)))
        assert kv.num_dead_node(2) == 0
        pskv.KVStoreBase.register(SummingStore)  # the same class again: replaces it

        class Other(pskv.KVStoreBase):
            pass
        Other.__name__ = "SummingStore"
        with pytest.raises(pskv.InvalidArgumentError, match="already registered"):
            pskv.KVStoreBase.register(Other)
    finally:
        pskv.KVStoreBase.kv_registry.pop("summingstore", None)


def test_register_rejects_reserved_and_non_stores():
    class Local(pskv.LocalStore):
        pass

    with pytest.raises(pskv.InvalidArgumentError, match="reserved"):
        pskv.KVStoreBase.register(Local)
    with pytest.raises(pskv.InvalidArgumentError, match="KVStoreBase subclass"):
        pskv.KVStoreBase.register(dict)


# -- init ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [3, "a"])
def test_init_then_pull(kv, arr, key):
    kv.init(key, arr.full(SHAPE, 4))
    out = arr.zeros(SHAPE)
    kv.pull(key, out=out)
    assert_all(out, 4)


def test_init_stores_a_copy(kv, arr):
    value = arr.ones(SHAPE)
    kv.init(3, value)
    value[...] = 42
    assert_all(kv.pull(3), 1)


def test_init_key_list_and_one_element_list(kv, arr):
    kv.init([5, 7, 9], [arr.full(SHAPE, i) for i in (5, 7, 9)])
    kv.init(11, [arr.full(SHAPE, 11)])
    for k in (5, 7, 9, 11):
        assert_all(kv.pull(k), k)


def test_duplicate_init_raises_keyerror(kv, arr):
    kv.init(3, arr.ones(SHAPE))
    with pytest.raises(KeyError, match="duplicate init of key 3") as info:
        kv.init(3, arr.ones(SHAPE))
    assert isinstance(info.value, pskv.DuplicateKeyError)
    with pytest.raises(pskv.DuplicateKeyError, match="'b'"):
        kv2 = pskv.create("local")
        try:
            kv2.init(["a", "b", "b"], [arr.ones(SHAPE)] * 3)
        finally:
            kv2.close()


def test_duplicate_init_in_list_changes_nothing(kv, arr):
    kv.init(3, arr.ones(SHAPE))
    with pytest.raises(pskv.DuplicateKeyError):
        kv.init([4, 3], [arr.ones(SHAPE), arr.ones(SHAPE)])
    with pytest.raises(pskv.UnknownKeyError):
        kv.pull(4)


def test_init_with_two_values_raises(kv, arr):
    with pytest.raises(pskv.InvalidArgumentError, match="exactly one"):
        kv.init(3, [arr.ones(SHAPE), arr.ones(SHAPE)])


# -- push / pull ---------------------------------------------------------------------------

@pytest.mark.parametrize("key", [3, "a"])
def test_push_sums_device_values_and_assigns(kv, arr, key):
    kv.init(key, arr.zeros(SHAPE))
    kv.push(key, [arr.ones(SHAPE)] * 4)
    assert_all(kv.pull(key), 4)
    kv.push(key, [arr.full(SHAPE, 2), arr.full(SHAPE, 3)])
    assert_all(kv.pull(key), 5)  # ASSIGN: the new sum replaces the value, no accumulation


def test_push_pull_key_lists(kv, arr):
    keys = ["b", "c", "d"]
    kv.init(keys, [arr.zeros(SHAPE)] * 3)
    kv.push(keys, [[arr.ones(SHAPE)] * 4, arr.full(SHAPE, 2), [arr.ones(SHAPE), arr.ones(SHAPE)]])
    outs = [[arr.zeros(SHAPE) for _ in range(4)] for _ in keys]
    kv.pull(keys, out=outs)
    for per_device, want in zip(outs, (4, 2, 2)):
        for o in per_device:
            assert_all(o, want)
    singles = [arr.zeros(SHAPE) for _ in keys]
    kv.pull(keys, out=singles)
    assert [float(Arrays.np(o)[0, 0]) for o in singles] == [4, 2, 2]
    new = kv.pull(keys)
    assert isinstance(new, list) and [float(Arrays.np(o)[0, 0]) for o in new] == [4, 2, 2]


def test_push_repeated_key_in_list_sums(kv, arr):
    kv.init(3, arr.zeros(SHAPE))
    kv.push([3, 3], [arr.ones(SHAPE), arr.full(SHAPE, 5)])
    assert_all(kv.pull(3), 6)


def test_store_never_keeps_a_reference_to_pushed_arrays(kv, arr):
    kv.init(3, arr.zeros(SHAPE))
    value = arr.ones(SHAPE)
    kv.push(3, value)
    value[...] = 42
    assert_all(kv.pull(3), 1)
    pulled = kv.pull(3)
    pulled[...] = 7
    assert_all(kv.pull(3), 1)


def test_push_shape_mismatch_names_key_and_shapes_and_changes_nothing(kv, arr):
    kv.init(3, arr.ones((2, 3)))
    with pytest.raises(ValueError, match=r"key 3.*\(4, 4\).*\(2, 3\)") as info:
        kv.push(3, [arr.full((2, 3), 9), arr.ones((4, 4))])
    assert isinstance(info.value, pskv.ShapeMismatchError)
    assert info.value.expected == (2, 3) and info.value.got == (4, 4)
    assert_all(kv.pull(3), 1)


def test_push_key_list_with_one_bad_value_changes_nothing(kv, arr):
    kv.init([1, 2], [arr.ones(SHAPE), arr.ones(SHAPE)])
    with pytest.raises(pskv.ShapeMismatchError, match="key 2"):
        kv.push([1, 2], [arr.full(SHAPE, 5), arr.ones((2, 2))])
    assert_all(kv.pull(1), 1)


def test_push_dtype_mismatch(kv, arr):
    kv.init(3, arr.ones(SHAPE, "float32"))
    with pytest.raises(ValueError, match="key 3: dtype float64 does not match the stored dtype float32") as info:
        kv.push(3, arr.ones(SHAPE, "float64"))
    assert isinstance(info.value, pskv.DTypeMismatchError)


def test_push_and_pull_uninitialised_key(kv, arr):
    with pytest.raises(KeyError, match="key 3 has not been initialised") as info:
        kv.push(3, arr.ones(SHAPE))
    assert isinstance(info.value, pskv.UnknownKeyError) and info.value.key == 3
    with pytest.raises(pskv.UnknownKeyError, match="'w'.*pull"):
        kv.pull("w")


def test_pull_shape_and_dtype_mismatch(kv, arr):
    kv.init(3, arr.ones(SHAPE))
    with pytest.raises(pskv.ShapeMismatchError, match=r"pull of key 3: shape \(2, 3\)"):
        kv.pull(3, out=[arr.zeros(SHAPE), arr.zeros((2, 3))])
    with pytest.raises(pskv.DTypeMismatchError, match="pull of key 3: dtype int32 does not match the stored dtype float32"):
        kv.pull(3, out=arr.zeros(SHAPE, "int32"))  # another floating dtype casts (tests/unit/test_sparse.py)


def test_pull_returns_new_array_of_init_kind(kv, arr):
    kv.init(3, arr.full(SHAPE, 2))
    got = kv.pull(3)
    assert type(got) is type(arr.ones(SHAPE))
    assert_all(got, 2)


def test_value_lists_must_match_key_lists(kv, arr):
    kv.init([1, 2], [arr.ones(SHAPE)] * 2)
    with pytest.raises(pskv.InvalidArgumentError, match="2 keys but 1 values"):
        kv.push([1, 2], [arr.ones(SHAPE)])
    with pytest.raises(pskv.InvalidArgumentError, match="list of 2 outs"):
        kv.pull([1, 2], out=arr.ones(SHAPE))


def test_unsupported_values_and_keys(kv, arr):
    with pytest.raises(TypeError, match="numpy.ndarray or torch.Tensor") as info:
        kv.init(1, [[1.0, 2.0]])
    assert isinstance(info.value, pskv.UnsupportedValueError)
    with pytest.raises(pskv.UnsupportedValueError, match="unsupported NumPy dtype"):
        kv.init(1, np.ones(3, dtype=np.uint8))
    with pytest.raises(pskv.KeyTypeError, match="int or str"):
        kv.init(1.5, arr.ones(SHAPE))
    with pytest.raises(pskv.KeyTypeError, match="int or str"):
        kv.init(True, arr.ones(SHAPE))
    with pytest.raises(pskv.KeyTypeError, match="mixed"):
        kv.init([1, "a"], [arr.ones(SHAPE)] * 2)


def test_numpy_integer_keys_are_ints(kv, arr):
    kv.init(np.int64(3), arr.ones(SHAPE))
    assert_all(kv.pull(3), 1)


@pytest.mark.parametrize("first,second", [(3, "a"), ("a", 3)])
def test_store_uses_one_key_kind(kv, arr, first, second):
    kv.init(first, arr.ones(SHAPE))
    for op in (lambda: kv.init(second, arr.ones(SHAPE)), lambda: kv.push(second, arr.ones(SHAPE)),
               lambda: kv.pull(second), lambda: kv.row_sparse_pull(second, row_ids=[0])):
        with pytest.raises(TypeError, match="cannot be mixed"):
            op()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
def test_all_dtypes(kv, arr, dtype):
    kv.init("k", arr.zeros(SHAPE, dtype))
    kv.push("k", [arr.full(SHAPE, 3, dtype), arr.full(SHAPE, 4, dtype)])
    out = arr.zeros(SHAPE, dtype)
    kv.pull("k", out=out)
    assert_all(out, 7)
    assert Arrays.np(out).dtype == np.dtype(dtype)


def test_mixed_backends_in_one_call(kv):
    torch = pytest.importorskip("torch")
    kv.init(1, np.zeros(SHAPE, np.float32))
    kv.push(1, [np.ones(SHAPE, np.float32), torch.ones(SHAPE)])
    out_t, out_n = torch.zeros(SHAPE), np.zeros(SHAPE, np.float32)
    kv.pull(1, out=[out_t, out_n])
    assert float(out_t[0, 0]) == 2 and out_n[0, 0] == 2


def test_bfloat16_tensors(kv):
    torch = pytest.importorskip("torch")
    kv.init("w", torch.zeros(SHAPE, dtype=torch.bfloat16))
    kv.push("w", [torch.full(SHAPE, 1.5, dtype=torch.bfloat16)] * 2)
    got = kv.pull("w")
    assert got.dtype == torch.bfloat16 and float(got[0, 0]) == 3.0
    with pytest.raises(pskv.DTypeMismatchError, match="bfloat16"):
        kv.push("w", torch.zeros(SHAPE, dtype=torch.float16))


def test_large_arrays_use_threaded_kernels(make_store, arr):
    kv = make_store("local", kernel_threads=2, kernel_parallel_bytes=1024)
    n = 100_003  # not a multiple of the block size or thread count
    kv.init(0, arr.zeros((n,)))
    vals = [arr.rand((n,), seed=s) for s in range(4)]
    outs = [arr.zeros((n,)) for _ in range(3)]
    kv.push(0, vals)
    kv.pull(0, out=outs)
    want = sum(Arrays.np(v).astype(np.float64) for v in vals)
    for o in outs:
        np.testing.assert_allclose(Arrays.np(o), want, rtol=1e-5, atol=1e-5)


def test_non_contiguous_values(kv):
    base = np.arange(32, dtype=np.float32).reshape(4, 8)
    kv.init(0, np.zeros((4, 4), np.float32))
    kv.push(0, [base[:, ::2], base[:, 1::2]])
    np.testing.assert_array_equal(kv.pull(0), base[:, ::2] + base[:, 1::2])
    out = np.zeros((4, 8), np.float32)
    kv.pull(0, out=out[:, ::2])
    np.testing.assert_array_equal(out[:, ::2], base[:, ::2] + base[:, 1::2])


# -- pushpull --------------------------------------------------------------------------------

def test_pushpull_into_outs_and_in_place(kv, arr):
    kv.broadcast(3, arr.zeros(SHAPE), out=arr.zeros(SHAPE))
    outs = [arr.zeros(SHAPE) for _ in range(4)]
    kv.pushpull(3, [arr.ones(SHAPE)] * 4, out=outs)
    for o in outs:
        assert_all(o, 4)
    values = [arr.ones(SHAPE) for _ in range(4)]
    kv.pushpull(3, values)
    for v in values:
        assert_all(v, 4)


def test_pushpull_key_list_in_place(kv, arr):
    kv.init([1, 2], [arr.zeros(SHAPE)] * 2)
    vals = [[arr.ones(SHAPE), arr.ones(SHAPE)], [arr.full(SHAPE, 3), arr.full(SHAPE, 3)]]
    kv.pushpull([1, 2], vals)
    assert_all(vals[0][1], 2)
    assert_all(vals[1][0], 6)


def test_pushpull_with_updater_returns_updated_value(kv, arr):
    kv.init(1, arr.full(SHAPE, 10))
    kv.set_updater(lambda key, merged, stored: stored.__isub__(merged))
    out = arr.zeros(SHAPE)
    kv.pushpull(1, [arr.ones(SHAPE)] * 2, out=out)
    assert_all(out, 8)


def test_pushpull_errors_change_nothing(kv, arr):
    kv.init(1, arr.ones(SHAPE))
    with pytest.raises(pskv.ShapeMismatchError):
        kv.pushpull(1, arr.full(SHAPE, 5), out=arr.zeros((2, 2)))
    assert_all(kv.pull(1), 1)


# -- broadcast ---------------------------------------------------------------------------------

def test_broadcast_new_and_existing_keys_many_times(kv, arr):
    outs = [arr.zeros(SHAPE) for _ in range(3)]
    kv.broadcast("x", arr.ones(SHAPE), out=outs)
    for o in outs:
        assert_all(o, 1)
    kv.broadcast("x", arr.full(SHAPE, 2), out=outs)
    kv.broadcast("x", arr.full(SHAPE, 3), out=outs[0])
    assert_all(outs[0], 3)
    assert_all(outs[2], 2)
    assert_all(kv.pull("x"), 3)
    kv.init("y", arr.ones(SHAPE))
    kv.broadcast("y", arr.full(SHAPE, 5))  # after init, without outs
    assert_all(kv.pull("y"), 5)


def test_broadcast_key_list(kv, arr):
    outs = [[arr.zeros(SHAPE), arr.zeros(SHAPE)], [arr.zeros(SHAPE), arr.zeros(SHAPE)]]
    kv.broadcast([6, 7], [arr.full(SHAPE, 6), arr.full(SHAPE, 7)], out=outs)
    assert_all(outs[0][1], 6)
    assert_all(outs[1][0], 7)


def test_broadcast_mismatch_raises(kv, arr):
    kv.init(1, arr.ones(SHAPE))
    with pytest.raises(pskv.ShapeMismatchError):
        kv.broadcast(1, arr.ones((2, 2)), out=arr.zeros((2, 2)))
    with pytest.raises(pskv.ShapeMismatchError):
        kv.broadcast(2, arr.ones(SHAPE), out=arr.zeros((2, 2)))
    with pytest.raises(pskv.UnknownKeyError):
        kv.pull(2)


# -- row_sparse_pull ---------------------------------------------------------------------------

def test_row_sparse_pull_full_and_compact_outs(kv, arr):
    value = arr.rand((6, 3))
    kv.init("e", value)
    full = arr.full((6, 3), 9)
    compact = arr.zeros((2, 3))
    kv.row_sparse_pull("e", out=[full, compact], row_ids=arr_ids(arr, [3, 1, 3]))
    v = Arrays.np(value)
    want = np.zeros((6, 3), np.float32)
    want[[1, 3]] = v[[1, 3]]
    np.testing.assert_array_equal(Arrays.np(full), want)
    np.testing.assert_array_equal(Arrays.np(compact), v[[1, 3]])


def arr_ids(arr: Arrays, ids: list[int]):
    return arr.from_np(np.asarray(ids, dtype=np.int64))


def test_row_sparse_pull_forms(kv, arr):
    value = arr.rand((5, 2))
    kv.init(["a", "b"], [value, value])
    v = Arrays.np(value)
    got = kv.row_sparse_pull("a", row_ids=[4, 0, 4])
    np.testing.assert_array_equal(Arrays.np(got)[[0, 4]], v[[0, 4]])
    assert not Arrays.np(got)[1:4].any()
    outs = [arr.zeros((5, 2)), arr.zeros((5, 2))]
    kv.row_sparse_pull("a", out=outs, row_ids=[[1], [2.0, 2.0]])  # one set per out, whole floats allowed
    assert Arrays.np(outs[0])[1].tolist() == v[1].tolist() and not Arrays.np(outs[0])[2].any()
    assert Arrays.np(outs[1])[2].tolist() == v[2].tolist()
    both = kv.row_sparse_pull(["a", "b"], row_ids=[[0], [1]])
    assert Arrays.np(both[1])[1].tolist() == v[1].tolist()
    empty = kv.row_sparse_pull("a", out=arr.full((5, 2), 3), row_ids=[])
    assert empty is None


def test_row_sparse_pull_errors(kv, arr):
    kv.init("e", arr.ones((4, 2)))
    kv.init("v", arr.ones((4,)))
    with pytest.raises(ValueError, match=r"row_ids \[7\] out of range for key 'e' with 4 rows") as info:
        kv.row_sparse_pull("e", row_ids=[1, 7])
    assert isinstance(info.value, pskv.InvalidArgumentError)
    with pytest.raises(pskv.InvalidArgumentError, match="out of range"):
        kv.row_sparse_pull("e", row_ids=[-1])
    with pytest.raises(pskv.InvalidArgumentError, match="needs row_ids"):
        kv.row_sparse_pull("e", out=arr.zeros((4, 2)))
    with pytest.raises(pskv.InvalidArgumentError, match=">= 2 dimensions"):
        kv.row_sparse_pull("v", row_ids=[0])
    with pytest.raises(pskv.InvalidArgumentError, match="whole numbers"):
        kv.row_sparse_pull("e", row_ids=np.array([0.5]))
    with pytest.raises(pskv.ShapeMismatchError):
        kv.row_sparse_pull("e", out=arr.zeros((3, 2)), row_ids=[0, 1])
    with pytest.raises(pskv.InvalidArgumentError, match="2 row_ids sets for 3 outs"):
        kv.row_sparse_pull("e", out=[arr.zeros((4, 2))] * 3, row_ids=[[0], [1]])


# -- updater -----------------------------------------------------------------------------------

def test_updater_tutorial_example(kv, arr):
    kv.init(3, arr.zeros(SHAPE))
    kv.push(3, [arr.ones(SHAPE)] * 4)
    seen = []

    def update(key, merged, stored):
        seen.append(key)
        stored += merged * 2

    kv._set_updater(update)
    assert_all(kv.pull(3), 4)
    kv.push(3, arr.ones(SHAPE))
    assert_all(kv.pull(3), 6)
    kv.push(3, [arr.ones(SHAPE)] * 2)  # merged once per push, updater called once
    assert_all(kv.pull(3), 10)
    assert seen == [3, 3]


def test_updater_gets_str_keys(kv, arr):
    seen = []
    kv.init(["w", "v"], [arr.zeros(SHAPE)] * 2)
    kv.set_updater(lambda key, merged, stored: seen.append(key))
    kv.push(["w", "v"], [arr.ones(SHAPE)] * 2)
    assert seen == ["w", "v"]


def test_updater_exception_propagates_and_store_is_unchanged(kv, arr):
    kv.init([1, 2], [arr.ones(SHAPE), arr.ones(SHAPE)])

    def update(key, merged, stored):
        stored += merged  # modifies first...
        if key == 2:
            raise ZeroDivisionError("boom on key 2")  # ...then fails

    kv.set_updater(update)
    with pytest.raises(ZeroDivisionError, match="boom on key 2"):
        kv.push([1, 2], [arr.full(SHAPE, 5), arr.full(SHAPE, 5)])
    assert_all(kv.pull(1), 1)  # the whole call is undone, key 1 included
    assert_all(kv.pull(2), 1)
    with pytest.raises(ZeroDivisionError):
        kv.pushpull(2, arr.ones(SHAPE))
    assert_all(kv.pull(2), 1)
    kv.push(1, arr.ones(SHAPE))  # the store keeps working
    assert_all(kv.pull(1), 2)


def test_set_updater_needs_callable(kv):
    with pytest.raises(pskv.InvalidTypeError, match="callable"):
        kv.set_updater(42)  # type: ignore[arg-type]


# -- cluster methods, properties, capabilities ---------------------------------------------------

def test_single_process_cluster_methods(kv):
    kv.barrier()
    kv._barrier()
    assert kv.send_command_to_servers(0, "anything") is None
    kv._send_command_to_servers(1, "")
    assert kv.num_dead_node(1) == 0
    assert kv.num_dead_node(7, timeout=1) == 0
    with pytest.raises(pskv.InvalidArgumentError, match="node group id"):
        kv.num_dead_node(8)
    kv.set_barrier_before_exit(False)


def test_is_capable(kv):
    assert kv.is_capable(pskv.KVStoreBase.OPTIMIZER) is True
    assert kv.is_capable("Optimizer") is True
    assert type(kv).is_capable("row_sparse_pull") is True
    with pytest.raises(ValueError, match="Unknown capability: 'foo'"):
        kv.is_capable("foo")


# -- close --------------------------------------------------------------------------------------

def test_close_and_context_manager(arr):
    with pskv.create("local") as kv:
        kv.init(1, arr.ones(SHAPE))
        h = kv.push(1, arr.full(SHAPE, 3), block=False)
    assert h.done()  # close finished the queued push
    for call in (lambda: kv.pull(1), lambda: kv.push(1, arr.ones(SHAPE)), lambda: kv.init(2, arr.ones(SHAPE)),
                 lambda: kv.broadcast(1, arr.ones(SHAPE)), lambda: kv.pushpull(1, arr.ones(SHAPE)),
                 lambda: kv.row_sparse_pull(1, row_ids=[0]), lambda: kv.set_updater(print)):
        with pytest.raises(pskv.StoreClosedError, match="closed"):
            call()
    kv.close()  # idempotent
    assert "closed" in repr(kv)
