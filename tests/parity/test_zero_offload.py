"""ZeRO-Offload (`zero` with offload_optimizer on a device) on the simulated device
(engine/train/device_tier.h: host memory standing in for the GPU, a copy thread of its own, NaN in
a copy's destination until something waits for its event, a copy whose source changes before that
refused): the masters and moments of each rank's share in host memory, the averaged gradients
copied down through the tier after the backward and the new values copied up after the CPU Adam.
20 steps of `tessera-cli run` give the losses of the same job under `zero` on the CPU within 1e-5
relative, and in fp32 those of `single` (stages 1 and 2, fp32 and bf16, full and LoRA), on 2 ranks
those of the 2-rank job on the CPU,
and a checkpoint resumes the same trajectory; the memory events hold the host buffers, counted
from transformers' parameter count."""
import json

import pytest
from transformers import AutoModelForCausalLM

from test_gemini import assert_same_losses, cli, run, spec_for, workdir  # noqa: F401 (fixture)
from test_gemini_device import SIMULATED, assert_checkpoints_move_both_ways, launch_2

OFFLOAD = {"device": "simulated", "offload_optimizer": True}


def parameters(workdir, family):
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(workdir / family).parameters())


@pytest.mark.parametrize("family, precision, method, stage", [
    ("llama", "fp32", "full", 2), ("gpt2", "bf16", "full", 1), ("llama", "bf16", "lora", 2),
    ("qwen2", "fp32", "lora", 1),
])
def test_zero_offload_follows_zero_on_the_cpu(workdir, family, precision, method, stage):
    """Against the same stage on the CPU (where the CPU Adam updates the masters in place), and in
    fp32 against single too (zero's own parity with single in bf16 is integration_dist's: the
    masters' rounding differs by a few 1e-5)."""
    base = f"zoff-{family}-{precision}-{method}-{stage}"
    on_cpu, _ = run(spec_for(workdir, family, f"{base}-cpu", "zero", {"stage": stage}, method=method,
                             precision=precision))
    ours, events = run(spec_for(workdir, family, base, "zero", {**OFFLOAD, "stage": stage},
                                method=method, precision=precision), env=SIMULATED)
    assert_same_losses(ours, on_cpu, f"{base} against zero on the cpu")
    if precision == "fp32":
        reference, _ = run(spec_for(workdir, family, f"{base}-single", "single", method=method))
        assert_same_losses(ours, reference, f"{base} against single")
    if method != "full":
        return
    # The host holds each parameter's float32 master, its gradient copied down and two moments
    # (and in bf16 the new values rounded for the copy up, as weights).
    n = parameters(workdir, family)
    memory = [e for e in events if e["type"] == "memory"][-1]
    assert memory["tier"] == "host", memory
    by = memory["by_category"]
    assert by["optimizer"] == 2 * 4 * n, (by, n)
    assert by["gradients"] >= 4 * n, (by, n)
    values = 2 if precision == "bf16" else 4
    assert by["weights"] >= (4 + (2 if precision == "bf16" else 0)) * n + values * n, (by, n)


def test_two_ranks_offloaded_follow_the_two_ranks_on_the_cpu(workdir):
    """2 ranks, stage 2, bf16: each rank's gradient share comes down and its new values go up
    before the all-gather; the losses are the 2-rank job's on the CPU exactly."""
    def spec(name, options):
        return spec_for(workdir, "llama", name, "zero", {"stage": 2, **options}, precision="bf16")

    reference, _ = launch_2(spec("zoff-ranks-cpu", {}))
    ours, _ = launch_2(spec("zoff-ranks", OFFLOAD), env=SIMULATED)
    assert_same_losses(ours, reference, "2 ranks, ZeRO-Offload, stage 2, bf16")


def test_offloaded_checkpoints_resume_the_same_trajectory(workdir):
    """A ZeRO-Offload run resumed from single's checkpoint-5 continues single's straight 15 steps,
    and single resumed from its checkpoint-10 does too (fp32: zero's bf16 rounds its masters a
    few 1e-5 away from single's, which would hide what the resume changed)."""
    assert_checkpoints_move_both_ways(workdir, "zoff-move", "zero", {**OFFLOAD, "stage": 2}, "ZeRO-Offload",
                                      precision="fp32")


def test_the_simulated_device_is_for_offload_tests_only(workdir):
    """Without offload_optimizer the simulated device has nothing to do under zero: refused,
    naming the option; and without the tests' variable it is refused as for gemini."""
    spec = spec_for(workdir, "llama", "zoff-refused", "zero", {"device": "simulated"}, steps=2)
    r = cli("run", spec, env=SIMULATED)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "offload_optimizer" in r.stderr, r.stderr[-2000:]
    spec = spec_for(workdir, "llama", "zoff-refused-env", "zero", OFFLOAD, steps=2)
    r = cli("run", spec, env={k: v for k, v in SIMULATED.items() if k != "TESSERA_SIMULATED_DEVICE"})
    assert r.returncode == 2
    assert 'strategy.options.device is "simulated"' in r.stderr, r.stderr[-2000:]
