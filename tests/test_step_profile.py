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
