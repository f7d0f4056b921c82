"""The trainer's speed paths: every device-specific branch runs here on CPU where it can and is
skipped with a reason where it cannot; plus a smoke run of benchmarks/throughput.py."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from src.data.augment import flip_crop
from src.data.loader import Loader
from src.device_setup import autocast_for, setup_device, use_channels_last
from src.loop import train_step
from src.models.cnn import WidthCNN
from src.models.layers import Dropout, dropout_keep
from src.models.lean import LeanBlock
from src.models.vit import ViT
from src.optim import build_optimizer
from src.trainer import train
from tests.conftest import TINY, compose_cfg

ROOT = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU on this machine)")
ADAMW = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.05}


# --------------------------------------------------------------------------- batch augmentation
def test_flip_crop_is_a_padded_crop_of_the_image_or_its_mirror():
    x = torch.randn(64, 3, 8, 8)
    out = flip_crop(x, torch.Generator().manual_seed(0), pad=2)
    xp = F.pad(x, (2, 2, 2, 2))
    flips, offsets = 0, set()
    for b in range(len(x)):
        found = [(f, dy, dx) for f in (0, 1) for dy in range(5) for dx in range(5)
                 if torch.equal(out[b], (xp[b].flip(-1) if f else xp[b])[:, dy:dy + 8, dx:dx + 8])]
        assert found, f"image {b} is no crop of the padded image or its mirror"
        flips += found[0][0]
        offsets.add(found[0][1:])
    assert 16 <= flips <= 48  # about half are mirrored
    assert len(offsets) >= 15  # offsets spread over the 25 possible


# --------------------------------------------------------------------------- fast CPU dropout
def test_dropout_keep_rate_and_scale():
    torch.manual_seed(0)
    x = torch.ones(1_000_000, requires_grad=True)
    drop = Dropout(0.2).train()
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.003
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1.25))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # gradient = mask / (1 - p)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_every_16_bit_lane_of_a_draw_keeps_at_the_rate(p):
    """Each 64-bit draw gives the masks of four neighbouring elements; every lane must keep 1 - p of them (the
    top lane of ``random_()``'s int64 draws, in [0, 2**63), holds 15 random bits only)."""
    torch.manual_seed(0)
    lanes = dropout_keep(torch.empty(4 * 400_000), p).view(-1, 4).float().mean(0)
    assert torch.allclose(lanes, torch.full((4,), 1 - p), atol=0.004), lanes


def test_dropout_mask_product_is_the_float_masks():
    """The mask is read as uint8 in the product (a vectorized conversion): the same values as the float mask's."""
    from src.models.layers import keep_scaled

    x = torch.randn(3, 7, 65, dtype=torch.bfloat16)
    keep = dropout_keep(x, 0.3)
    assert torch.equal(keep_scaled(x, keep, 1 / 0.7), x * keep.to(x.dtype) * (1 / 0.7))


def test_dropout_is_seeded_identity_in_eval_and_keeps_dtype():
    x = torch.randn(4096)
    torch.manual_seed(1)
    a = dropout_keep(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(a, dropout_keep(x, 0.5))
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert Dropout(0.5).train()(x.bfloat16()).dtype == torch.bfloat16
    assert torch.equal(Dropout(0.0).train()(x), x)


@needs_cuda
def test_dropout_on_cuda_is_torchs():
    torch.manual_seed(0)
    x = torch.ones(100_000, device="cuda")
    y = Dropout(0.2).train()(x)
    assert abs((y != 0).float().mean().item() - 0.8) < 0.01


def test_cpu_training_attention_path_agrees_with_sdpa(monkeypatch):
    """CPU training with dropout on the explicit path takes the lean block's attention; with every element kept it
    equals SDPA's attention scaled by 1/(1-p) (dropout's scale on the weights and on the projection output)."""
    torch.manual_seed(0)
    p, B, T, D, H = 0.1, 3, 9, 32, 4
    block = LeanBlock(dim=D, heads=H, mlp_dim=2 * D, dropout=p, attention="explicit").train()
    qkv = torch.randn(B, T, 3 * D, requires_grad=True)
    for module in ("src.models.layers", "src.models.lean"):
        monkeypatch.setattr(f"{module}.dropout_keep", lambda t, p: torch.ones_like(t, dtype=torch.bool))
    explicit = block._attention(qkv)
    q, k, v = block.attn.split_heads(qkv)
    ref = F.scaled_dot_product_attention(q, k, v) / (1 - p)
    ref = block.attn.proj(ref.transpose(1, 2).reshape(B, T, D)) / (1 - p)
    assert torch.allclose(explicit, ref, atol=1e-5) and explicit.requires_grad


# --------------------------------------------------------------------------- device settings
def test_channels_last_auto_for_conv_models_only():
    cpu = torch.device("cpu")
    cnn, vit = WidthCNN(16, 3, 10, width=2), ViT(16, 3, 10, dim=16, depth=1, heads=2, mlp_dim=16)
    assert use_channels_last(cnn, cpu) and not use_channels_last(vit, cpu)
    assert use_channels_last(vit, cpu, True) and not use_channels_last(cnn, cpu, False)
    loader = Loader(torch.zeros(8, 3, 16, 16, dtype=torch.uint8), torch.zeros(8, dtype=torch.long), 4, cpu,
                    mean=[0.5] * 3, std=[0.25] * 3, augment="flip_crop", channels_last=True)
    xb, _ = next(iter(loader))
    assert xb.is_contiguous(memory_format=torch.channels_last) and xb.dtype == torch.float32


def test_autocast_per_precision():
    cpu = torch.device("cpu")
    assert isinstance(autocast_for(cpu, "fp32"), contextlib.nullcontext)
    with autocast_for(cpu, "bf16"):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16


@pytest.mark.parametrize("precision,grad_clip", [("fp32", None), ("fp32", 0.5), ("bf16", None)])
def test_train_step_updates_and_returns_a_detached_loss(precision, grad_clip):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = WidthCNN(8, 3, 4, width=2)
    opt = build_optimizer(model, ADAMW, cpu)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss = train_step(model, opt, scaler, autocast_for(cpu, precision), torch.randn(6, 3, 8, 8),
                      torch.randint(0, 4, (6,)), grad_clip=grad_clip)
    assert not loss.requires_grad and loss.dim() == 0 and torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@needs_cuda
def test_fp16_step_with_scaler_on_cuda():
    dev = torch.device("cuda")
    model = WidthCNN(8, 3, 4, width=2).to(dev)
    opt = build_optimizer(model, ADAMW, dev)
    loss = train_step(model, opt, torch.amp.GradScaler("cuda"), autocast_for(dev, "fp16"),
                      torch.randn(6, 3, 8, 8, device=dev), torch.randint(0, 4, (6,), device=dev), grad_clip=1.0)
    assert torch.isfinite(loss)


def test_adamw_is_not_fused_on_cpu():
    opt = build_optimizer(WidthCNN(8, 3, 4, width=2), ADAMW, torch.device("cpu"))
    assert not opt.defaults.get("fused")


@needs_cuda
def test_adamw_is_fused_on_cuda():
    opt = build_optimizer(WidthCNN(8, 3, 4, width=2).cuda(), ADAMW, torch.device("cuda"))
    assert opt.defaults.get("fused")


def test_setup_device_sets_threads_on_cpu():
    before = torch.get_num_threads()
    try:
        setup_device(torch.device("cpu"), {"num_threads": 1})
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@needs_cuda
def test_setup_device_enables_tf32_and_cudnn_benchmark():
    setup_device(torch.device("cuda"), {})
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.benchmark


# --------------------------------------------------------------------------- torch.compile
def test_compile_does_not_recompile_per_epoch(tiny_cfg, tmp_path, monkeypatch):
    """Graphs compiled in epoch 1 (train shape, eval modes and the last partial eval batch) serve
    every later epoch. A counting backend stands in for inductor: dynamo's guards are the same."""
    import torch._dynamo

    real_compile, graphs = torch.compile, []

    def counting(gm, example_inputs):
        graphs.append(tuple(t.shape for t in example_inputs if isinstance(t, torch.Tensor)))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=counting))
    counts = []
    for epochs in (1, 3):
        torch._dynamo.reset()
        graphs.clear()
        train(tiny_cfg("trainer.compile=true", f"trainer.max_epochs={epochs}", "dataset.n_train=120",
                       "trainer.batch_size=32", "trainer.eval_batch_size=64"), tmp_path / f"e{epochs}")
        counts.append(len(graphs))
    assert counts[0] >= 1 and counts[1] == counts[0], counts


def test_compiled_runs_in_one_process_keep_compiling(tiny_cfg, tmp_path, monkeypatch):
    """A sweep's runs in one process (Hydra's basic launcher) each compile their own graphs instead
    of hitting dynamo's recompile limit and silently running eager."""
    import torch._dynamo

    real_compile, graphs = torch.compile, []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(
        model, backend=lambda gm, ex: graphs.append(1) or gm.forward))
    per_run = []
    # dynamo's own patch: monkeypatch's undo deleted the config entry (recompile_limit "does not exist" for every
    # later compile in the process: the slow test below failed after this one)
    with torch._dynamo.config.patch(recompile_limit=2):
        for dim in (16, 24, 32):
            before = len(graphs)
            train(tiny_cfg("trainer.compile=true", f"model.dim={dim}", "dataset.n_train=100"), tmp_path / str(dim))
            per_run.append(len(graphs) - before)
    assert min(per_run) >= 1, per_run


@pytest.mark.slow  # three real inductor compiles: about a minute on 2 cores, too much for the default suite
def test_a_compiled_run_with_dropout_resumes_bitwise(tiny_cfg, tmp_path):
    """Inductor draws dropout's masks in its own kernels, from seeds it takes from torch's generator at each call of
    the compiled graph; a checkpoint keeps that generator, so a compiled run that crashed resumes to the same rows as
    one never stopped (real inductor, the ViT with dropout in bf16: a fused kernel's rounding is its own)."""
    from tests.test_resume import failing_reporter, rows_of, untimed

    over = ["trainer.compile=true", "trainer.checkpoint=true", "trainer.max_epochs=3", "trainer.precision=bf16",
            "model.dropout=0.2", "model.attention=explicit", "dataset.augment=flip_crop", "scheduler=constant",
            "dataset.n_train=100"]
    ref = train(tiny_cfg(*over), tmp_path / "ref")
    with pytest.raises(RuntimeError, match="worker lost"):
        train(tiny_cfg(*over), tmp_path / "run", reporter=failing_reporter(2))
    resumed = train(tiny_cfg(*over), tmp_path / "run")
    assert untimed(rows_of(tmp_path / "run")) == untimed(rows_of(tmp_path / "ref"))
    assert resumed["train_loss"] == ref["train_loss"] and resumed["test_error"] == ref["test_error"]


def test_inductor_fx_graph_cache_is_on():
    """Runs of one sweep with matching shapes reuse compiled kernels across processes (README)."""
    from torch._inductor import config

    assert config.fx_graph_cache


# --------------------------------------------------------------------------- benchmark smoke
@pytest.fixture
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
        yield throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


TINY_BENCH = ["--dim", "32", "--depth", "1", "--heads", "2", "--mlp-dim", "64", "--batch", "16",
              "--synthetic-n", "64", "--workers", "0", "--device", "cpu"]


def test_benchmark_runs_both_paths(bench, capsys):
    r = bench.main([*TINY_BENCH, "--steps", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    assert r["ratio"] > 0 and "speed-up vitsweep / baseline" in out and "FLOPs per image" in out
    assert "matmul peak: fp32" in out and "data wait" in out and "peak RSS" in out


def test_benchmark_cnn_and_check_and_scaling_modes(bench, capsys):
    assert bench.main(["--model", "cnn", "--width", "2", "--batch", "16", "--synthetic-n", "64",
                       "--workers", "0", "--steps", "1", "--warmup", "1"])["ratio"] > 0
    r = bench.main([*TINY_BENCH, "--check", "--check-steps", "6"])
    assert set(r) == {"fp32", "bf16", "rel"} and r["rel"] < 0.1
    r = bench.main(["--model", "cnn", "--width", "2", "--batch", "16", "--scaling", "--sizes", "32,64,96"])
    assert len(r["rows"]) == 3 and "R^2" in capsys.readouterr().out


def test_eval_share_benchmark_prints_the_shares(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import eval_share
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = eval_share.main(["--widths", "1", "--precisions", "fp32", "--epochs", "1", "--n-test", "256",
                            "--run-epochs", "10", "--test-every", "5"])
    out = capsys.readouterr().out
    assert "CPU:" in out and "share before" in out and len(rows) == 1
    assert "256 test images" in out  # the header said 10,000 whatever --n-test scored
    wall = rows[0]["wall"]
    assert all(0 < wall[k] < 1 for k in ("before", "batch", "after", "final"))
    assert wall["final"] <= wall["after"] <= wall["batch"]  # fewer test scorings, smaller share
    # the share arithmetic: 10 epochs, the test split scored twice (epochs 5 and 10) at batch 1024
    m = {"train_epoch": (4.0, 0), "train@256": (2.0, 0), "train@1024": (1.0, 0), "test@256": (3.0, 0),
         "test@1024": (2.0, 0)}
    s = eval_share.shares(m, 10, 5, 0)
    assert s["before"] == pytest.approx(50 / 90) and s["after"] == pytest.approx(14 / 54)
    assert s["final"] == pytest.approx(12 / 52)


# --------------------------------------------------------------------------- attention paths (model.attention)
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 3e-2)])
@pytest.mark.parametrize("lean", [True, False])
def test_attention_paths_agree_forward_and_backward(precision, tol, lean):
    """sdpa, math and explicit give the same loss and gradients (within bf16's precision under autocast), on
    the lean CPU training block and the plain one."""
    torch.manual_seed(0)
    model = ViT(16, 3, 10, patch=4, dim=32, depth=2, heads=4, mlp_dim=64, dropout=0.0, lean=lean).train()
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    results = {}
    for path in ("sdpa", "math", "explicit"):
        model.set_attention_path(path)
        assert model.attention_path() == path
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(model(x).float(), y)
        results[path] = (loss.detach(), torch.autograd.grad(loss, list(model.parameters())))
    ref_loss, ref_grads = results["sdpa"]
    for path in ("math", "explicit"):
        loss, grads = results[path]
        assert torch.allclose(loss, ref_loss, atol=tol, rtol=tol), (path, loss, ref_loss)
        for a, b in zip(grads, ref_grads, strict=True):
            scale = b.abs().max().clamp_min(1e-6)
            assert (a - b).abs().max() <= tol * scale * 4, path


def test_explicit_evaluation_under_bf16_takes_the_softmax_in_bf16_and_agrees_with_sdpa():
    """The explicit path's evaluation under bf16 autocast runs softmax on the bf16 scores, as the lean training path
    does, not on an fp32 copy of the (B, heads, T, T) matrix (that copy and its conversion back made bf16 evaluation
    of the double-descent ViT 3x slower per image than its training forward); the maps (return_attn) stay fp32."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class SoftmaxDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten._softmax, torch.ops.aten.softmax):
                self.seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = ViT(16, 3, 10, patch=4, dim=32, depth=2, heads=4, mlp_dim=64, dropout=0.0).eval()
    x = torch.randn(6, 3, 16, 16)
    out = {}
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        for path in ("sdpa", "explicit"):
            model.set_attention_path(path)
            with SoftmaxDtypes() as mode:
                out[path] = model(x).float()
            if path == "explicit":
                assert mode.seen and set(mode.seen) == {torch.bfloat16}
        _, attn = model.blocks[0].attn(model.blocks[0].norm1(torch.randn(2, 17, 32)), return_attn=True)
    assert attn.dtype == torch.float32
    assert torch.allclose(out["explicit"], out["sdpa"], atol=3e-2, rtol=3e-2)


def test_attention_auto_takes_the_measured_fastest_and_keeps_sdpa_on_near_ties(monkeypatch):
    from src.models import attention_probe

    model = ViT(16, 3, 10, patch=4, dim=32, depth=2, heads=4, mlp_dim=64)
    assert model.attention == "auto" and model.attention_path() == "sdpa"  # until the set-up resolves it
    for timings, expected in (({"sdpa": 2.0, "math": 1.5, "explicit": 1.0}, "explicit"),
                              ({"sdpa": 1.0, "math": 0.99, "explicit": 0.98}, "sdpa"),  # within the margin
                              ({"sdpa": 1.0, "math": 0.5, "explicit": 0.9}, "math")):
        seen = iter(timings.values())
        monkeypatch.setattr(attention_probe, "block_seconds", lambda block, x, autocast, seen=seen: next(seen))
        path, seconds, reason = attention_probe.choose_attention(model, 8, contextlib.nullcontext(), False)
        assert path == expected and seconds == timings and "explicit" in reason
    # too long a sequence for the T x T matrices: only sdpa is tried
    monkeypatch.setattr(attention_probe, "MATRIX_BUDGET_BYTES", 0)
    monkeypatch.setattr(attention_probe, "block_seconds", lambda block, x, autocast: 1.0)
    path, seconds, reason = attention_probe.choose_attention(model, 8, contextlib.nullcontext(), False)
    assert path == "sdpa" and list(seconds) == ["sdpa"] and "not tried" in reason


def test_attention_auto_is_recorded_and_a_resumed_run_keeps_its_path():
    """The set-up resolves auto, the summary names the path and why, the probe leaves the random state as it
    was, and a checkpoint's path wins over a new probe's."""
    from src.run_setup import setup

    cfg = compose_cfg([o for o in TINY if o != "model.attention=sdpa"])
    torch.manual_seed(123)
    before = torch.get_rng_state()
    state = setup(cfg, run_dir=None)
    assert state.info["attention"] in ("sdpa", "math", "explicit")
    assert set(state.info["attention_probe_s"]) == {"sdpa", "math", "explicit"}
    assert "forward + backward" in state.info["attention_reason"]
    saved = state.state_dict()
    other = "math" if state.info["attention"] != "math" else "explicit"
    saved["attention"] = other
    fresh = setup(cfg, run_dir=None)
    fresh.load_state_dict(saved)
    assert fresh.info["attention"] == other and fresh.model.attention_path() == other
    torch.manual_seed(123)
    assert torch.equal(torch.get_rng_state(), before)
    pinned = setup(compose_cfg(TINY), run_dir=None)
    assert pinned.info["attention"] == "sdpa" and "attention_probe_s" not in pinned.info


def test_an_unknown_attention_path_names_the_choices():
    with pytest.raises(ValueError, match=r"model.attention='flash2' is not one of \('auto', 'sdpa', 'math'"):
        ViT(16, 3, 10, patch=4, dim=32, depth=1, heads=4, mlp_dim=64, attention="flash2")
