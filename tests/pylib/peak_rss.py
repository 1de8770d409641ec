"""A program's own peak resident set, from the kernel (wait4's ru_maxrss).

A child forked from a large process (pytest with torch and transformers loaded: 0.8-1 GiB)
reports at least that parent's resident set: fork copies the page counts and exec keeps the
largest seen. So the program is started by a small launcher (python -S, ~10 MiB) and its peak
comes back from there."""
import os
import signal
import subprocess
import sys

_LAUNCHER = r"""
import os, resource, sys
limit = int(sys.argv[1])
if limit > 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
sys.stdout.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_with_peak_rss(argv, env=None, timeout=None, address_space=0):
    """Runs argv (its stdout discarded, stderr captured); returns (exit code, stderr, peak RSS in
    bytes, -1 if the launcher could not tell). `address_space` > 0 caps the program's (RLIMIT_AS).
    Past `timeout` seconds the program is killed and stderr says so."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, str(address_space), *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout} s)"
    return proc.returncode, err, int(out) if out.strip().isdigit() else -1
