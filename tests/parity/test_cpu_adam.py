"""The fused CPU AdamW (engine/optim/cpu_adam.h) against torch.optim.AdamW.

For every ISA level the tool reports supported (scalar always; a level this machine cannot run
is skipped, saying why), sizes with vector tails (1, 7, 33, 1000003), 1 and 2 threads, and three
(lr, betas, eps) sets, two with weight decay 0.01 and one with none:

- 100 steps of ours equal torch.optim.AdamW(fused=True) within 1e-6 relative per element for
  param, exp_avg and exp_avg_sq (|ours - torch| <= 1e-6 |torch|, no absolute floor): the kernel
  does torch's operations in torch's order, so they differ by at most an ulp now and then.
- Against torch.optim.AdamW(foreach=False), the single-tensor path: exp_avg and exp_avg_sq
  within the same 1e-6; param within 1e-6 relative plus twice torch's own gap between its two
  paths at that element. With MKL, torch's single-tensor sqrt is not correctly rounded (off by
  an ulp on ~0.6% of elements here), which moves a parameter near zero by far more than 1e-6
  relative; torch's fused path and ours both round it correctly. The test prints all three gaps.
- The bf16/fp16 copy equals torch's param.to(bfloat16)/to(float16) of our param bit for bit
  (rounding ties, overflow to inf, subnormals, signed zeros; NaN positions only, as torch's own
  NaN bit patterns differ between its scalar and vector paths).
- NaN and ±inf gradients propagate as torch's do: same NaN and inf positions, and the finite
  values agree as above.
- Arrays that start off a 64-byte boundary give the same result.

The engine side runs through tessera-cpu-adam-tool (tests/tools/cpu_adam_tool.cpp).
"""
import functools
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

STEPS = 100
LEVELS = ["scalar", "avx2", "avx512"]
SIZES = [1, 7, 33, 1000003]
THREADS = [1, 2]
HYPERS = [
    dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8),
    dict(lr=3e-4, beta1=0.8, beta2=0.95, eps=1e-6),
    # 1 - beta1 >= 0.5 takes the other branch of torch's lerp.
    dict(lr=5e-2, beta1=0.3, beta2=0.9999, eps=1e-3),
]
REL_TOL = 1e-6
FUSED_SCALE_TOL = 1e-6
UNSUPPORTED_EXIT = 3

torch.set_num_threads(1)


def tool_path() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    path = Path(tools) / "tessera-cpu-adam-tool"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing; build the tessera-cpu-adam-tool target")
    return path


@functools.lru_cache(maxsize=None)
def isa_report() -> dict:
    out = subprocess.run([str(tool_path()), "isa"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def require_level(level: str):
    report = isa_report()
    if level not in report["supported"]:
        pytest.skip(f"ISA level {level} does not run on this machine (the tool detects "
                    f"{report['detected']}, supports {report['supported']})")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cpu_adam")


def make_inputs(size: int, seed: int, grads: int):
    """A parameter over several magnitudes and gradients with zeros and subnormal squares."""
    gen = torch.Generator().manual_seed(seed)

    def scaled(lo, hi):
        return torch.randn(size, generator=gen) * 10 ** torch.empty(size).uniform_(lo, hi,
                                                                                  generator=gen)

    param = scaled(-3, 1)
    out = {"param": param}
    for k in range(grads):
        g = scaled(-4, 1)
        pick = torch.rand(size, generator=gen)
        g[pick < 0.01] = 0.0
        g[(pick >= 0.01) & (pick < 0.012)] *= 1e-18  # exp_avg_sq goes subnormal
        out[f"grad.{k}"] = g
    return out


@functools.lru_cache(maxsize=None)
def inputs_for(workdir: Path, size: int):
    # Every step has its own gradient, except at the large size (the file would be 400 MB):
    # there the tool cycles through 5 (step t uses grad.{(t-1) % 5}), and so does the oracle.
    grads = STEPS if size < 100000 else 5
    tensors = make_inputs(size, seed=size, grads=grads)
    path = workdir / f"in-{size}.safetensors"
    save_file(tensors, str(path))
    return path, tensors, grads


def torch_adamw(tensors, grads, steps, hyper, weight_decay, mode):
    p = tensors["param"].clone().requires_grad_(True)
    kwargs = {"foreach": False} if mode == "single" else {"fused": True}
    opt = torch.optim.AdamW([p], lr=hyper["lr"], betas=(hyper["beta1"], hyper["beta2"]),
                            eps=hyper["eps"], weight_decay=weight_decay, **kwargs)
    for t in range(steps):
        p.grad = tensors[f"grad.{t % grads}"].clone()
        opt.step()
    state = opt.state[p]
    return {"param": p.detach().clone(), "exp_avg": state["exp_avg"].clone(),
            "exp_avg_sq": state["exp_avg_sq"].clone()}


@functools.lru_cache(maxsize=None)
def reference(workdir: Path, size: int, hyper_index: int, weight_decay: float, mode: str):
    _, tensors, grads = inputs_for(workdir, size)
    return torch_adamw(tensors, grads, STEPS, HYPERS[hyper_index], weight_decay, mode)


def run_tool(in_path: Path, out_path: Path, level: str, threads: int, hyper: dict,
             weight_decay: float, steps: int, copy: str = "none", offset: int = 0):
    argv = [str(tool_path()), "run", "--in", str(in_path), "--out", str(out_path), "--isa", level,
            "--threads", str(threads), "--copy", copy, "--steps", str(steps),
            "--lr", repr(hyper["lr"]), "--beta1", repr(hyper["beta1"]),
            "--beta2", repr(hyper["beta2"]), "--eps", repr(hyper["eps"]),
            "--weight-decay", repr(weight_decay), "--offset", str(offset)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode == UNSUPPORTED_EXIT:
        pytest.skip(f"tool: {proc.stderr.strip()}")
    assert proc.returncode == 0, f"{' '.join(argv)}\nexit {proc.returncode}\n{proc.stderr}"
    return load_file(str(out_path))


def compare(what: str, ours: torch.Tensor, ref: torch.Tensor, rtol: float, atol=0.0):
    """Asserts the same NaN/inf positions and |ours - ref| <= rtol |ref| + atol elsewhere (atol:
    a number, or a tensor shaped like ref); returns the largest relative difference over the
    finite elements."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, what
    nan_o, nan_r = torch.isnan(ours), torch.isnan(ref)
    if not torch.equal(nan_o, nan_r):
        idx = torch.nonzero(nan_o != nan_r).flatten()[:8].tolist()
        raise AssertionError(f"{what}: NaN positions differ ({int(nan_o.sum())} ours vs "
                             f"{int(nan_r.sum())} torch; first at {idx}: ours "
                             f"{ours[idx].tolist()} torch {ref[idx].tolist()})")
    inf_r = torch.isinf(ref)
    if not torch.equal(torch.isinf(ours), inf_r) or not torch.equal(ours[inf_r], ref[inf_r]):
        idx = torch.nonzero((torch.isinf(ours) != inf_r) | (inf_r & (ours != ref)))
        idx = idx.flatten()[:8].tolist()
        raise AssertionError(f"{what}: inf positions differ at {idx}: ours {ours[idx].tolist()} "
                             f"torch {ref[idx].tolist()}")
    fin = torch.isfinite(ref)
    o, r = ours[fin].double(), ref[fin].double()
    if o.numel() == 0:
        return 0.0
    diff = (o - r).abs()
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / r.abs())
    max_rel = float(rel.max())
    if isinstance(atol, torch.Tensor):
        atol = atol[fin].double()
    bad = diff > rtol * r.abs() + atol
    if bool(bad.any()):
        where = torch.nonzero(fin).flatten()
        first = torch.nonzero(bad).flatten()[:5]
        detail = ", ".join(f"[{int(where[i])}] ours {o[i].item():.9g} torch {r[i].item():.9g}"
                           for i in first.tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} of {o.numel()} elements beyond "
                             f"{rtol:g} relative + {atol:g}; max relative difference "
                             f"{max_rel:.3g}; {detail}")
    return max_rel


def max_relative(a: torch.Tensor, b: torch.Tensor) -> float:
    fin = torch.isfinite(a) & torch.isfinite(b)
    diff = (a[fin].double() - b[fin].double()).abs()
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / b[fin].double().abs())
    return float(rel.max()) if rel.numel() else 0.0


def report(capsys, line: str):
    with capsys.disabled():
        print(line)


def test_isa_report():
    report_ = isa_report()
    assert "scalar" in report_["supported"]
    assert report_["detected"] in report_["supported"]
    assert set(report_["supported"]) <= set(LEVELS)


# Arrays below the kernel's grain (2^15 elements, engine/optim/cpu_adam.cpp) run on one thread
# whatever the count: only the large one is worth running with both.
SIZE_THREADS = [(size, threads) for size in SIZES for threads in THREADS
                if threads == 1 or size >= 1 << 15]


# Each hyperparameter set once, with and without weight decay between them (each pairing is the
# same kernel path: the three sets and the two decays, not their product, are what differ).
HYPER_DECAYS = [(0, 0.01), (1, 0.0), (2, 0.01)]


@pytest.mark.parametrize("hyper_index,weight_decay", HYPER_DECAYS)
@pytest.mark.parametrize("size,threads", SIZE_THREADS)
@pytest.mark.parametrize("level", LEVELS)
def test_matches_torch_adamw(workdir, capsys, level, size, threads, weight_decay, hyper_index):
    require_level(level)
    hyper = HYPERS[hyper_index]
    in_path, _, _ = inputs_for(workdir, size)
    out = run_tool(in_path, workdir / f"out-{level}-{size}-{threads}.safetensors", level, threads,
                   hyper, weight_decay, STEPS)
    single = reference(workdir, size, hyper_index, weight_decay, "single")
    fused = reference(workdir, size, hyper_index, weight_decay, "fused")
    label = (f"{level} n={size} threads={threads} wd={weight_decay} lr={hyper['lr']} "
             f"betas=({hyper['beta1']}, {hyper['beta2']}) eps={hyper['eps']}")
    rel_single, rel_fused, torch_gap, failures = {}, {}, {}, []
    for name in ("param", "exp_avg", "exp_avg_sq"):
        try:
            rel_fused[name] = compare(f"{name} vs fused=True", out[name], fused[name], REL_TOL)
        except AssertionError as e:
            rel_fused[name] = max_relative(out[name], fused[name])
            failures.append(str(e))
        gap = (fused[name].double() - single[name].double()).abs() if name == "param" else 0.0
        try:
            rel_single[name] = compare(f"{name} vs foreach=False", out[name], single[name],
                                       REL_TOL, 2 * gap)
        except AssertionError as e:
            rel_single[name] = max_relative(out[name], single[name])
            failures.append(str(e))
        torch_gap[name] = max_relative(fused[name], single[name])
    fmt = lambda d: " ".join(f"{k}={v:.2g}" for k, v in d.items())  # noqa: E731
    report(capsys, f"\n  {label}: max rel vs foreach=False {fmt(rel_single)}; vs fused "
                   f"{fmt(rel_fused)} (torch fused vs foreach=False: {fmt(torch_gap)})")
    assert not failures, f"{label}:\n  " + "\n  ".join(failures)


@pytest.mark.parametrize("level", LEVELS)
def test_unaligned_arrays(workdir, level):
    require_level(level)
    hyper = HYPERS[0]
    in_path, _, _ = inputs_for(workdir, 1000003)
    aligned = run_tool(in_path, workdir / f"aligned-{level}.safetensors", level, 2, hyper, 0.01,
                       STEPS)
    for offset in (1, 3):
        shifted = run_tool(in_path, workdir / f"offset-{level}-{offset}.safetensors", level, 2,
                           hyper, 0.01, STEPS, offset=offset)
        for name in ("param", "exp_avg", "exp_avg_sq"):
            assert torch.equal(shifted[name], aligned[name]), f"{level} offset {offset}: {name}"


def copy_check(what: str, copy: torch.Tensor, param: torch.Tensor, dtype):
    want = param.to(dtype)
    assert copy.dtype == dtype, what
    nan_c, nan_w = torch.isnan(copy), torch.isnan(want)
    assert torch.equal(nan_c, nan_w), f"{what}: NaN positions differ"
    bits_c = copy.view(torch.int16)[~nan_w]
    bits_w = want.view(torch.int16)[~nan_w]
    if not torch.equal(bits_c, bits_w):
        bad = torch.nonzero(bits_c != bits_w).flatten()[:8]
        src = param[~nan_w][bad]
        raise AssertionError(
            f"{what}: {int((bits_c != bits_w).sum())} copies differ from torch's .to({dtype}); "
            + ", ".join(f"{s.item():.9g} (0x{int(s.view(torch.int32)) & 0xffffffff:08x}): ours "
                        f"0x{int(c) & 0xffff:04x} torch 0x{int(w) & 0xffff:04x}"
                        for s, c, w in zip(src, bits_c[bad], bits_w[bad])))


@pytest.mark.parametrize("copy", ["bf16", "fp16"])
@pytest.mark.parametrize("size,threads", [(7, 1), (33, 1), (1000003, 1), (1000003, 2)])
@pytest.mark.parametrize("level", LEVELS)
def test_low_precision_copy(workdir, level, size, threads, copy):
    require_level(level)
    dtype = torch.bfloat16 if copy == "bf16" else torch.float16
    hyper = HYPERS[0]
    in_path, _, _ = inputs_for(workdir, size)
    out = run_tool(in_path, workdir / f"copy-{level}-{size}-{threads}-{copy}.safetensors", level,
                   threads, hyper, 0.01, STEPS, copy=copy)
    copy_check(f"{level} n={size} threads={threads}", out["copy"], out["param"], dtype)


def edge_floats() -> torch.Tensor:
    """fp32 values that exercise bf16/fp16 rounding: ties to even both ways, just above/below
    ties, overflow to inf, subnormal results, signed zeros, inf, NaN, and a random spread."""
    bits = []
    for hi in (0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x7F7F, 0x0001, 0x8001, 0x0080, 0x4780):
        for lo in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
            bits.append((hi << 16) | lo)
    bits += [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
             0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF]
    t = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32)
    special = t.view(torch.float32)
    halfs = torch.tensor([65504.0, 65519.0, 65520.0, 65536.0, -65520.0, 2.0**-24, 2.0**-25,
                          1.5 * 2.0**-25, 2.0**-26, 2.0**-14, 2.0**-14 * (1 - 2.0**-11),
                          1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2049.0, 2051.0])
    gen = torch.Generator().manual_seed(7)
    spread = torch.randn(4000, generator=gen) * 10 ** torch.empty(4000).uniform_(-12, 8,
                                                                                generator=gen)
    return torch.cat([special, halfs, spread])


@pytest.mark.parametrize("copy", ["bf16", "fp16"])
@pytest.mark.parametrize("level", LEVELS)
def test_copy_rounding_edges(workdir, level, copy):
    """lr = 0 and no weight decay leave the parameter as it is, so the copy is of chosen bits."""
    require_level(level)
    dtype = torch.bfloat16 if copy == "bf16" else torch.float16
    param = edge_floats()
    grad = torch.ones_like(param)
    in_path = workdir / "edges.safetensors"
    save_file({"param": param, "grad.0": grad}, str(in_path))
    hyper = dict(lr=0.0, beta1=0.9, beta2=0.999, eps=1e-8)
    for threads in THREADS:
        out = run_tool(in_path, workdir / f"edges-{level}-{copy}-{threads}.safetensors", level,
                       threads, hyper, 0.0, 1, copy=copy)
        finite = torch.isfinite(param)
        assert torch.equal(out["param"][finite], param[finite]), "lr=0 changed the parameter"
        copy_check(f"{level} edges threads={threads}", out["copy"], out["param"], dtype)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("size", [33, 1003])
@pytest.mark.parametrize("level", LEVELS)
def test_non_finite_gradients(workdir, level, size, threads):
    require_level(level)
    steps = 12
    tensors = make_inputs(size, seed=1000 + size, grads=steps)
    gen = torch.Generator().manual_seed(size)
    for step, value in ((2, float("nan")), (4, float("inf")), (6, -float("inf")),
                        (8, float("nan"))):
        idx = torch.randperm(size, generator=gen)[: max(1, size // 10)]
        tensors[f"grad.{step}"][idx] = value
    in_path = workdir / f"nonfinite-{size}.safetensors"
    save_file(tensors, str(in_path))
    for hyper_index, weight_decay in ((0, 0.01), (2, 0.0)):
        hyper = HYPERS[hyper_index]
        ref = torch_adamw(tensors, steps, steps, hyper, weight_decay, "single")
        fused_ref = torch_adamw(tensors, steps, steps, hyper, weight_decay, "fused")
        for copy in ("none", "bf16"):
            out = run_tool(in_path, workdir / f"nonfinite-{level}-{size}-{threads}.safetensors",
                           level, threads, hyper, weight_decay, steps, copy=copy)
            label = f"{level} n={size} threads={threads} wd={weight_decay} hyper {hyper_index}"
            assert bool(torch.isnan(ref["param"]).any()), "the test should produce NaNs"
            failures = []
            for name in ("param", "exp_avg", "exp_avg_sq"):
                gap = torch.where(torch.isfinite(ref[name]) & torch.isfinite(fused_ref[name]),
                                  (fused_ref[name].double() - ref[name].double()).abs(),
                                  torch.zeros((), dtype=torch.float64))
                try:
                    compare(f"{label}: {name}", out[name], ref[name], REL_TOL,
                            2 * gap if name == "param" else 0.0)
                except AssertionError as e:
                    failures.append(str(e))
            assert not failures, "\n  ".join(failures)
            if copy == "bf16":
                copy_check(label, out["copy"], out["param"], torch.bfloat16)
