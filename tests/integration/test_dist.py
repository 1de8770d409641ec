"""engine/dist across real local processes (tessera-dist-tool, one process per rank, torchrun's
variables set by hand): exact collectives on 2 and 4 ranks, a rank killed (SIGKILL) or stopped
(SIGSTOP) mid-collective named by every other rank within the collective timeout, and the
environment's errors; asynchronous all_reduces in flight at once, exact, and a rank killed
while they are in flight named through their wait()."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

TIMEOUT_S = 3.0  # TESSERA_DIST_TIMEOUT_S for the failure tests: heartbeat every 0.3 s
# A failed rank is named once silent for 3 heartbeats, waiting at most 4 after the collective
# fails; one more second for process scheduling on a busy 2-core machine.
NAMING_S = 4 * 0.3 + 1.0


def tool() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    return Path(tools) / "tessera-dist-tool"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(rank: int, world: int, port: int, **extra: str) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE", "TESSERA_DIST_TIMEOUT_S",
                                "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                       TESSERA_DIST_TIMEOUT_S=str(TIMEOUT_S))
    environment.update(extra)
    return environment


class Ranks:
    """N processes of the tool, stdout and stderr in files under tmp_path."""

    def __init__(self, tmp_path: Path, world: int, mode: str, environment=None):
        port = free_port()
        self.tmp_path = tmp_path
        self.processes = []
        self.files = []
        for rank in range(world):
            out = open(tmp_path / f"rank{rank}.out", "w")
            err = open(tmp_path / f"rank{rank}.err", "w")
            self.files += [out, err]
            self.processes.append(subprocess.Popen(self.command(mode), stdout=out, stderr=err,
                                                   env=rank_environment(rank, world, port,
                                                                        **self.extra_environment,
                                                                        **(environment or {}))))

    extra_environment: dict = {}

    def command(self, mode: str) -> list:
        return [str(tool()), mode]

    def output(self, rank: int, stream: str = "out") -> str:
        return (self.tmp_path / f"rank{rank}.{stream}").read_text()

    def wait_for_iterations(self, iterations: int, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if all(f"iteration {iterations}\n" in self.output(rank)
                   for rank in range(len(self.processes))):
                return
            assert all(p.poll() is None for p in self.processes), self.describe()
            time.sleep(0.05)
        raise AssertionError(f"no iteration {iterations} within {within_s} s: " + self.describe())

    def wait(self, ranks, within_s: float) -> dict:
        """Exit codes of `ranks`, once all have exited; fails if any is still running."""
        deadline = time.monotonic() + within_s
        for rank in ranks:
            try:
                self.processes[rank].wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"rank {rank} still running after {within_s:.1f} s: "
                                     + self.describe())
        return {rank: self.processes[rank].returncode for rank in ranks}

    def describe(self) -> str:
        return "\n".join(f"rank {r} (rc {p.poll()}): {self.output(r, 'err')[-1500:]}"
                         for r, p in enumerate(self.processes))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait()
        for file in self.files:
            file.close()


@pytest.fixture
def launch(tmp_path):
    started = []

    def start(world: int, mode: str, environment=None) -> Ranks:
        ranks = Ranks(tmp_path, world, mode, environment)
        started.append(ranks)
        return ranks

    yield start
    for ranks in started:
        ranks.close()


def test_one_process_needs_no_environment(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    result = subprocess.run([str(tool()), "collectives"], env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok rank 0 of 1\n"


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_exact_on_world_and_subgroups(launch, world):
    ranks = launch(world, "collectives")
    codes = ranks.wait(range(world), within_s=60)
    assert codes == {rank: 0 for rank in range(world)}, ranks.describe()
    for rank in range(world):
        assert ranks.output(rank) == f"ok rank {rank} of {world}\n"


@pytest.mark.parametrize("mode", ["collectives", "async"])
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_through_host_copies_are_exact(launch, world, mode):
    """The path a CUDA tensor takes to Gloo (ranks sharing a GPU, and every send and receive on
    a GPU: dist::ProcessGroup::send says why): each collective on a copy, the result copied back
    into the caller's tensor at wait(). TESSERA_DIST_COPY_EVERY_TENSOR=1 sends CPU tensors that
    way too, so that it is tested here, where there is no GPU."""
    ranks = launch(world, mode, {"TESSERA_DIST_COPY_EVERY_TENSOR": "1"})
    codes = ranks.wait(range(world), within_s=60)
    assert codes == {rank: 0 for rank in range(world)}, ranks.describe()
    for rank in range(world):
        assert ranks.output(rank) == f"ok rank {rank} of {world} (through host copies)\n"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_async_collectives_in_flight_at_once_are_exact(launch, world):
    ranks = launch(world, "async")
    codes = ranks.wait(range(world), within_s=60)
    assert codes == {rank: 0 for rank in range(world)}, ranks.describe()
    for rank in range(world):
        assert ranks.output(rank) == f"ok rank {rank} of {world}\n"


def assert_named(ranks: Ranks, survivors, victim: int) -> None:
    host = socket.gethostname()
    for rank in survivors:
        error = ranks.output(rank, "err")
        assert f"failed_rank={victim}\n" in error, ranks.describe()
        assert f"failed_host={host} (127.0.0.1)\n" in error, ranks.describe()
        assert f"failed on rank {rank} " in error
        assert f"rank {victim} on {host} (127.0.0.1) (pid {ranks.processes[victim].pid})" in error
        assert "TESSERA_DIST_TIMEOUT_S" in error  # the hint says which timeout applied


@pytest.mark.parametrize("world,victim", [(4, 2), (2, 0)])
def test_killed_rank_is_named_by_the_others_within_the_timeout(launch, world, victim):
    # Rank 0 hosts the store: its death is seen as the store going silent, and still named.
    ranks = launch(world, "loop")
    ranks.wait_for_iterations(30)
    ranks.processes[victim].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    survivors = [rank for rank in range(world) if rank != victim]
    codes = ranks.wait(survivors, within_s=TIMEOUT_S + NAMING_S)
    print(f"world {world}, rank {victim} killed: others failed after "
          f"{time.monotonic() - killed_at:.2f} s")
    assert codes == {rank: 3 for rank in survivors}, ranks.describe()
    assert_named(ranks, survivors, victim)


def test_killed_rank_is_named_through_async_collectives(launch):
    # The wait() of a collective in flight fails as the synchronous call does, naming the rank.
    world, victim = 4, 1
    ranks = launch(world, "async-loop")
    ranks.wait_for_iterations(30)
    ranks.processes[victim].send_signal(signal.SIGKILL)
    survivors = [rank for rank in range(world) if rank != victim]
    codes = ranks.wait(survivors, within_s=TIMEOUT_S + NAMING_S)
    assert codes == {rank: 3 for rank in survivors}, ranks.describe()
    assert_named(ranks, survivors, victim)
    assert "all_reduce on world failed" in ranks.output(0, "err")


def test_stopped_rank_is_named_within_the_timeout(launch):
    world, victim = 4, 3
    ranks = launch(world, "loop")
    ranks.wait_for_iterations(30)
    ranks.processes[victim].send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    survivors = [rank for rank in range(world) if rank != victim]
    codes = ranks.wait(survivors, within_s=TIMEOUT_S + NAMING_S)
    elapsed = time.monotonic() - stopped_at
    print(f"rank {victim} stopped: others failed after {elapsed:.2f} s")
    assert codes == {rank: 3 for rank in survivors}, ranks.describe()
    assert_named(ranks, survivors, victim)
    assert "has sent no heartbeat for" in ranks.output(0, "err")
    # A hang is only a hang once the timeout has passed: nobody gave up early.
    assert elapsed >= TIMEOUT_S * 0.9


def run_env(**variables: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE")}
    environment.update(variables)
    return subprocess.run([str(tool()), "env"], env=environment, capture_output=True, text=True,
                          timeout=60)


def test_rank_not_below_world_size_is_refused():
    result = run_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="4",
                     WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="4")
    assert result.returncode == 2, result.stderr
    assert "RANK=4 is out of range: it must be 0 .. 3 (below WORLD_SIZE=4)" in result.stderr
    assert "torchrun" in result.stderr  # the hint says who sets it


def test_missing_master_port_is_refused():
    result = run_env(MASTER_ADDR="127.0.0.1", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1",
                     LOCAL_WORLD_SIZE="2")
    assert result.returncode == 2, result.stderr
    assert "MASTER_PORT is not set; WORLD_SIZE=2 needs it: a free TCP port on rank 0's machine" \
        in result.stderr


@pytest.mark.parametrize("variables,message", [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two is not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "LOCAL_RANK=2 is out of range: it must be 0 .. 1 (below LOCAL_WORLD_SIZE=2)"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is out of range"),
    ({"TESSERA_DIST_TIMEOUT_S": "-1"}, "TESSERA_DIST_TIMEOUT_S=-1 is not a timeout"),
])
def test_other_bad_variables_are_named(variables, message):
    result = run_env(**variables)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
