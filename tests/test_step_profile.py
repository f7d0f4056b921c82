"""The step profile's grouping and its ceiling line (benchmarks/step_profile.py), which issue 29's figures cite."""
import pytest

from benchmarks.step_profile import flop_op_ceiling, group_of


@pytest.mark.parametrize("name, scopes, group", [
    ("aten::mm", (), "matmul"),
    ("aten::bmm", (), "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", (), "attention"),
    ("aten::_softmax", (), "attention"),
    ("aten::copy_", (), "elementwise and norm"),
    ("aten::native_layer_norm_backward", (), "elementwise and norm"),
    ("aten::mul_", ("Optimizer.step#AdamW.step",), "optimizer"),  # the scope wins over the name
    ("aten::index", ("data",), "data"),
    ("## Call CompiledFxGraph abc", (), "other"),
])
def test_an_op_is_grouped_by_its_scope_then_its_name(name, scopes, group):
    assert group_of(name, scopes) == group


def test_the_ceiling_counts_only_the_ops_that_do_flops():
    """Matmuls and fused SDPA kernels count; the explicit path's softmax (grouped as attention) and element-wise ops
    do not."""
    per_op = {("aten::mm", "matmul"): [50, 250_000.0],
              ("aten::bmm", "matmul"): [36, 50_000.0],
              ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"): [6, 100_000.0],
              ("aten::_softmax", "attention"): [6, 80_000.0],
              ("aten::copy_", "elementwise and norm"): [404, 900_000.0]}  # microseconds over 2 steps
    c = flop_op_ceiling(flops_per_image=1e9, batch=100, per_op=per_op, steps=2, peak_gflops=1000.0)
    assert c["ms_per_step"] == pytest.approx(200.0)       # (250 + 50 + 100) ms over 2 steps
    assert c["images_per_s"] == pytest.approx(500.0)      # 100 images in 0.2 s
    assert c["gflops"] == pytest.approx(500.0)            # 1 GFLOP an image
    assert c["share_of_peak"] == pytest.approx(0.5)


def _event(name, us, device="cpu", kernels=(), parent=None, annotation=False):
    """A profiler event as torch builds them from a CUDA trace: a CPU op holds its kernels' durations, and each
    kernel (or a record_function's span on the GPU) is an event of its own."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    e = FunctionEvent(id=0, name=name, thread=0, start_us=0, end_us=us, use_device="cuda",
                      device_type=DeviceType.CPU if device == "cpu" else DeviceType.CUDA,
                      is_user_annotation=annotation)
    for k_name, k_us in kernels:
        e.append_kernel(k_name, 0, k_us)
    if parent is not None:
        e.set_cpu_parent(parent)
        parent.append_cpu_child(e)
    return e


def test_cuda_device_time_is_counted_once_per_kernel():
    """On CUDA the profiler lists each kernel twice: inside its launching op's self device time and as an event of its
    own. The H200 profile (docs/benchmarks/profile/cnn_cuda_width64.md) showed it: `aten::avg_pool2d_backward` and its
    kernel each 0.26 ms/step, 13.5% each, and a self device time of twice the kernels'. Here 470 us of kernels: 300 of a
    matmul, 100 of the optimizer, 50 of an add, 20 of a kernel no op launched; the GPU spans of record_function scopes
    are not kernels."""
    import torch

    from benchmarks.step_profile import tally

    step = _event("Optimizer.step#AdamW.step", 400)
    events = [
        _event("aten::mm", 350, kernels=[("sm90_xmma_gemm_bf16", 300.0)]),
        _event("sm90_xmma_gemm_bf16", 300, device="cuda"),
        step,
        _event("aten::_fused_adamw_", 150, kernels=[("multi_tensor_apply_kernel", 100.0)], parent=step),
        _event("multi_tensor_apply_kernel", 100, device="cuda"),
        _event("aten::add", 60, kernels=[("vectorized_elementwise_kernel", 50.0)]),
        _event("vectorized_elementwise_kernel", 50, device="cuda"),
        _event("cudaLaunchKernel", 5),  # the runtime call: host time only
        _event("ncclKernel_unlinked", 20, device="cuda"),
        _event("data", 500, device="cuda", annotation=True),
        _event("Optimizer.step#AdamW.step", 400, device="cuda", annotation=True),
    ]
    per_op, groups, total = tally(events, torch.device("cuda"))
    assert total == pytest.approx(470.0)
    assert groups["matmul"] == pytest.approx(300.0) and groups["optimizer"] == pytest.approx(100.0)
    assert groups["elementwise and norm"] == pytest.approx(50.0) and groups["other"] == pytest.approx(20.0)
    assert per_op["aten::mm", "matmul"] == [1, 300.0]
    assert sum(t for _, t in per_op.values()) == pytest.approx(total)


def test_cpu_self_time_is_each_ops_own():
    import torch

    from benchmarks.step_profile import tally

    def cpu(name, us, parent=None):
        from torch.autograd import DeviceType
        from torch.autograd.profiler_util import FunctionEvent

        e = FunctionEvent(id=0, name=name, thread=0, start_us=0, end_us=us, device_type=DeviceType.CPU)
        if parent is not None:
            e.set_cpu_parent(parent)
            parent.append_cpu_child(e)
        return e

    linear = cpu("aten::linear", 100)
    addmm = cpu("aten::addmm", 80, parent=linear)
    data = cpu("data", 30)
    index = cpu("aten::index", 20, parent=data)
    per_op, groups, total = tally([linear, addmm, data, index], torch.device("cpu"))
    assert total == pytest.approx(120.0)  # linear's own 20, addmm 80, index 20; the data scope's own time is not an op
    assert groups["matmul"] == pytest.approx(100.0) and groups["data"] == pytest.approx(20.0)


def test_the_peaks_are_measured_under_the_runs_device_settings(monkeypatch):
    """throughput.py measures the matmul peak after the trainer's device settings (TF32 on CUDA); step_profile.py
    measured it before them, so its CUDA "fp32 peak" was plain fp32 (50.9 TFLOP/s on the H200, quoted as TF32) while
    throughput.py's was TF32 (361 TFLOP/s on an H200): the two scripts' "% of the fp32 peak" had other denominators."""
    from benchmarks import step_profile

    order = []

    class Stop(Exception):
        pass

    def peak(device, dtype):
        order.append("matmul_peak")
        raise Stop

    monkeypatch.setattr(step_profile, "setup_device", lambda device, t: order.append("setup_device"))
    monkeypatch.setattr(step_profile, "matmul_peak", peak)
    with pytest.raises(Stop):
        step_profile.report(step_profile.parse_args(["--model", "cnn", "--width", "1", "--device", "cpu"]))
    assert order == ["setup_device", "matmul_peak"]
