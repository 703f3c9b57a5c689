"""Checkpoint integrity: the manifest that decides whether a checkpoint folder is complete,
and the only way its pickles are loaded (see :mod:`zsearch_cli.train.checkpoint`).

The manifest is the last file written into a checkpoint: each other file's size, each
pickle's SHA-256, and an HMAC of the whole with a per-user key. Sizes make "complete" a
cheap check (a killed copy or a full disk leaves a short file); the signed hashes let a
pickle that needs full unpickling (DeepSpeed's ZeRO partitions) be trusted only when this
user's zsearch wrote it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import secrets
import tempfile
from pathlib import Path
from typing import Any

import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.files import safetensors_problem, sha256_file

MANIFEST = "zsearch-manifest.json"
MANIFEST_FORMAT = 1
KEY_FILE = "checkpoint.key"
_LEGACY_REQUIRED = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "rng.pt")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")


def _signing_key() -> bytes:
    """This user's checkpoint key (created on first use, readable by the user only: it is
    the one file zsearch writes that must not follow the umask)."""
    from zsearch_cli.models.loading import cache_dir

    path = cache_dir() / KEY_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=path.parent)  # 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # first writer wins; a concurrent process reads the same key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return path.read_text().strip().encode()


def _signature(files: dict[str, Any]) -> str:
    body = json.dumps(files, sort_keys=True).encode()
    return hmac.new(_signing_key(), body, hashlib.sha256).hexdigest()


def write_manifest(folder: Path) -> None:
    """``folder/manifest.json``, written last: size of every file, SHA-256 of every pickle,
    signed with this user's key."""
    files: dict[str, Any] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            entry: dict[str, Any] = {"size": p.stat().st_size}
            if p.suffix == ".pt":
                entry["sha256"] = sha256_file(p)
            files[p.relative_to(folder).as_posix()] = entry
    manifest = {"format": MANIFEST_FORMAT, "files": files, "hmac_sha256": _signature(files)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ZsearchError(f"{folder / MANIFEST}: unreadable ({err})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ZsearchError(f"{folder / MANIFEST}: not a zsearch checkpoint manifest")
    return manifest


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint (naming the file), or None."""
    try:
        manifest = _read_manifest(folder)
    except ZsearchError:
        return f"{MANIFEST} is unreadable"
    if manifest is not None:
        for name, entry in manifest["files"].items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != entry.get("size"):
                return f"{name} has {path.stat().st_size} bytes, the manifest says {entry.get('size')}"
    else:  # written before manifests: the files every checkpoint has
        for name in _LEGACY_REQUIRED:
            if not (folder / name).is_file():
                return f"{name} is missing"
        if not any((folder / name).is_file() for name in _WEIGHTS):
            return "no weights (model.safetensors or adapter_model.safetensors) in it"
    for path in sorted(folder.rglob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem:
            return problem
    return None


def trusted_pickle(path: Path) -> bool:
    """True when ``path`` is byte for byte a file a zsearch run of this user wrote: its
    SHA-256 is in its folder's manifest and the manifest's HMAC verifies with our key."""
    manifest = _read_manifest(path.parent)
    if manifest is None:
        return False
    entry = manifest["files"].get(path.name) or {}
    signed = hmac.compare_digest(str(manifest.get("hmac_sha256", "")), _signature(manifest["files"]))
    return signed and entry.get("sha256") == sha256_file(path)


def load_pickle(path: Path, *, trusted_objects: bool = False) -> Any:
    """``torch.load`` of a checkpoint file, one line naming it on any failure.

    Always ``weights_only=True`` first. With ``trusted_objects`` (DeepSpeed's ZeRO
    partitions), a file that needs full unpickling is loaded only when
    :func:`trusted_pickle` vouches for it."""
    if not path.is_file():
        raise ZsearchError(f"{path}: missing from the checkpoint")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any failure is the file's; say which file
        if not (trusted_objects and isinstance(err, pickle.UnpicklingError)):
            raise ZsearchError(f"{path}: cannot be read ({_first_line(err)}); the checkpoint is damaged") from None
    if not trusted_pickle(path):
        raise ZsearchError(f"{path}: holds Python objects that only a full unpickle can load, and this user's "
                           f"zsearch did not write it (no signed {MANIFEST} with its hash): refusing to load it")
    try:
        return torch.load(path, weights_only=False, map_location="cpu")  # noqa: S614 - verified as our own above
    except Exception as err:  # noqa: BLE001
        raise ZsearchError(f"{path}: cannot be read ({_first_line(err)}); the checkpoint is damaged") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]
