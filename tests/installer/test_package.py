"""installer/package.sh: the relocatable tarball runs from a folder with spaces in its path, with no
Python, no venv and no build tree in its reach, and writes nothing into its own folder; the
tessera-cuda tarball unpacked over it brings the CUDA module and every library it loads.

Packs the build the suite runs on (TESSERA_BUILD_DIR), unpacks it, and runs what a user would:
`tessera-cli version`, the demo to its accuracy line, and the studio offscreen to a screenshot of
its first page.
"""
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from nvidia_driver import has_driver  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", ROOT / "build"))
VENV = Path(os.sys.executable).parent.parent
VERSION = re.search(r"project\(Tessera VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
# Measured unpacked: 512 MiB (2026-12-04; libtorch_cpu alone is 428 MiB); README states it.
MAX_UNPACKED = 600 << 20
# tessera-cuda's libraries: the CUDA module, LibTorch's CUDA libraries and NVIDIA's (cuBLAS, cuDNN,
# NCCL, ...). Measured 2026-12-04 with torch 2.15.0: see README; the bound catches a library
# collected twice or a wheel's whole folder swept in.
MAX_CUDA_UNPACKED = 4 << 30
SYSTEM_DIRS = ("/lib/", "/usr/lib/", "/lib64/")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # --no-build: the suite's build is what is packed; nothing rebuilds under running tests.
    r = subprocess.run(["bash", str(ROOT / "installer" / "package.sh"), "--out", str(out), "--no-build", "--cuda"],
                       capture_output=True, text=True, timeout=1500,
                       env=dict(os.environ, TESSERA_BUILD_DIR=str(BUILD)))
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stderr)  # the phases, with their times and the sizes
    return out


def unpack(tarballs, place: Path):
    place.mkdir()
    for tarball in tarballs:
        assert tarball.is_file(), sorted(p.name for p in tarball.parent.iterdir())
        with tarfile.open(tarball) as t:
            t.extractall(place, filter="tar")
    return place / f"tessera-{VERSION}"


@pytest.fixture(scope="module")
def unpacked(packed, tmp_path_factory):
    return unpack([packed / f"tessera-{VERSION}-linux-x86_64.tar.gz"],
                  tmp_path_factory.mktemp("apps") / "a folder with spaces")


@pytest.fixture(scope="module")
def unpacked_with_cuda(packed, tmp_path_factory):
    return unpack([packed / f"tessera-{VERSION}-linux-x86_64.tar.gz",
                   packed / f"tessera-cuda-{VERSION}-linux-x86_64.tar.gz"],
                  tmp_path_factory.mktemp("apps") / "with cuda, and spaces")


def deb_fields(deb: Path):
    info = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout
    return dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)


def deb_files(deb: Path):
    """The paths of the package's files (not its directories), as installed."""
    contents = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True,
                              check=True).stdout
    return {line.split()[-1].lstrip(".") for line in contents.splitlines() if not line.startswith("d")}


def assert_resolves_inside(folder: Path, elf: Path):
    r = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, (elf, r.stderr)
    for line in r.stdout.splitlines():
        assert "not found" not in line, (elf.name, line)
        if "=>" not in line:
            continue
        path = line.split("=>")[1].split("(")[0].strip()
        assert path.startswith(str(folder) + "/") or path.startswith(SYSTEM_DIRS), (elf.name, line)
        assert str(VENV) not in path and str(BUILD) not in path, (elf.name, line)


def bare_env(home: Path, **extra):
    # No PATH to any Python, venv or compiler; only a home for the studio's and demo's data.
    home.mkdir(exist_ok=True)
    return {"PATH": "/nonexistent", "HOME": str(home), **extra}


def files_under(folder: Path):
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


def test_the_folder_holds_the_programs_and_their_libraries(unpacked):
    assert (unpacked / "bin" / "tessera-cli").is_file() and (unpacked / "bin" / "tessera").is_file()
    libs = {p.name for p in (unpacked / "lib" / "tessera").iterdir()}
    assert {"libtorch_cpu.so", "libc10.so"} <= libs, libs
    assert not any("torch_cuda" in name or name.startswith("libtessera_cuda") for name in libs), libs
    size = sum(p.stat().st_size for p in unpacked.rglob("*") if p.is_file())
    assert size <= MAX_UNPACKED, f"unpacked {size / 2**20:.0f} MiB"
    dependencies = (unpacked / "DEPENDENCIES").read_text().split()
    assert {"libqt6core6", "libcurl4", "libqt6sql6-sqlite"} <= set(dependencies), dependencies
    for package in dependencies:  # Debian package names the machine has
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        assert "install ok installed" in r.stdout, package


def test_every_library_resolves_inside_the_folder_or_to_the_system(unpacked):
    for program in ("tessera-cli", "tessera"):
        assert_resolves_inside(unpacked, unpacked / "bin" / program)


def test_cli_runs_the_demo_with_no_python_and_leaves_its_folder_as_it_was(unpacked, tmp_path):
    before = files_under(unpacked)
    cli = unpacked / "bin" / "tessera-cli"
    r = subprocess.run([str(cli), "version"], capture_output=True, text=True, timeout=120,
                       env=bare_env(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    assert f"Tessera {VERSION}" in r.stdout and "CUDA module not loaded" in r.stdout, r.stdout
    out = tmp_path / "demo out"
    r = subprocess.run([str(cli), "demo", "--steps", "40", "--out", str(out)], capture_output=True,
                       text=True, timeout=600, env=bare_env(tmp_path / "home"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"held-out exact-match accuracy: [0-9.]+% before, [0-9.]+% after", r.stdout), r.stdout
    assert (out / "run" / "model" / "config.json").is_file()
    assert files_under(unpacked) == before


def test_studio_opens_offscreen_to_its_first_page(unpacked, tmp_path):
    before = files_under(unpacked)
    shot = tmp_path / "first page.png"
    r = subprocess.run([str(unpacked / "bin" / "tessera"), "--screenshot", str(shot)],
                       capture_output=True, text=True, timeout=120,
                       env=bare_env(tmp_path / "home", QT_QPA_PLATFORM="offscreen",
                                    XDG_RUNTIME_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000, f"{len(data)} bytes: a blank window?"  # the first page: ~78 KB
    assert files_under(unpacked) == before


def test_the_cuda_tarball_brings_the_module_and_what_it_loads_and_nothing_twice(packed, unpacked,
                                                                            unpacked_with_cuda):
    cpu_files = {p.relative_to(unpacked) for p in unpacked.rglob("*") if p.is_file()}
    with tarfile.open(packed / f"tessera-cuda-{VERSION}-linux-x86_64.tar.gz") as t:
        cuda_files = {Path(m.name).relative_to(f"tessera-{VERSION}") for m in t.getmembers() if m.isfile()}
    assert not cpu_files & cuda_files, sorted(cpu_files & cuda_files)
    names = {p.name for p in cuda_files}
    assert all(p.parent == Path("lib/tessera") for p in cuda_files), sorted(cuda_files)
    assert {"libtessera_cuda.so", "libtorch_cuda.so", "libc10_cuda.so", "libtorch_cuda_linalg.so",
            "libnccl.so.2", "libcublas.so.13", "libcudnn.so.9", "libcudnn_ops.so.9"} <= names, sorted(names)
    size = sum((unpacked_with_cuda / p).stat().st_size for p in cuda_files)
    print(f"tessera-cuda unpacked: {size / 2**30:.2f} GiB in {len(cuda_files)} files")
    assert size <= MAX_CUDA_UNPACKED, f"{size / 2**30:.2f} GiB"
    # Every library of the two, the ones cuDNN and LibTorch open by name included, finds what it
    # needs in the folder or the system, not in the venv or the build tree it was made from.
    for p in sorted(cuda_files):
        assert_resolves_inside(unpacked_with_cuda, unpacked_with_cuda / p)


def test_with_the_cuda_tarball_the_programs_load_the_module_from_their_folder(unpacked_with_cuda, tmp_path):
    cli = unpacked_with_cuda / "bin" / "tessera-cli"
    r = subprocess.run([str(cli), "version", "--json"], capture_output=True, text=True, timeout=120,
                       env=bare_env(tmp_path / "home", TESSERA_CUDA="1", LD_DEBUG="files"))
    assert r.returncode == 0, r.stderr[-3000:]
    v = json.loads(r.stdout)
    assert v["cuda_module_loaded"] is True, v
    assert v["cuda_module"] == f"loaded from {unpacked_with_cuda / 'lib' / 'tessera' / 'libtessera_cuda.so'}", v
    assert v["cuda"] and v["cuda"][0].isdigit(), v  # LibTorch's CUDA runtime is the folder's
    # Every library the loader initialised, by full path: the folder's or the system's.
    initialised = {line.split("calling init:", 1)[1].strip() for line in r.stderr.splitlines()
                   if "calling init:" in line}
    assert any(p.endswith("/libtorch_cuda.so") for p in initialised), sorted(initialised)
    for path in initialised:
        assert path.startswith(str(unpacked_with_cuda) + "/") or path.startswith(SYSTEM_DIRS), path
    # With no TESSERA_CUDA the module is loaded only where a driver is.
    r = subprocess.run([str(cli), "version", "--json"], capture_output=True, text=True, timeout=120,
                       env=bare_env(tmp_path / "home"))
    v = json.loads(r.stdout)
    assert v["cuda_module_loaded"] is has_driver(), v


def test_the_debian_package_installs_programs_libraries_and_desktop_files(packed, unpacked, tmp_path):
    deb = packed / f"tessera_{VERSION}_amd64.deb"
    fields = deb_fields(deb)
    assert fields["Package"] == "tessera" and fields["Version"] == VERSION and fields["Architecture"] == "amd64"
    depends = [d.strip() for d in fields["Depends"].split(",")]
    assert depends == (unpacked / "DEPENDENCIES").read_text().split(), depends
    installed = int(fields["Installed-Size"]) << 10
    assert installed <= MAX_UNPACKED + (16 << 20), f"{installed / 2**20:.0f} MiB"
    paths = deb_files(deb)
    for expected in ["/usr/bin/tessera-cli", "/usr/bin/tessera", "/usr/lib/tessera/libtorch_cpu.so",
                     "/usr/share/applications/tessera.desktop",
                     "/usr/share/metainfo/io.tessera.Studio.metainfo.xml",
                     "/usr/share/mime/packages/tessera.xml", "/usr/share/man/man1/tessera-cli.1.gz",
                     "/usr/share/man/man1/tessera.1.gz"] + [
            f"/usr/share/icons/hicolor/{n}x{n}/apps/tessera.png" for n in (16, 24, 32, 48, 64, 128, 256, 512)]:
        assert expected in paths, expected

    # Extracted into a folder (as dpkg would into /), the programs run from /usr/bin's layout.
    root = tmp_path / "root with spaces"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    r = subprocess.run([str(root / "usr" / "bin" / "tessera-cli"), "version"], capture_output=True,
                       text=True, timeout=120, env=bare_env(tmp_path / "home"))
    assert r.returncode == 0 and f"Tessera {VERSION}" in r.stdout, r.stderr
    # The desktop entry opens job files in the studio; the MIME type names their files.
    desktop = (root / "usr/share/applications/tessera.desktop").read_text()
    assert "Exec=tessera %f" in desktop and "MimeType=application/x-tessera-job;" in desktop
    mime = (root / "usr/share/mime/packages/tessera.xml").read_text()
    assert 'type="application/x-tessera-job"' in mime and 'pattern="*.tessera-job.json"' in mime
    icon = (root / "usr/share/icons/hicolor/256x256/apps/tessera.png").read_bytes()
    assert icon[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(icon[16:20], "big") == 256
    # The man page is tessera-cli's own help, a section per command.
    page = subprocess.run(["man", "-l", str(root / "usr/share/man/man1/tessera-cli.1.gz")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "MANWIDTH": "100"})
    assert page.returncode == 0, page.stderr
    text = re.sub(r".\x08", "", page.stdout)  # nroff's overstruck bold
    help_text = subprocess.run([str(root / "usr/bin/tessera-cli"), "--help"], capture_output=True,
                               text=True, env=bare_env(tmp_path / "home")).stdout
    commands = re.findall(r"^  ([a-z][a-z-]*)  ", help_text, re.M)
    assert len(commands) >= 10, help_text
    for command in commands:
        assert re.search(rf"^ {{3}}{command}$", text, re.M), command


def test_the_cuda_debian_package_adds_to_tessera_and_overlaps_none_of_its_files(packed):
    cuda_deb = packed / f"tessera-cuda_{VERSION}_amd64.deb"
    fields = deb_fields(cuda_deb)
    assert fields["Package"] == "tessera-cuda" and fields["Version"] == VERSION, fields
    assert f"tessera (= {VERSION})" in [d.strip() for d in fields["Depends"].split(",")], fields["Depends"]
    assert int(fields["Installed-Size"]) << 10 <= MAX_CUDA_UNPACKED + (1 << 20), fields["Installed-Size"]
    cuda_files = deb_files(cuda_deb)
    assert "/usr/lib/tessera/libtessera_cuda.so" in cuda_files and "/usr/lib/tessera/libtorch_cuda.so" in cuda_files
    assert all(f.startswith(("/usr/lib/tessera/", "/usr/share/doc/tessera-cuda/")) for f in cuda_files), cuda_files
    # dpkg refuses a package that overwrites another's file: none is shared.
    shared = cuda_files & deb_files(packed / f"tessera_{VERSION}_amd64.deb")
    assert not shared, sorted(shared)


def test_the_debian_package_installs_runs_and_purges_in_a_clean_debian_root(packed, tmp_path):
    """tests/installer/clean_root.sh: a minimal Debian root of this machine's release and mirror
    (no Python, no compiler), apt installs tessera and tessera-cuda with their dependencies,
    `tessera-cli version`, the demo and the studio (offscreen, a screenshot) run there, the CUDA
    module loads from /usr/lib/tessera when asked (there is no driver in the root), and a purge
    leaves none of the packages' files but the demo's output."""
    if os.geteuid() != 0:
        pytest.skip("needs root (chroot and mounts)")
    deb = packed / f"tessera_{VERSION}_amd64.deb"
    cuda_deb = packed / f"tessera-cuda_{VERSION}_amd64.deb"
    r = subprocess.run(["bash", str(ROOT / "tests" / "installer" / "clean_root.sh"), str(deb), str(tmp_path),
                        str(cuda_deb)], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"Tessera {VERSION}" in (tmp_path / "version.txt").read_text()
    demo = (tmp_path / "demo.txt").read_text()
    assert re.search(r"held-out exact-match accuracy: [0-9.]+% before, [0-9.]+% after", demo), demo[-2000:]
    shot = (tmp_path / "first.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000, len(shot)
    v = json.loads((tmp_path / "cuda-version.json").read_text())
    assert v["cuda_module_loaded"] is True and v["cuda_module"] == "loaded from /usr/lib/tessera/libtessera_cuda.so", v
    assert v["cuda"] and v["cuda"][0].isdigit(), v
