"""The step profile's grouping and its ceiling line (benchmarks/step_profile.py), which issue 29's figures cite."""
import pytest

from benchmarks.step_profile import GROUPS, flop_op_ceiling, group_of


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


def test_the_ceiling_counts_only_the_matmul_and_attention_time():
    groups = dict.fromkeys(GROUPS, 0.0)
    groups.update({"matmul": 300_000.0, "attention": 100_000.0, "elementwise and norm": 900_000.0})  # us over 2 steps
    c = flop_op_ceiling(flops_per_image=1e9, batch=100, groups=groups, steps=2, peak_gflops=1000.0)
    assert c["ms_per_step"] == pytest.approx(200.0)       # (300 + 100) ms over 2 steps; element-wise time ignored
    assert c["images_per_s"] == pytest.approx(500.0)      # 100 images in 0.2 s
    assert c["gflops"] == pytest.approx(500.0)            # 1 GFLOP an image
    assert c["share_of_peak"] == pytest.approx(0.5)
