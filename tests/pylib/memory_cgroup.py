"""A memory cgroup for tests and benchmarks that check a memory budget from outside the process:
v2 when the unified hierarchy has the memory controller, else v1. Needs root."""

import subprocess
import time
from pathlib import Path


class CgroupUnavailable(Exception):
    """Why no memory cgroup can be made here (the caller skips, saying so)."""


class MemoryCgroup:
    def __init__(self, name, limit_bytes):
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.controllers").read_text():
            self.path, self.version = v2 / name, 2
            try:
                self.path.mkdir(exist_ok=True)
                (self.path / "memory.max").write_text(str(limit_bytes))
                if (self.path / "memory.swap.max").exists():
                    (self.path / "memory.swap.max").write_text("0")
            except OSError as e:
                raise CgroupUnavailable(f"cannot create a cgroup v2 memory group here: {e}") from e
            return
        v1 = Path("/sys/fs/cgroup/memory")
        if not (v1 / "memory.limit_in_bytes").exists():
            raise CgroupUnavailable("no memory cgroup controller is mounted (neither v2 nor v1)")
        self.path, self.version = v1 / name, 1
        try:
            self.path.mkdir(exist_ok=True)
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as e:
            raise CgroupUnavailable(f"cannot create a cgroup v1 memory group here (needs root): {e}") from e

    def run(self, argv, timeout):
        """Runs argv inside the group (the shell joins it, then execs); returns CompletedProcess."""
        return subprocess.run(["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$0" "$@"',
                               *[str(a) for a in argv]], capture_output=True, text=True, timeout=timeout)

    def oom_kills(self):
        if self.version == 2:
            stats = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            return int(stats.get("oom_kill", 0))
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return int(oom.get("oom_kill", 0))

    def peak_bytes(self):
        """The group's peak charge (page cache included), or None where the kernel does not say."""
        peak = self.path / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(peak.read_text()) if peak.exists() else None

    def remove(self):
        for _ in range(50):  # the last process may still be leaving the group
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
