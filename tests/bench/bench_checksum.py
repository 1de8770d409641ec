"""The checkpoint checksum at the speed of the disk (issue 15, finding 7): XXH3-128 of one file
(core/checksum.h through tessera-checksum-tool) against `cp` of the same file, and the FNV-1a
loop it replaced, in one run on this machine.

A file of BENCH_CHECKSUM_MIB MiB (default 2048) of incompressible bytes is written to a folder on
the filesystem checkpoints live on (BENCH_CHECKSUM_DIR, default the system's temporary folder)
and read once so that every side starts from the page cache, as a checksum does right after a
save. Each round times, one after another:

  cp        `cp FILE COPY` (the copy removed after), what saving the file costs at least
  xxh3      the checksum of new manifests
  fnv-old   the byte-at-a-time FNV-1a of manifests written before it

and prints GB/s (10^9 bytes) per side, the median over BENCH_CHECKSUM_ROUNDS rounds (default 3),
and xxh3 ÷ cp and fnv-old ÷ cp as throughput ratios (goal: xxh3 ÷ cp >= 1, the checksum never the
slower of the two). It checks the tool's XXH3-128 against the `xxhash` package on the same file
and fails only on a mismatch or a crash; the figures are printed, not asserted."""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import xxhash

TOOLS = Path(os.environ.get("TESSERA_TOOLS_DIR", Path(__file__).resolve().parents[2] / "build" / "tests"))
TOOL = TOOLS / "tessera-checksum-tool"
MIB = int(os.environ.get("BENCH_CHECKSUM_MIB", "2048"))
ROUNDS = int(os.environ.get("BENCH_CHECKSUM_ROUNDS", "3"))


def cpu_line():
    flags, model = set(), platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    shown = [f for f in ("sse4_2", "avx2", "avx512f", "avx512bw", "avx512_bf16") if f in flags]
    return f"{model}; flags {' '.join(shown)}; {os.cpu_count()} CPUs"


def tool(path, *extra):
    r = subprocess.run([str(TOOL), str(path), *extra], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main():
    folder = Path(tempfile.mkdtemp(prefix="tessera-bench-checksum-", dir=os.environ.get("BENCH_CHECKSUM_DIR")))
    data, copy = folder / "state.bin", folder / "copy.bin"
    size = MIB << 20
    try:
        block = os.urandom(64 << 20)
        reference = xxhash.xxh3_128()
        with open(data, "wb") as f:
            for i in range(0, size, len(block)):
                # Each block differs, so no layer below can deduplicate or compress it.
                piece = (i.to_bytes(8, "little") + block[8:])[: size - i]
                f.write(piece)
                reference.update(piece)
        with open(data, "rb") as f:
            while f.read(64 << 20):
                pass
        print(f"bench_checksum: {cpu_line()}; file {MIB} MiB at {folder} (in the page cache)")
        rows = {"cp": [], "xxh3": [], "fnv-old": []}
        for _ in range(ROUNDS):
            start = time.perf_counter()
            subprocess.run(["cp", str(data), str(copy)], check=True)
            rows["cp"].append(size / (time.perf_counter() - start) / 1e9)
            copy.unlink()
            ours = tool(data)
            if ours["hex"] != reference.hexdigest():
                sys.exit(f"bench_checksum: XXH3-128 {ours['hex']} differs from the xxhash package's "
                         f"{reference.hexdigest()}")
            rows["xxh3"].append(size / ours["seconds"] / 1e9)
            rows["fnv-old"].append(size / tool(data, "--legacy")["seconds"] / 1e9)
        median = {side: statistics.median(v) for side, v in rows.items()}
        print(f"  side      GB/s (median of {ROUNDS})   rounds")
        for side, values in rows.items():
            print(f"  {side:8} {median[side]:10.2f}              " + " ".join(f"{v:.2f}" for v in values))
        print(f"  xxh3 ÷ cp    {median['xxh3'] / median['cp']:.2f}  (goal >= 1)")
        print(f"  fnv-old ÷ cp {median['fnv-old'] / median['cp']:.2f}")
        print("bench_checksum: done (figures only)")
    finally:
        for p in (data, copy):
            p.unlink(missing_ok=True)
        folder.rmdir()


if __name__ == "__main__":
    main()
