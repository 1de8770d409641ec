"""The CUDA runtime module (engine/cuda/runtime.h). Programs link LibTorch's CPU libraries alone;
everything that calls CUDA is in libtessera_cuda.so, loaded before main() where an NVIDIA driver
is (TESSERA_CUDA=1 loads it anyway, =0 never). Checked with the dynamic loader's own account of
what a process maps (LD_DEBUG=files), the kernel's peak RSS of the child, and the CUDA runtime
version LibTorch reports, which it knows only if the module was in before its first question
about CUDA. On a machine with a GPU the GPU check (tests/gpu) runs everything with it loaded."""
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from nvidia_driver import has_driver  # noqa: E402
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))



def run(*args, cuda=None, extra_env=None, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_CUDA")}
    if cuda is not None:
        env["TESSERA_CUDA"] = cuda
    env.update(extra_env or {})
    proc = subprocess.run([CLI, *map(str, args)], env=env, capture_output=True, text=True, timeout=240)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def version(cuda=None, extra_env=None):
    return json.loads(run("version", "--json", cuda=cuda, extra_env=extra_env).stdout)


def libraries_mapped(cuda):
    """The shared objects the dynamic loader opened for `tessera-cli version`, by file name."""
    err = run("version", cuda=cuda, extra_env={"LD_DEBUG": "files"}).stderr
    names = set()
    for line in err.splitlines():
        if "file=" in line and ("needed by" in line or "dynamically loaded by" in line):
            names.add(Path(line.split("file=", 1)[1].split()[0]).name)
    assert "libtorch_cpu.so" in names, err[-2000:]  # the account is read right
    return names


def peak_rss_kib(cuda):
    """The child's peak resident set, from the kernel (getrusage of the one child run here)."""
    script = ("import os, resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
              "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_CUDA")}
    env["TESSERA_CUDA"] = cuda
    out = subprocess.run([sys.executable, "-c", script, CLI, "version"], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return int(out)


def test_without_the_module_no_cuda_library_is_mapped():
    names = libraries_mapped("0")
    # The CUDA wheel's libtorch_cpu itself needs libcudart and libcupti (its profiler; a few MiB):
    # not ours to drop. The big ones come only with libtorch_cuda.
    cuda_libraries = {n for n in names if n.startswith(("libtorch_cuda", "libc10_cuda", "libcublas", "libcudnn",
                                                        "libnccl", "libcusparse", "libcufft", "libtessera_cuda"))}
    assert not cuda_libraries, cuda_libraries
    v = version("0")
    assert v["cuda_module_loaded"] is False and v["cuda_module"] == "not loaded: TESSERA_CUDA=0", v
    assert v["cuda"] is None and v["gpu_count"] == 0, v


def test_the_default_loads_it_only_where_a_driver_is():
    v = version()
    assert v["cuda_module_loaded"] is has_driver(), v
    if not has_driver():
        assert "no NVIDIA driver (libcuda.so.1)" in v["cuda_module"], v
        assert "libtorch_cuda.so" not in libraries_mapped(None)


def test_loaded_it_is_in_before_libtorch_first_asks_about_cuda():
    names = libraries_mapped("1")
    assert {"libtessera_cuda.so", "libtorch_cuda.so", "libc10_cuda.so"} <= names, sorted(names)
    v = version("1")
    assert v["cuda_module_loaded"] is True and v["cuda_module"].startswith("loaded from /"), v
    assert Path(v["cuda_module"][len("loaded from "):]).name == "libtessera_cuda.so"
    # LibTorch knows its CUDA runtime only through the hooks libtorch_cuda registers when it loads:
    # had anything asked about CUDA first, LibTorch would have kept "no CUDA" for the process.
    assert v["cuda"] and v["cuda"][0].isdigit(), v


def test_a_cpu_process_starts_lighter_without_it():
    without, loaded = peak_rss_kib("0"), peak_rss_kib("1")
    print(f"tessera-cli version peak RSS: {without / 1024:.0f} MiB without the CUDA module, "
          f"{loaded / 1024:.0f} MiB with it")
    assert loaded - without >= 100 * 1024, (without, loaded)


def test_a_module_that_does_not_load_is_named_and_the_cpu_still_works(tmp_path):
    bogus = tmp_path / "libtessera_cuda.so"
    bogus.write_text("not a shared object\n")
    v = version("1", extra_env={"TESSERA_CUDA_MODULE": str(bogus)})
    assert v["cuda_module_loaded"] is False, v
    assert v["cuda_module"].startswith("not loaded: ") and str(bogus) in v["cuda_module"], v
    missing = tmp_path / "nowhere" / "libtessera_cuda.so"
    v = version("1", extra_env={"TESSERA_CUDA_MODULE": str(missing)})
    assert v["cuda_module"].startswith("not loaded: ") and str(missing) in v["cuda_module"] \
        and "does not exist" in v["cuda_module"], v
    # Asked for a GPU, the error says why there is none.
    make_tiny_llama(tmp_path / "model")
    proc = run("generate", "--model", tmp_path / "model", "--prompt", "x", "--device", "cuda", cuda="1",
               extra_env={"TESSERA_CUDA_MODULE": str(bogus)}, check=False)
    assert proc.returncode == 2 and "CUDA module is not loaded" in proc.stderr, proc.stderr


def test_training_on_the_cpu_with_the_cuda_libraries_loaded(tmp_path):
    """The GPU machines run every CPU path with the module in: the same losses as without it."""
    make_tiny_llama(tmp_path / "model")
    write_text_dataset(tmp_path / "data.jsonl")
    losses = {}
    for cuda in ("0", "1"):
        events = tmp_path / f"events-{cuda}.jsonl"
        run("finetune", "--model", tmp_path / "model", "--data", tmp_path / "data.jsonl", "--steps", "3",
            "--out", tmp_path / f"out-{cuda}", "--events", events, cuda=cuda)
        losses[cuda] = [e["loss"] for e in map(json.loads, events.read_text().splitlines())
                        if e.get("type") == "metric" and "loss" in e]
    assert len(losses["0"]) == 3 and losses["0"] == losses["1"], losses
