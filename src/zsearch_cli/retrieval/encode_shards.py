"""Dense encoding on one process or many: ``zsearch index --kind dense`` as it is, or under
``accelerate launch -m zsearch_cli index CORPUS --kind dense`` (each process one GPU, or a
share of the CPU cores); docs/methods.md §7.1.

The corpus is cut into fixed slices of ``--encode-slice`` passages (the last one shorter).
A slice is the unit of everything here:

- **numerics**: a slice is sorted by length and batched by ``Encoder.encode`` on its own, so
  every batch holds the same passages whatever the number of processes. Batch composition
  changes float results (a batch pads to its longest passage, and the kernels' shapes change
  the rounding: on CPU, MiniLM's vectors of 74 of 256 passages moved by up to 1.1e-7 when the
  256 were sorted and batched in two halves), so slices that depended on the process count
  would give other bytes;
- **work**: the pending slices are dealt out as contiguous runs, one per process; each
  process writes its rows into the one shared ``embeddings.npy`` (a memmap of just its slice);
- **resume**: a finished slice is flushed, then marked done by a file holding its rows and
  the sha256 of their bytes. The work lives in a folder beside the target (``.NAME.encode``)
  that a rerun finds; a rerun of *the same build* (:func:`build_key`) re-encodes only the
  slices without a marker whose checksum still matches the file.

Process 0 ingests the corpus (into its temp folder of the folder rule, files.py), holds a
lock on the work folder, deals the slices, and once every process has passed the barrier
checks every slice's checksum (a write lost on the way is a rerun, not a wrong index),
builds faiss and hard-links the embeddings into the new index folder, which is renamed in
only when complete. A killed process therefore leaves the work folder (and a temp folder
that the next build cleans), never anything that looks like an index.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np

from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import err_console

SLICE_ROWS = 16_384
"""Default ``--encode-slice``: big enough that length sorting pads little, small enough that
a killed run loses seconds of GPU time and 8 processes share wiki-18 within one slice."""
BUILD_FILE = "build.json"
DONE_DIR = "done"
LOCK_FILE = "lock"
EMBEDDINGS = "embeddings.npy"
WAIT = timedelta(days=2)
"""The process group's timeout: helpers wait at barriers while process 0 ingests a corpus
and builds faiss and BM25 (an hour or more on wiki-18); gloo's default is 30 minutes."""


def work_folder(out: Path) -> Path:
    """Where a build into ``out`` keeps its encode: beside it, found again by a rerun. Not
    a name the folder rule's cleaner touches (it takes only ``.NAME.PID.*.tmp`` and ``.NAME.old-*``)."""
    return out.parent / f".{out.name}.encode"


def slice_rows(n_docs: int, rows: int) -> list[tuple[int, int]]:
    """The slices' ``[start, end)`` rows: from the corpus size and ``--encode-slice``, never the process count."""
    return [(a, min(a + rows, n_docs)) for a in range(0, n_docs, rows)]


def deal(pending: list[int], rank: int, world: int) -> list[int]:
    """Process ``rank``'s contiguous run of the pending slices (runs differ by at most one)."""
    bounds = np.linspace(0, len(pending), world + 1).round().astype(int)
    return pending[bounds[rank] : bounds[rank + 1]]


# ----------------------------------------------------------------------------- processes


@dataclass
class Launch:
    """This process's place in the launch: rank 0 of 1 without ``accelerate launch``."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    lock: Any = field(default=None, repr=False)
    encoded: bool = False
    """This build encoded (so ``finish`` removes its work folder, not another build's)."""

    @classmethod
    def from_env(cls, kinds: list[str], opts: dict[str, Any]) -> "Launch":
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world == 1:
            return cls()
        if "dense" not in kinds or opts.get("adopt_faiss"):
            raise ZsearchError(f"{world} processes (accelerate launch) share only dense encoding; run "
                               f"`zsearch index` as one process for {'--adopt-faiss' if opts.get('adopt_faiss') else '--kind bm25'}")
        import torch.distributed as dist

        if not dist.is_initialized():  # gloo: only small objects and barriers travel, GPUs or not
            dist.init_process_group("gloo", timeout=WAIT)
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    def broadcast(self, obj: Any) -> Any:
        """Process 0's ``obj``, on every process."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def follow(self, out: Path, opts: dict[str, Any]) -> Path:
        """A helper process (rank > 0): encode its slices of process 0's corpus, then wait
        until process 0 has renamed the index in (so every process's exit means it exists)."""
        encoder = load_encoder(self, opts)  # while process 0 reads the corpus
        corpus, n_docs, fingerprint = self.broadcast(None)
        _encode(self, encoder, Path(corpus), n_docs, fingerprint, out, opts, None)
        self.barrier()  # process 0: the index is in
        return out

    def finish(self, out: Path) -> None:
        """Process 0, after the index is renamed in: the work folder goes (unless another
        build holds it by now); then the helpers may leave."""
        work = work_folder(out)
        if self.encoded and work.is_dir():
            try:
                lock = _take_lock(work)
            except ZsearchError:  # a new build of the same target took it over meanwhile: its work now
                lock = None
            if lock is not None:
                shutil.rmtree(work, ignore_errors=True)
                os.close(lock)
        self.barrier()


def load_encoder(launch: Launch, opts: dict[str, Any]):
    from zsearch_cli.retrieval.dense import Encoder, pick_device

    device = pick_device(opts["device"])
    if device == "cuda" and launch.world > 1:  # one GPU per process (more processes than GPUs share them)
        import torch

        device = f"cuda:{launch.local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    prefixes = {k: opts[k] for k in ("query_prefix", "passage_prefix") if opts.get(k) is not None}
    return Encoder(opts["encoder"], device, int(opts["max_length"]), int(opts["batch_size"]), **prefixes)


# ----------------------------------------------------------------------------- what "the same build" is


def _files_fingerprint(folder: Path) -> str | None:
    """An encoder folder's files: name, size, first and last MiB (cheap even for GBs)."""
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for p in sorted(f for f in folder.iterdir() if f.is_file()):
        size = p.stat().st_size
        digest.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as fh:
            digest.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            digest.update(fh.read(1 << 20))
    return digest.hexdigest()[:32]


def build_key(encoder, fingerprint: str, n_docs: int, rows: int) -> dict[str, Any]:
    """Everything an embedding's bytes depend on: rows encoded under another key may not be
    mixed with this build's. Not the process count, nor (measured on CPU, 1 vs 2 threads:
    the same bytes) the threads per process, so a rerun may use another launch; nor the faiss
    type, which is built afterwards from the finished embeddings."""
    import torch
    import transformers

    device = encoder.device
    if device.startswith("cuda"):
        device = "cuda " + torch.cuda.get_device_name(torch.device(device))
    return {"corpus_fingerprint": fingerprint, "n_docs": n_docs, "encode_slice": rows,
            "encoder": encoder.name, "encoder_files": _files_fingerprint(Path(encoder.path)),
            "encoder_commit": getattr(encoder.model.config, "_commit_hash", None),
            "dim": encoder.dim, "max_length": encoder.max_length, "batch_size": encoder.batch_size,
            "passage_prefix": encoder.prefixes[1], "pooling": "mean", "normalize": True,
            "dtype": str(next(encoder.model.parameters()).dtype), "device": device,
            "torch": torch.__version__, "transformers": transformers.__version__}


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- the work folder


def _take_lock(work: Path) -> int:
    """A lock on ``work`` that the kernel drops when its holder dies, however it dies."""
    fd = os.open(work / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ZsearchError(f"{work}: another zsearch index is encoding into it now; wait for it or use "
                           "another --out") from None
    return fd


def _write_json(path: Path, obj: Any) -> None:
    """Atomic and durable: a marker that exists was wholly written after its rows."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _rows_sha(path: Path, a: int, b: int) -> str:
    emb = np.load(path, mmap_mode="r")
    return hashlib.sha256(memoryview(np.ascontiguousarray(emb[a:b]))).hexdigest()


def _mark_done(work: Path, index: int, rows: tuple[int, int], sha: str, build: str, rank: int) -> None:
    """The durable record that slice ``index`` is finished (tests wrap it to plant a kill)."""
    _write_json(work / DONE_DIR / f"{index:06d}.json",
                {"slice": index, "rows": list(rows), "sha256": sha, "build": build, "rank": rank})


def _valid(work: Path, slices: list[tuple[int, int]], build: str) -> list[int]:
    """The slices whose marker is this build's and whose rows still hash as marked; other
    markers (a torn or lost write, a file from elsewhere) are removed."""
    good = []
    for path in sorted((work / DONE_DIR).glob("[0-9]*.json")):
        try:
            mark = json.loads(path.read_text(encoding="utf-8"))
            i = int(mark["slice"])
            ok = (0 <= i < len(slices) and mark["build"] == build and tuple(mark["rows"]) == slices[i]
                  and _rows_sha(work / EMBEDDINGS, *slices[i]) == mark["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            ok, i = False, -1
        if ok:
            good.append(i)
        else:
            path.unlink(missing_ok=True)
    return good


def _prepare(work: Path, key: dict[str, Any], n_docs: int, dim: int) -> int:
    """Process 0: lock ``work`` and make it this build's, keeping what an interrupted run of
    the same build finished; returns the lock's fd."""
    work.mkdir(parents=True, exist_ok=True)
    lock = _take_lock(work)
    try:
        _claim(work, key, n_docs, dim)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _claim(work: Path, key: dict[str, Any], n_docs: int, dim: int) -> None:
    from numpy.lib.format import open_memmap

    try:
        old = json.loads((work / BUILD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    emb = work / EMBEDDINGS
    # nlink > 1: a finished build already hard-linked these embeddings into its index; writing
    # them would change that index, so start afresh (unlinking leaves the index its copy).
    same = old == key and emb.is_file() and emb.stat().st_nlink == 1
    if same:
        head = np.load(emb, mmap_mode="r")
        same = head.shape == (n_docs, dim) and head.dtype == np.float32
    if not same:
        if old is not None and old != key and any((work / DONE_DIR).glob("*.json")):
            changed = ", ".join(k for k in key if old.get(k) != key[k])
            err_console.print(f"[yellow]note:[/] {work}: discarding the encoded slices of another build "
                              f"(it differs in {changed})")
        (work / BUILD_FILE).unlink(missing_ok=True)  # first: a kill from here on leaves no claim
        shutil.rmtree(work / DONE_DIR, ignore_errors=True)
        emb.unlink(missing_ok=True)
        open_memmap(emb, mode="w+", dtype=np.float32, shape=(n_docs, dim)).flush()  # sparse until written
        (work / DONE_DIR).mkdir()
        _write_json(work / BUILD_FILE, key)


# ----------------------------------------------------------------------------- encoding


def _encode(launch: Launch, encoder, corpus: Path, n_docs: int, fingerprint: str, out: Path,
            opts: dict[str, Any], progress: Callable | None) -> tuple[dict[str, Any], list[tuple[int, int]], str]:
    """Every process: agree on the build, take a share of the pending slices, encode it;
    returns (what was encoded, for the manifest; the slices; the build's digest)."""
    import torch

    from zsearch_cli.retrieval.dense import passage_texts
    from zsearch_cli.retrieval.index_format import open_corpus

    rows = int(opts.get("encode_slice") or SLICE_ROWS)
    slices = slice_rows(n_docs, rows)
    key = build_key(encoder, fingerprint, n_docs, rows)
    keys = launch.gather((key, torch.get_num_threads()))
    for rank, (other, _) in enumerate(keys):
        if other != key:
            changed = ", ".join(f"{k}={key[k]!r} vs {other.get(k)!r}" for k in key if other.get(k) != key[k])
            raise ZsearchError(f"process {rank} would encode differently from process {launch.rank} ({changed}); "
                               "every process needs the same encoder, versions and kind of device")
    work, build = work_folder(out), _digest(key)
    plan = None
    if launch.rank == 0:
        launch.lock = _prepare(work, key, n_docs, encoder.dim)
        done = _valid(work, slices, build)
        pending = sorted(set(range(len(slices))) - set(done))
        if done:
            err_console.print(f"resuming the encode in {work}: {len(done)} of {len(slices)} slices were done, "
                              f"{len(pending)} to encode")
        plan = pending
    pending = launch.broadcast(plan)
    mine = deal(pending, launch.rank, launch.world)
    start = time.perf_counter()
    table = open_corpus(corpus)
    offset = np.load(work / EMBEDDINGS, mmap_mode="r").offset
    total = sum(slices[i][1] - slices[i][0] for i in mine)
    desc = f"encode ({encoder.device}, {launch.world} process{'es' if launch.world > 1 else ''})"
    with progress(desc, total) if progress is not None and total else contextlib.nullcontext() as advance:
        for i in mine:
            a, b = slices[i]
            vectors = encoder.encode(passage_texts(table.slice(a, b - a)), "passage", advance)
            # a map of just this slice: the other processes' rows are not touched, even by a flush
            part = np.memmap(work / EMBEDDINGS, dtype=np.float32, mode="r+", offset=offset + a * encoder.dim * 4,
                             shape=(b - a, encoder.dim))
            part[:] = vectors
            part.flush()  # the rows are on disk before the marker that says so
            del part
            _mark_done(work, i, (a, b), hashlib.sha256(memoryview(vectors)).hexdigest(), build, launch.rank)
    launch.barrier()  # every process's slices are written and marked
    seconds = time.perf_counter() - start
    encoded = sum(slices[i][1] - slices[i][0] for i in pending)
    record = {"processes": launch.world, "threads": [t for _, t in keys], "slices": len(slices),
              "slices_encoded": len(pending), "passages_encoded": encoded, "seconds": round(seconds, 3),
              "passages_per_s": round(encoded / seconds, 1) if encoded and seconds > 0 else None}
    return record, slices, build


def encode_dense(launch: Launch, corpus: Path, n_docs: int, fingerprint: str, out: Path, dense_dir: Path,
                 opts: dict[str, Any], progress: Callable) -> dict[str, Any]:
    """Process 0: the dense part of the index being built into ``out``, in ``dense_dir``
    (the temp folder's), with its manifest entry."""
    import faiss

    from zsearch_cli.retrieval.dense import FAISS_FILE, build_faiss, dense_info, plan_faiss_type

    encoder = load_encoder(launch, opts)
    spec = plan_faiss_type(opts["faiss_type"], n_docs, encoder.dim)  # fail on a bad type before the encode
    launch.broadcast((str(corpus), n_docs, fingerprint))
    work = work_folder(out)
    launch.encoded = True
    try:
        record, slices, build = _encode(launch, encoder, corpus, n_docs, fingerprint, out, opts, progress)
        done = _valid(work, slices, build)  # every row as marked: a lost write is a rerun, not a wrong index
        missing = sorted(set(range(len(slices))) - set(done))
        if missing:
            raise ZsearchError(f"{work}: {len(missing)} of {len(slices)} slices are not (or no longer) as marked "
                               f"done, first slice {missing[0]}; run the same command again to encode them")
        dense_dir.mkdir(parents=True, exist_ok=True)
        emb = np.load(work / EMBEDDINGS, mmap_mode="r")
        faiss.write_index(build_faiss(emb, spec), str(dense_dir / FAISS_FILE))
        del emb
        try:  # the same inode in the index: no copy of a 64 GB file, and the work stays whole until the index is in
            os.link(work / EMBEDDINGS, dense_dir / EMBEDDINGS)
        except OSError:  # a filesystem without hard links: move it (a kill now costs a re-encode)
            shutil.move(work / EMBEDDINGS, dense_dir / EMBEDDINGS)
    except BaseException:
        if launch.lock is not None and any((work / DONE_DIR).glob("*.json")):
            err_console.print(f"[yellow]note:[/] the encoded slices are kept in {work}; the same command resumes "
                              "them (delete the folder to free its space)")
        raise
    finally:
        if launch.lock is not None:
            os.close(launch.lock)  # finish() takes it again to remove the folder
            launch.lock = None
    if record["passages_per_s"]:
        err_console.print(f"encoded {record['passages_encoded']} passages in {record['seconds']:.1f} s by "
                          f"{launch.world} process(es), torch threads {record['threads']} "
                          f"({record['passages_per_s']:.0f} passages/s)")
    return {**dense_info(encoder, spec, opts["faiss_type"]), "encode": record}
