"""File modes: what zsearch writes follows the user's umask, as ``open()`` and ``mkdir``
would, including the files and folders it first writes under a temporary name.

Why: ``tempfile.mkstemp`` creates files 0600 and ``mkdtemp`` folders 0700 whatever the
umask, so an atomic write (temp name, then rename) would leave outputs readable by their
owner only, where a shared cluster (umask 002 or 022) expects group-readable results.

Also :func:`safetensors_problem`, the cheap check (header only) that a weights file is
whole, so a cut copy is one line naming it rather than a loader's traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

_lock = threading.Lock()


def current_umask() -> int:
    """The process umask (reading it means setting it; the lock keeps that atomic here)."""
    with _lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def umask_mode(base: int = 0o666) -> int:
    """``base`` with the umask applied: 0o666 for files, 0o777 for folders."""
    return base & ~current_umask()


def mkstemp_like_open(**kwargs) -> tuple[int, str]:
    """``tempfile.mkstemp`` whose file has the mode ``open(path, 'w')`` would give it."""
    fd, path = tempfile.mkstemp(**kwargs)
    os.chmod(path, umask_mode(0o666))
    return fd, path


def mkdtemp_like_mkdir(**kwargs) -> Path:
    """``tempfile.mkdtemp`` whose folder has the mode ``mkdir`` would give it."""
    path = Path(tempfile.mkdtemp(**kwargs))
    path.chmod(umask_mode(0o777))
    return path


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (from its own header), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{path.name} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return f"{path.name} is not a safetensors file ({type(err).__name__})"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        return f"{path.name} has a malformed safetensors header"
    if size < 8 + n + end:
        return f"{path.name} is truncated ({size} bytes, its header needs {8 + n + end})"
    return None


def sha256_file(path: Path) -> str:
    """The hex sha256 of one file's bytes, read in 1 MiB blocks (a weights file may be GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------ replacing a folder (one rule)
#
# Every folder zsearch replaces (an index, an export, a checkpoint, a converted or merged model)
# goes through these, in this order:
#   1. write beside it: new_folder_beside(target), ``.NAME.PID.xxxx.tmp`` (the owner's pid inside);
#   2. move the old one aside: ``.NAME.old-PID-NS``;
#   3. rename the new one in;
#   4. remove the old one;
#   5. a later run cleans what dead processes left (clean_stale_temps): their temps are removed,
#      and an old folder moved aside whose replacement never arrived (a kill between 2 and 3) is
#      renamed back, so a kill at any moment leaves the old folder or the new one, never neither.


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def new_folder_beside(target: Path, note: Callable[[str], None] | None = None) -> Path:
    """Step 1: an empty folder beside ``target`` to write the new one in (mode as ``mkdir``),
    named with this process's pid so a later run can tell a dead writer's from a live one's.
    Step 5 runs first; ``note`` gets its lines (default: stderr)."""
    import sys

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for line in clean_stale_temps(target):
        (note or (lambda text: print(text, file=sys.stderr)))(line)
    return mkdtemp_like_mkdir(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)


def swap_in(tmp: Path, target: Path) -> None:
    """Steps 2-4: move ``target`` aside (if any), rename ``tmp`` in, remove the old one."""
    import shutil
    import time

    target = Path(target)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _owner(name: str, prefix: str) -> tuple[str, int] | None:
    """("tmp" | "old", pid) of a name this rule writes beside a target, else None."""
    rest = name[len(prefix):]
    if rest.endswith(".tmp"):
        pid_text, kind = rest.split(".", 1)[0], "tmp"
    elif rest.startswith("old-"):
        pid_text, kind = rest[4:].split("-", 1)[0], "old"
    else:
        return None
    return (kind, int(pid_text)) if pid_text.isdigit() else None


def clean_stale_temps(target: Path) -> list[str]:
    """Step 5: what dead processes left beside ``target``. Their new folders are removed; an
    old folder they moved aside is renamed back when ``target`` is missing (the kill came
    between steps 2 and 3), else removed. A live owner's (a concurrent writer) are kept.
    Returns one line per folder restored (for the caller to print)."""
    import shutil

    target = Path(target)
    prefix = f".{target.name}."
    if not target.parent.is_dir():
        return []
    restored = []
    leftovers = sorted(target.parent.iterdir(), key=lambda p: p.name)
    for path in leftovers:
        owner = _owner(path.name, prefix) if path.name.startswith(prefix) else None
        if owner is None or pid_alive(owner[1]):
            continue
        if owner[0] == "old" and not target.exists():
            os.rename(path, target)
            restored.append(f"{target}: restored the previous version, which a killed process (pid {owner[1]}) "
                            "had moved aside")
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return restored


def replace_folder(target: Path, write: Callable[[Path], None], note: Callable[[str], None] | None = None) -> Path:
    """The whole rule: ``write(tmp)`` fills a folder beside ``target``, which then replaces it.
    A failure in ``write`` removes the new folder and leaves ``target`` as it was."""
    import shutil

    tmp = new_folder_beside(target, note)
    try:
        write(tmp)
        tmp.chmod(umask_mode(0o777))
        swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Path(target)
