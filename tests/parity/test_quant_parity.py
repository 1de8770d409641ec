"""engine/quant's 4-bit block quantization against bitsandbytes (issue 27, QLoRA's base weights):
for the same float32 input, the packed indices and the per-block absmax byte-identical to
bitsandbytes.functional.quantize_4bit, and the dequantized values equal to its dequantize_4bit's,
for NF4 and FP4 at block sizes 64 (its default), 32 and 256. The inputs cover what real weights
and edge cases bring: small normal weights, a size that leaves a short last block, an odd count
(a padded index), an all-zero block, values that are exactly a code times the absmax, values on
the midpoints between codes (where rounding decides), heavy tails, and bf16-rounded weights.
Driven through tests/tools/quant_tool.cpp (tessera-quant-tool)."""
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bitsandbytes.functional as bnb  # the reference; installed by the test command
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from bitsandbytes.backends.utils import _get_4bit_code

# bitsandbytes wraps its reference dequantization in torch.compile: eager is the same arithmetic
# without a compile per shape.
torch._dynamo.config.disable = True


def tool():
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    return Path(tools) / "tessera-quant-tool"


def inputs(quant_type):
    g = torch.Generator().manual_seed(0)
    code = bnb.get_4bit_type(quant_type, device="cpu")
    ordered = code.sort().values
    midpoints = (ordered[:-1] + ordered[1:]) / 2
    exact = (code.repeat(8) * 0.37).reshape(2, 64)
    ties = torch.cat([midpoints, torch.tensor([1.0])]).repeat(4) * 0.05
    return {
        "normal_64x128": torch.randn(64, 128, generator=g) * 0.02,
        "short_last_block": torch.randn(1000, generator=g),
        "odd_3x333": torch.randn(3, 333, generator=g),
        "zero_block": torch.cat([torch.zeros(256), torch.randn(256, generator=g)]),
        "exact_codes": exact,
        "midpoints": ties,
        "heavy_tail": torch.randn(4096, generator=g) * torch.exp(2 * torch.randn(4096, generator=g)),
        "bf16_weights": (torch.randn(128, 96, generator=g) * 0.05).bfloat16().float(),
    }


@pytest.mark.parametrize("blocksize", [64, 32, 256])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_four_bit_quantization_is_bitsandbytes_byte_for_byte(quant_type, blocksize, tmp_path):
    tensors = inputs(quant_type)
    source = tmp_path / "in.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(source))
    out = tmp_path / "out.safetensors"
    done = subprocess.run([str(tool()), "four-bit", str(source), str(out), quant_type, str(blocksize)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = load_file(str(out))
    for name, x in tensors.items():
        packed, state = bnb.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type)
        theirs_packed = packed.reshape(-1)
        mismatched = (ours[f"{name}.packed"] != theirs_packed).sum().item()
        print(f"{quant_type} blocksize {blocksize} {name}: {x.numel()} values, "
              f"{mismatched} of {theirs_packed.numel()} bytes differ")
        assert torch.equal(ours[f"{name}.packed"], theirs_packed), name
        assert torch.equal(ours[f"{name}.absmax"].view(torch.int32), state.absmax.view(torch.int32)), name
        # Its reference dequantization (the default backend's, over the flattened blocks, as the
        # CUDA kernels do). Its CPU kernel takes the blocks per row instead, which differs when a
        # row is not a multiple of the block (0.09 apart on a 128 × 96 weight at block 64).
        dequantized = _dequantize_4bit_compute(packed.reshape(-1), state.absmax,
                                               _get_4bit_code(quant_type, packed.device), blocksize,
                                               x.shape, torch.float32)
        # Bit for bit (torch.equal holds -0 and +0 equal).
        assert torch.equal(ours[f"{name}.dequantized"].view(torch.int32),
                           dequantized.view(torch.int32)), name
        # Straight to bf16 (QLoRA's compute dtype; AVX-512 where the CPU has it): the float32
        # values rounded as torch rounds them, short last blocks and odd counts included.
        assert torch.equal(ours[f"{name}.dequantized_bf16"].view(torch.int16),
                           dequantized.bfloat16().view(torch.int16)), name


def test_a_bad_type_or_blocksize_is_refused_by_name(tmp_path):
    source = tmp_path / "in.safetensors"
    save_file({"w": torch.ones(64)}, str(source))
    for args, expected in ((["int3", "64"], "\"int3\" is not a 4-bit type"),
                           (["nf4", "48"], "blocksize 48 is not one of 32, 64")):
        done = subprocess.run([str(tool()), "four-bit", str(source), str(tmp_path / "o.safetensors"), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and expected in done.stderr, done.stderr


def test_int8_rows_are_bitsandbytes_byte_for_byte(tmp_path):
    """The LLM.int8 weight format (`Int8Params`' int8 weight and SCB): each row × (127 / its
    absmax), rounded half to even, identical to bitsandbytes.functional.int8_vectorwise_quant;
    dequantized as its int8_vectorwise_dequant computes it."""
    g = torch.Generator().manual_seed(1)
    tensors = {
        "weight_96x200": torch.randn(96, 200, generator=g) * 0.02,
        "heavy_tail_16x4096": torch.randn(16, 4096, generator=g) * torch.exp(2 * torch.randn(16, 4096, generator=g)),
        # Halves after scaling (x.5 rounds to even), and a zero row.
        "halves": torch.tensor([[1.0, -0.5, 0.25, 63.5 / 127, -62.5 / 127], [0.0] * 5]),
        "bf16_weights_64x96": (torch.randn(64, 96, generator=g) * 0.05).bfloat16().float(),
    }
    source = tmp_path / "in.safetensors"
    save_file(tensors, str(source))
    out = tmp_path / "out.safetensors"
    done = subprocess.run([str(tool()), "int8", str(source), str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    ours = load_file(str(out))
    for name, x in tensors.items():
        q, scb, _ = bnb.int8_vectorwise_quant(x.clone())
        mismatched = (ours[f"{name}.int8"] != q).sum().item()
        print(f"int8 {name}: {x.numel()} values, {mismatched} differ")
        assert torch.equal(ours[f"{name}.int8"], q), name
        assert torch.equal(ours[f"{name}.scb"].view(torch.int32), scb.view(torch.int32)), name
        assert torch.equal(ours[f"{name}.dequantized"], bnb.int8_vectorwise_dequant(q, scb)), name



@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_double_quantized_absmax_restore_as_bitsandbytes(quant_type, tmp_path):
    """A weight saved with `bnb_4bit_use_double_quant` (the Hub's -bnb-4bit folders) keeps its
    absmax as 8-bit codes over blocks of 256, each block with a scale of its own, less their mean
    (the offset): restored bit for bit as bitsandbytes' dequantize_4bit restores them (the last
    block of 256 short here), and the weight dequantized with them equal to its."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300, 256, generator=g) * 0.02  # 1200 blocks of 64: 4 nested blocks and a short one
    packed, state = bnb.quantize_4bit(x, blocksize=64, quant_type=quant_type, compress_statistics=True)
    assert state.nested
    source = tmp_path / "in.safetensors"
    save_file({"packed": packed.reshape(-1).contiguous(), "qabsmax": state.absmax.contiguous(),
               "code2": state.state2.code.float().contiguous(),
               "absmax2": state.state2.absmax.float().contiguous(),
               "offset": state.offset.reshape(1).float(), "count": torch.tensor([x.numel()])},
              str(source))
    out = tmp_path / "out.safetensors"
    done = subprocess.run([str(tool()), "four-bit-nested", str(source), str(out), quant_type, "64",
                           str(state.state2.blocksize)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = load_file(str(out))
    theirs_absmax = bnb.dequantize_blockwise(state.absmax, state.state2) + state.offset
    differ = (ours["absmax"] != theirs_absmax).sum().item()
    print(f"{quant_type} double-quantized absmax: {differ} of {theirs_absmax.numel()} differ")
    assert torch.equal(ours["absmax"].view(torch.int32), theirs_absmax.view(torch.int32))
    assert torch.equal(ours["dequantized"], bnb.dequantize_4bit(packed, state).reshape(-1))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_double_quantization_is_bitsandbytes_byte_for_byte(quant_type, tmp_path):
    """Our double quantization of a 4-bit weight's absmax (`method.double_quant`) gives the 8-bit
    codes and block scales bitsandbytes' quantize_4bit(compress_statistics=True) gives, byte for
    byte: its absmax less their mean, in blocks of 256 (the last one short), each value replaced
    by the nearest of its dynamic map's 256 values. The weights mix scales so that the absmax
    spread over the map's whole range, both signs."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(700, 1, generator=g).exp() * 0.01
    x = torch.randn(700, 256, generator=g) * rows  # 2800 blocks of 64: 10 of 256, one short
    _, plain = bnb.quantize_4bit(x, blocksize=64, quant_type=quant_type, compress_statistics=False)
    _, nested = bnb.quantize_4bit(x, blocksize=64, quant_type=quant_type, compress_statistics=True)
    offset = plain.absmax.mean()
    assert torch.equal(offset.reshape(1), nested.offset.reshape(1))
    source = tmp_path / "in.safetensors"
    save_file({"absmax": plain.absmax.float().contiguous(), "offset": offset.reshape(1).float(),
               "code2": nested.state2.code.float().contiguous()}, str(source))
    out = tmp_path / "out.safetensors"
    done = subprocess.run([str(tool()), "nested-absmax", str(source), str(out),
                           str(nested.state2.blocksize)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    ours = load_file(str(out))
    differ = (ours["qabsmax"] != nested.absmax).sum().item()
    print(f"{quant_type} double quantization: {differ} of {nested.absmax.numel()} codes differ")
    assert torch.equal(ours["qabsmax"], nested.absmax)
    assert torch.equal(ours["absmax2"].view(torch.int32),
                       nested.state2.absmax.float().view(torch.int32))
