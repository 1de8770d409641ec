"""installer/bootstrap.sh: its profiles, its refusals, and a second run that installs nothing.

Runs with TESSERA_SKIP_APT=1 (no Debian package is touched) against the venv the suite runs in
(set up by installer/test.sh) or a copy of its stamps, so nothing is downloaded.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "installer" / "bootstrap.sh"
VENV = Path(sys.executable).parent.parent  # the venv the suite's pytest runs from


def bootstrap(*args, venv=VENV, timeout=60):
    env = dict(os.environ, TESSERA_SKIP_APT="1", TESSERA_VENV=str(venv))
    start = time.monotonic()
    r = subprocess.run(["bash", str(BOOTSTRAP), *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return r, time.monotonic() - start


def test_an_unknown_profile_is_refused_naming_the_ones_there_are():
    r, _ = bootstrap("--for", "everything")
    assert r.returncode == 2
    assert '--for "everything" is not a profile' in r.stderr and "product, package or test" in r.stderr
    r, _ = bootstrap("--fast")
    assert r.returncode == 2 and 'unknown argument "--fast"' in r.stderr


def test_help_describes_both_profiles():
    r, _ = bootstrap("--help")
    assert r.returncode == 0, r.stderr
    assert "product" in r.stdout and "test" in r.stdout and "TESSERA_SKIP_APT" in r.stdout


def test_a_second_run_checks_and_installs_nothing():
    # The suite's venv is set up for the tests; both profiles find it up to date.
    for profile in ("test", "product"):
        r, seconds = bootstrap("--for", profile)
        assert r.returncode == 0, r.stderr
        assert "Python venv: up to date" in r.stderr, r.stderr
        assert "this run installed" not in r.stderr, r.stderr
        assert seconds < 30, f"{profile}: {seconds:.1f} s"
    assert (VENV / ".tessera-stamp-product").is_file()


def test_the_product_profile_is_satisfied_by_the_products_packages_alone(tmp_path):
    # A venv installed for the demo (installer/demo.sh) has the product's stamp only: the demo's
    # second run finds it up to date; the tests' profile would install the rest.
    assert bootstrap("--for", "test")[0].returncode == 0  # the suite's venv has both stamps
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".tessera-stamp-product").write_text((VENV / ".tessera-stamp-product").read_text())
    r, _ = bootstrap("--for", "product", venv=venv)
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stderr and "this run installed" not in r.stderr, r.stderr
