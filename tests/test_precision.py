"""``trainer.precision=auto`` on a CPU with native bf16: it times the model in fp32 and bf16 and takes
the faster, without changing the run it chooses for, and a resumed run keeps the precision it started with."""
from __future__ import annotations

import contextlib

import pytest
import torch

import src.device_setup as device_setup
import src.run_setup as run_setup
from src.run_setup import measure_precision, setup

CNN = ["model=cnn", "model.width=2", "optimizer=sgd", "scheduler=constant", "dataset.n_train=64",
       "trainer.batch_size=32"]


def fake_timing(fp32_s: float, bf16_s: float):
    """A ``step_seconds`` that reports fixed times per precision (fp32 runs under a nullcontext)."""
    def step_seconds(model, xb, yb, autocast):
        model(xb).sum().backward()  # touch the model as the real probe does
        return fp32_s if isinstance(autocast, contextlib.nullcontext) else bf16_s
    return step_seconds


@pytest.fixture(autouse=True)
def fresh_probe_cache(monkeypatch, tmp_path):
    """Each test measures on its own "machine": an empty probe cache (src.probe_cache)."""
    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This CPU as one with native bf16, whatever it is (``auto`` then probes)."""
    monkeypatch.setattr(run_setup, "resolve_precision", lambda name, device: "bf16" if name == "auto" else name)


@pytest.mark.parametrize("fp32_s,bf16_s,chosen", [(2.0, 1.0, "bf16"), (1.0, 2.0, "fp32"), (1.05, 1.0, "fp32")])
def test_auto_takes_the_faster_precision_with_fp32_on_near_ties(tiny_cfg, bf16_cpu, monkeypatch, fp32_s, bf16_s,
                                                                chosen):
    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(fp32_s, bf16_s))
    state = setup(tiny_cfg(*CNN, "trainer.precision=auto"), None)
    assert state.info["precision"] == chosen
    assert state.info["precision_probe_s"] == {"fp32": fp32_s, "bf16": bf16_s}
    assert isinstance(state.autocast, contextlib.nullcontext) == (chosen == "fp32")


def test_the_probe_leaves_the_run_as_it_would_be_without_it(tiny_cfg, bf16_cpu, monkeypatch):
    """Same initial weights, same global random state after setup (dropout draws from it) as a run set to the
    precision the probe chose."""
    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(1.0, 2.0))
    probed = setup(tiny_cfg("model.dropout=0.2", "trainer.precision=auto"), None)  # the probe's passes draw dropout
    after_probe = torch.get_rng_state()
    plain = setup(tiny_cfg("model.dropout=0.2", "trainer.precision=fp32"), None)
    assert torch.equal(after_probe, torch.get_rng_state())
    for a, b in zip(probed.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert "precision_probe_s" not in plain.info


def test_a_resumed_run_keeps_the_precision_auto_chose_at_its_start(tiny_cfg, bf16_cpu, monkeypatch):
    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(2.0, 1.0))
    first = setup(tiny_cfg(*CNN, "trainer.precision=auto"), None)
    saved = first.state_dict()
    assert saved["precision"] == "bf16"
    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(1.0, 2.0))  # the machine now favours fp32
    monkeypatch.setenv("VITSWEEP_PROBE_CACHE", "off")  # and measures again
    again = setup(tiny_cfg(*CNN, "trainer.precision=auto"), None)
    assert again.info["precision"] == "fp32"
    again.load_state_dict(saved)
    assert again.info["precision"] == "bf16" and not isinstance(again.autocast, contextlib.nullcontext)


def test_the_real_probe_times_both_and_leaves_the_model_untouched():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    before = [p.detach().clone() for p in model.parameters()]
    chosen, seconds = measure_precision(model, (3, 8, 8), 10, 16)
    assert chosen in ("fp32", "bf16") and set(seconds) == {"fp32", "bf16"}
    assert all(s > 0 for s in seconds.values())
    assert all(p.grad is None for p in model.parameters())
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_auto_times_each_precision_with_the_attention_path_auto_picks_for_it(tiny_cfg, bf16_cpu, monkeypatch):
    """With ``model.attention=auto`` the two choices are made together: each precision is timed with the
    attention path that precision's own probe picks. Measured on an AVX512-BF16 EPYC (the double-descent ViT,
    dim 32, 4 heads of 8, 65 tokens, one thread): bf16 with sdpa was 2x slower than fp32, so ``auto`` kept
    fp32, while bf16 with the explicit path was 1.7x faster than fp32 (docs/benchmarks/README.md)."""
    import src.models.attention_probe as probe

    def choose(model, batch, autocast, bf16):  # the CPU flash kernel is slow in bf16 at this shape
        return ("explicit", {}, "fake") if bf16 else ("sdpa", {}, "fake")

    def step_seconds(model, xb, yb, autocast):
        bf16, path = not isinstance(autocast, contextlib.nullcontext), model.attention_path()
        return {(False, "sdpa"): 1.0, (True, "sdpa"): 2.0, (True, "explicit"): 0.5}.get((bf16, path), 9.0)

    monkeypatch.setattr(probe, "choose_attention", choose)
    monkeypatch.setattr(run_setup, "step_seconds", step_seconds)
    state = setup(tiny_cfg("model.attention=auto", "trainer.precision=auto"), None)
    assert state.info["precision"] == "bf16"
    assert state.info["precision_probe_s"] == {"fp32": 1.0, "bf16": 0.5}
    assert state.info["attention"] == "explicit" and state.model.attention_path() == "explicit"
    assert state.info["precision_probe_attention"] == {"fp32": "sdpa", "bf16": "explicit"}


def test_later_runs_of_one_shape_on_this_machine_take_the_first_measurement(tiny_cfg, bf16_cpu, monkeypatch,
                                                                             tmp_path):
    """Two runs of one config, minutes apart, timed close options the other way round and trained different numbers
    (the tune_vit rerun: sdpa 74.9 against explicit 78.8 ms, then explicit 68.4 against sdpa 83.3 ms). The first
    run's measurement is kept per machine and shape; another shape, or VITSWEEP_PROBE_CACHE=off, measures."""
    import src.models.attention_probe as probe

    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(2.0, 1.0))
    monkeypatch.setattr(probe, "choose_attention", lambda model, batch, autocast, bf16: ("explicit", {}, "fake"))
    first = setup(tiny_cfg("model.attention=auto", "trainer.precision=auto"), None)
    assert (first.info["precision"], first.info["attention"]) == ("bf16", "explicit")
    assert "precision_probe_cached" not in first.info
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "probes").glob("*.json")) == [
        "attention", "attention", "precision"]  # the attention probe under each precision, and the joint choice

    monkeypatch.setattr(run_setup, "step_seconds", fake_timing(1.0, 2.0))  # the timings now favour the others
    monkeypatch.setattr(probe, "choose_attention", lambda model, batch, autocast, bf16: ("sdpa", {}, "fake"))
    again = setup(tiny_cfg("model.attention=auto", "trainer.precision=auto"), None)
    assert (again.info["precision"], again.info["attention"]) == ("bf16", "explicit")
    assert again.model.attention_path() == "explicit"
    cached = again.info["precision_probe_cached"]  # relative to the cache dir: records hold no machine path
    assert cached.startswith("probes/precision-") and (tmp_path / "cache" / cached).is_file()
    fixed = setup(tiny_cfg("model.attention=auto", "trainer.precision=fp32"), None)  # fp32's path, timed in the first
    assert fixed.info["attention"] == "explicit" and fixed.info["attention_probe_cached"]
    batch = setup(tiny_cfg("model.attention=auto", "trainer.precision=fp32", "trainer.batch_size=40"), None)
    assert batch.info["attention"] == "sdpa" and "attention_probe_cached" not in batch.info

    other = setup(tiny_cfg("model.attention=auto", "trainer.precision=auto", "model.dim=24"), None)
    assert (other.info["precision"], other.info["attention"]) == ("fp32", "sdpa")
    monkeypatch.setenv("VITSWEEP_PROBE_CACHE", "off")
    assert setup(tiny_cfg("model.attention=auto", "trainer.precision=auto"), None).info["precision"] == "fp32"


def test_a_cuda_runs_summary_says_its_fp32_ran_as_tf32():
    """Review 2026-11-29 (trainer, 3): setup_device turns TF32 on for CUDA, and the summary said `precision: fp32`
    alone, so a GPU "fp32" run read as true fp32 beside a CPU one. Checked without a GPU: the flags are process
    state."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        device_setup.setup_device(torch.device("cuda"), {})
        assert device_setup.numerics(torch.device("cuda")) == {"tf32": True}
        assert device_setup.numerics(torch.device("cpu")) == {}  # a CPU's fp32 is fp32: nothing to add
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved


def test_a_cuda_runs_peak_memory_is_its_own_not_an_earlier_runs_in_the_same_process(monkeypatch):
    """Review 2026-11-30 (benchmarks): the summary's ``peak_gpu_mem_gib`` is the process's peak, never reset, so a
    launcher worker that ran a wide model and then a narrow one gave the narrow run the wide one's memory. A run's
    device set-up resets the peak. Checked without a GPU: the reset is a call on the device."""
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(device))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # an earlier run of this process used the GPU
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        device_setup.setup_device(torch.device("cuda", 1), {})
        device_setup.setup_device(torch.device("cpu"), {})
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved
    assert calls == [torch.device("cuda", 1)]
