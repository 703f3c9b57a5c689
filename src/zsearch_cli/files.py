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
