"""engine/parallel's tensor-parallel layers across real local processes (tessera-tp-tool, one
process per rank, torchrun's variables set by hand, Gloo on loopback): a small language model's
vocabulary-parallel embedding, column-parallel gate/up and row-parallel down projections (with
biases), vocabulary-parallel head and cross-entropy (with ignored targets), computed over 2 and 4
ranks and over the tensor groups of a 2 × 2 (data × tensor) mesh, give the loss, the logits and
every weight's gradient block of the same model computed whole (fp32, 1e-5); a split that does
not divide is refused naming the tensor and the sizes."""
import os
import socket
import subprocess
from pathlib import Path

import pytest


def tool() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    return Path(tools) / "tessera-tp-tool"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_layers_equal_the_whole_model(world):
    port = free_port()
    base = {k: v for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    ranks = []
    for rank in range(world):
        env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
               "TESSERA_DIST_TIMEOUT_S": "30", "OMP_NUM_THREADS": "1"}
        ranks.append(subprocess.Popen([str(tool()), "layers"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = [(p.wait(timeout=90), *p.communicate()) for p in ranks]
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank}: exit {code}\n{out}\n{err}"
        assert out.strip() == f"ok rank {rank} of {world}"
