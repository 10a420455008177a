"""DataParallelExecutorGroup: splitting, every member, and equivalence with one device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.parallel import DataBatch, DataDesc, DataParallelExecutorGroup, Monitor, split_batch  # noqa: E402
from pskv.parallel.metrics import Accuracy  # noqa: E402


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def data(n: int = 12, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, dtype=torch.float64, generator=g), torch.randint(0, 3, (n,), generator=g)


def group(devices=("cpu", "cpu"), n=12, **kw) -> DataParallelExecutorGroup:
    kw.setdefault("loss", torch.nn.CrossEntropyLoss())
    return DataParallelExecutorGroup(make_model(), list(devices), data_shapes=[("data", (n, 6))],
                                     label_shapes=[("label", (n,))], **kw)


# -- splitting ---------------------------------------------------------------------------
@pytest.mark.parametrize(("batch", "workload", "sizes"), [
    (8, [1, 3], [2, 6]),
    (10, [1, 1, 1], [4, 3, 3]),
    (6, [1, 1, 1, 1], [2, 2, 1, 1]),  # MXNet raised "Too many slices" here
    (3, [1, 1, 1, 1], [1, 1, 1, 0]),  # fewer samples than devices: one device idles
    (7, [0, 1], [0, 7]),
    (1, [2, 1], [1, 0]),
])
def test_split_sizes(batch, workload, sizes):
    slices = split_batch(batch, workload)
    assert [s.stop - s.start for s in slices] == sizes
    assert slices[0].start == 0 and slices[-1].stop == batch
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))


@pytest.mark.parametrize("batch", range(1, 40))
def test_split_is_exact_and_close_to_the_shares(batch):
    workload = [0.5, 1.7, 1.0, 3.3]
    sizes = [s.stop - s.start for s in split_batch(batch, workload)]
    assert sum(sizes) == batch
    for size, w in zip(sizes, workload):
        assert abs(size - w * batch / sum(workload)) < 1


def test_bad_workload_and_batch_are_rejected():
    with pytest.raises(pskv.InvalidArgumentError, match="3 weights for 2 devices"):
        DataParallelExecutorGroup(make_model(), ["cpu", "cpu"], workload=[1, 1, 1])
    with pytest.raises(pskv.InvalidArgumentError, match="not all 0"):
        DataParallelExecutorGroup(make_model(), ["cpu"], workload=[0])
    with pytest.raises(pskv.InvalidArgumentError, match="batch size"):
        split_batch(0, [1])


# -- forward / backward / outputs ------------------------------------------------------
@pytest.mark.parametrize("workload", [None, [1, 3], [2, 1]])
def test_outputs_and_gradients_match_one_device_on_the_whole_batch(workload):
    x, y = data()
    one, many = group(["cpu"]), group(["cpu", "cpu"], workload=workload)
    for g in (one, many):
        g.forward(DataBatch(data=[x], label=[y]))
        g.backward()
    torch.testing.assert_close(many.get_outputs()[0], one.get_outputs()[0])
    assert [t.shape[0] for t in many.get_outputs(merge_multi_context=False)[0]] == [
        s.stop - s.start for s in many.slices]
    for name, g_one, g_many in zip(one.param_names, one.grad_arrays, many.grad_arrays):
        torch.testing.assert_close(g_many[0] + g_many[1], g_one[0], msg=name)
    assert many.get_loss() == pytest.approx(one.get_loss())
    one.close(), many.close()


def test_mean_loss_is_turned_into_a_sum_over_the_slice():
    x, y = data()
    mean = group(["cpu"], loss=torch.nn.CrossEntropyLoss())
    total = group(["cpu"], loss=torch.nn.CrossEntropyLoss(reduction="sum"))
    per_sample = group(["cpu"], loss=torch.nn.CrossEntropyLoss(reduction="none"))
    for g in (mean, total, per_sample):
        g.forward((x, y))
        g.backward()
    for a, b, c in zip(mean.grad_arrays, total.grad_arrays, per_sample.grad_arrays):
        torch.testing.assert_close(a[0], b[0])
        torch.testing.assert_close(c[0], b[0])


def test_grad_req_write_add_null_and_fixed_params():
    x, y = data()
    g = group(["cpu"], grad_req={"0.weight": "add", "0.bias": "null"}, fixed_param_names=["2.bias"])
    assert g.grad_req == {"0.weight": "add", "0.bias": "null", "2.weight": "write", "2.bias": "null"}
    assert g.grad_arrays[1] == [None] and g.grad_arrays[3] == [None]
    g.forward((x, y))
    g.backward()
    first_add, first_write = g.grad_arrays[0][0].clone(), g.grad_arrays[2][0].clone()
    g.forward((x, y))
    g.backward()
    torch.testing.assert_close(g.grad_arrays[0][0], 2 * first_add)   # 'add' accumulates
    torch.testing.assert_close(g.grad_arrays[2][0], first_write)     # 'write' overwrites
    with pytest.raises(pskv.InvalidArgumentError, match="grad_req of parameter"):
        group(["cpu"], grad_req="sometimes")
    with pytest.raises(pskv.InvalidArgumentError, match="unknown parameters"):
        group(["cpu"], fixed_param_names=["nope"])


def test_inference_group_and_backward_misuse():
    x, y = data()
    g = group(["cpu", "cpu"], for_training=False)
    assert set(g.grad_req.values()) == {"null"}
    g.forward((x, y))
    with pytest.raises(pskv.InvalidArgumentError, match="for_training"):
        g.backward()
    t = group(["cpu"])
    with pytest.raises(pskv.InvalidArgumentError, match="forward"):
        t.backward()
    t.forward((x, y), is_train=False)
    with pytest.raises(pskv.InvalidArgumentError, match="forward"):
        t.backward()


def test_backward_with_out_grads_and_input_grads():
    x, _ = data()
    one = group(["cpu"], loss=None, inputs_need_grad=True)
    many = group(["cpu", "cpu", "cpu"], loss=None, inputs_need_grad=True)
    head = torch.randn(12, 3, dtype=torch.float64)
    for g in (one, many):
        g.forward(x)
        g.backward(out_grads=[head])
    torch.testing.assert_close(many.get_input_grads()[0], one.get_input_grads()[0])
    assert len(many.get_input_grads(merge_multi_context=False)[0]) == 3
    with pytest.raises(pskv.InvalidArgumentError, match="out_grads"):
        many.forward(x)
        many.backward()
    with pytest.raises(pskv.InvalidArgumentError, match="inputs_need_grad"):
        group(["cpu"]).get_input_grads()


def test_a_bare_numpy_batch_is_data_like_a_bare_tensor():
    # a NumPy array has a ``data`` attribute (a memoryview): it once passed for a DataBatch and was refused
    x, _ = data()
    g = group(["cpu", "cpu"], loss=None, for_training=False)
    g.forward(x)
    want = g.get_outputs()[0].clone()
    g.forward(x.numpy())
    torch.testing.assert_close(torch.as_tensor(g.get_outputs()[0]), want)


def test_batch_of_another_size_resplits_and_wrong_shapes_are_named():
    g = group(["cpu", "cpu", "cpu", "cpu"])
    x, y = data(6)
    g.forward((x, y))  # bound for 12: a batch of 6 still splits over 4 devices
    assert g.batch_size == 6 and [s.stop - s.start for s in g.slices] == [2, 2, 1, 1]
    assert g.get_outputs()[0].shape == (6, 3)
    with pytest.raises(pskv.ShapeMismatchError, match="data"):
        g.forward((torch.zeros(6, 5, dtype=torch.float64), y))
    with pytest.raises(pskv.InvalidArgumentError, match="batch has 2 data arrays"):
        g.forward(([x, x], y))


def test_bind_exec_reshape_output_shapes_and_layouts():
    g = DataParallelExecutorGroup(make_model(), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
    with pytest.raises(pskv.InvalidArgumentError, match="bind"):
        g.forward(data())
    g.bind_exec([DataDesc("data", (10, 6))], [DataDesc("label", (10,))])
    assert g.batch_size == 10 and g.output_shapes == [("output0", (10, 3))]
    with pytest.raises(pskv.InvalidArgumentError, match="already bound"):
        g.bind_exec([("data", (4, 6))])
    g.reshape([("data", (4, 6))], [("label", (4,))])
    assert g.batch_size == 4 and g.output_shapes == [("output0", (4, 3))]
    with pytest.raises(pskv.InvalidArgumentError, match="one batch size"):
        g.reshape([("data", (4, 6))], [("label", (5,))])
    # layout 'TN': the batch axis is 1
    seq = DataParallelExecutorGroup(torch.nn.Identity(), ["cpu", "cpu"], data_shapes=[DataDesc("d", (3, 8), layout="TN")],
                                    for_training=False)
    assert seq.batch_size == 8
    seq.forward(torch.arange(24.0).reshape(3, 8))
    parts = seq.get_outputs(merge_multi_context=False)[0]
    assert [tuple(p.shape) for p in parts] == [(3, 4), (3, 4)]


def test_get_params_averages_and_set_params_copies_everywhere():
    g = DataParallelExecutorGroup(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), ["cpu", "cpu"],
        loss=lambda out, y: ((out - y) ** 2).sum(), data_shapes=[("data", (8, 4))])
    with torch.no_grad():
        g.param_arrays[0][1].add_(2.0)  # replicas drift apart: get_params averages
    arg, aux = g.get_params()
    torch.testing.assert_close(arg["0.weight"], g.param_arrays[0][0].detach() + 1.0)
    assert set(aux) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    target = {"0.weight": np.zeros((4, 4), np.float32)}
    g.get_params(target, {})
    np.testing.assert_allclose(target["0.weight"], arg["0.weight"].numpy(), rtol=1e-6)
    g.set_params({"0.weight": torch.ones(4, 4)}, {"1.running_mean": torch.full((4,), 3.0)})
    for copy in g.param_arrays[0]:
        assert torch.equal(copy.detach(), torch.ones(4, 4))
    for r in g.replicas:
        assert torch.equal(r[1].running_mean, torch.full((4,), 3.0))
    with pytest.raises(pskv.InvalidArgumentError, match="extra"):
        g.set_params({"extra": torch.ones(1)})
    g.set_params({"extra": torch.ones(1)}, allow_extra=True)
    with pytest.raises(pskv.ShapeMismatchError, match="0.weight"):
        g.set_params({"0.weight": torch.ones(3, 4)})


def test_factory_replicas_start_identical_and_shared_group_shares_parameters():
    g = DataParallelExecutorGroup(lambda: make_model(seed=int(torch.randint(0, 1000, ()))), ["cpu", "cpu", "cpu"])
    for copies in g.param_arrays:
        assert all(torch.equal(copies[0], c) for c in copies[1:])
    other = DataParallelExecutorGroup(None, ["cpu", "cpu", "cpu"], shared_group=g, data_shapes=[("data", (2, 6))],
                                      for_training=False)
    assert other.param_arrays[0][1] is g.param_arrays[0][1]
    with pytest.raises(pskv.InvalidArgumentError, match="must match"):
        DataParallelExecutorGroup(None, ["cpu"], shared_group=g)


def test_update_metric_counts_every_device_slice():
    x, y = data(10)
    g = group(["cpu", "cpu", "cpu"], n=10)
    g.forward((x, y))
    metric = Accuracy()
    g.update_metric(metric, [y])
    expected = float((g.get_outputs()[0].argmax(1) == y).double().mean())
    assert metric.get()[1] == pytest.approx(expected)
    assert metric.num_inst == 10


def test_monitor_records_outputs_and_weights_every_interval():
    x, y = data()
    g = group(["cpu", "cpu"])
    mon = Monitor(2, pattern=r"^0")
    g.install_monitor(mon)
    seen = []
    for _ in range(3):
        mon.tic()
        g.forward((x, y))
        seen.append(mon.toc())
    assert [bool(s) for s in seen] == [True, False, True]
    names = {name for _, name, _ in seen[0]}
    assert names == {"dev0:0_output", "dev1:0_output", "dev0:0.weight", "dev1:0.weight", "dev0:0.bias",
                     "dev1:0.bias"}


def test_numpy_batches_work():
    x, y = data()
    g = group(["cpu", "cpu"])
    g.forward((x.numpy(), y.numpy()))
    g.backward()
    assert g.get_outputs()[0].shape == (12, 3)


@pytest.mark.parametrize("device", ["cuda:{beyond}", "nonsense:0"])
def test_a_device_this_machine_lacks_is_a_pskv_error_naming_it(device):
    name = device.format(beyond=torch.cuda.device_count() + 7)
    with pytest.raises(pskv.InvalidArgumentError, match=name.split(":")[0]):
        DataParallelExecutorGroup(torch.nn.Linear(2, 2), ["cpu", name])


# -- time-major layouts: the batch axis of each input, output and label --------------------
class TimeMajor(torch.nn.Module):
    """(T, N, 5) -> (T, N, 3), and the last step's (N, 3) as a second output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(5, 3).double()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lin(torch.tanh(x))
        return out, out[-1]


def time_major_batch(t: int = 4, n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(t, n, 5, dtype=torch.float64, generator=g), torch.randint(0, 3, (t, n), generator=g)


def test_time_major_outputs_shapes_gradients_and_metrics_follow_each_batch_axis():
    x, y = time_major_batch()
    one = TimeMajor()
    whole, last = one(x)
    g = DataParallelExecutorGroup(TimeMajor(), ["cpu", "cpu", "cpu"], output_layouts=["TNC", "NC"],
                                  data_shapes=[DataDesc("data", (4, 7, 5), layout="TNC")],
                                  label_shapes=[DataDesc("label", (4, 7), layout="TN")])
    assert g.output_shapes == [("output0", (4, 7, 3)), ("output1", (7, 3))]
    g.forward((x, y))
    merged = g.get_outputs()
    torch.testing.assert_close(merged[0], whole)
    torch.testing.assert_close(merged[1], last)
    assert [tuple(p.shape) for p in g.get_outputs(merge_multi_context=False)[0]] == [(4, 3, 3), (4, 2, 3), (4, 2, 3)]
    # gradients of time-major out_grads, split along the same axis: their sum is one device's
    og = torch.randn(4, 7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    g.backward([og])
    whole.backward(og)
    for name, grads in zip(g.param_names, g.grad_arrays):
        torch.testing.assert_close(sum(grads), dict(one.named_parameters())[name].grad)
    # the metric sees each device's labels (T, n) beside its outputs (T, n, 3)
    seen = []

    class Record:
        def update(self, labels, preds):
            seen.append((labels[0], preds[0]))
    g.update_metric(Record(), [y])
    assert [(tuple(lab.shape), tuple(pred.shape)) for lab, pred in seen] == [((4, 3), (4, 3, 3)), ((4, 2), (4, 2, 3)),
                                                                            ((4, 2), (4, 2, 3))]
    assert torch.equal(torch.cat([lab for lab, _ in seen], dim=1), y)
    torch.testing.assert_close(torch.cat([pred for _, pred in seen], dim=1), whole.detach())
    with pytest.raises(pskv.InvalidArgumentError, match="label 0 of shape \\(7, 4\\)"):
        g.update_metric(Accuracy(axis=2), [y.T])


def test_outputs_default_to_the_data_batch_axis_and_a_wrong_output_layout_is_named():
    x, _ = time_major_batch()
    g = DataParallelExecutorGroup(TimeMajor(), ["cpu", "cpu"], for_training=False,
                                  data_shapes=[DataDesc("data", (4, 7, 5), layout="TNC")])
    # output0 holds the samples on the data's batch axis 1, output1 (the last step) on axis 0
    assert g.output_shapes == [("output0", (4, 7, 3)), ("output1", (7, 3))]
    g.forward(x)
    assert [tuple(o.shape) for o in g.get_outputs()] == [(4, 7, 3), (7, 3)]
    odd = DataParallelExecutorGroup(torch.nn.Flatten(0, -1), ["cpu", "cpu"], for_training=False,
                                    data_shapes=[DataDesc("data", (4, 6, 7), layout="TNC")])
    with pytest.raises(pskv.InvalidArgumentError, match="output 0 of shape \\(84,\\) holds the 3 samples"):
        odd.output_shapes  # noqa: B018 - a property that runs the replica
    bad = DataParallelExecutorGroup(TimeMajor(), ["cpu", "cpu"], for_training=False, output_layouts=["NC"],
                                    data_shapes=[DataDesc("data", (4, 7, 5), layout="TNC")])
    bad.forward(x)
    with pytest.raises(pskv.InvalidArgumentError, match="output 0 has 3 dimension\\(s\\), its layout 'NC'"):
        bad.get_outputs()
    with pytest.raises(pskv.InvalidTypeError, match="output_layouts"):
        DataParallelExecutorGroup(TimeMajor(), ["cpu"], output_layouts="TNC")
    wrong_axis = DataParallelExecutorGroup(TimeMajor(), ["cpu", "cpu"], for_training=False, output_layouts=["NTC"],
                                           data_shapes=[DataDesc("data", (4, 7, 5), layout="TNC")])
    wrong_axis.forward(x)
    with pytest.raises(pskv.InvalidArgumentError, match="its batch axis 0 \\(layout 'NTC'\\) holds 4, not the 3 "):
        wrong_axis.get_outputs()


def test_out_grads_of_another_shape_are_a_pskv_error():
    x, y = time_major_batch()
    g = DataParallelExecutorGroup(TimeMajor(), ["cpu", "cpu"], data_shapes=[DataDesc("data", (4, 7, 5), layout="TNC")])
    g.forward(x)
    with pytest.raises(pskv.InvalidArgumentError, match="holds the 7 samples of its batch slice on none"):
        g.backward([torch.ones(4, 6, 3, dtype=torch.float64)])  # a batch of 6, not 7
    with pytest.raises(pskv.InvalidArgumentError, match="out_grads\\[0\\] gives device 0 a slice of shape "
                                                       "\\(4, 4, 2\\) for its output 0 of shape \\(4, 4, 3\\)"):
        g.backward([torch.ones(4, 7, 2, dtype=torch.float64)])
