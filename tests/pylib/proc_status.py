"""A running process's children and memory as /proc shows them, for tests that poll the ranks of
`tessera-cli launch` while they run."""
from pathlib import Path


def children_of(pid):
    """The pids of `pid`'s children (empty once it has none or is gone)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def status_bytes(pid, field):
    """A memory field of /proc/PID/status ("VmHWM", "VmRSS") in bytes; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
