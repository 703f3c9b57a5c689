"""BM25 over a streamed corpus, served by bm25s (default) or rank-bm25 (reference).

The scoring function (bm25s ``method="lucene"``, i.e. Lucene >= 8's BM25Similarity)::

    score(q, d) = sum over query terms t (duplicates counted) of
                  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

N is the number of passages, df(t) the passages containing t, tf(t, d) the count of t
in d, |d| the number of terms of d after stopword removal, avgdl the mean |d|.
Unlike rank_bm25.BM25Okapi (``idf = ln((N-df+0.5)/(df+0.5))`` with an epsilon floor and
a ``(k1 + 1)`` numerator) this idf is never negative, needs no floor, and ranks
identically under any k1; it is the variant Pyserini/Anserini and bm25s default to.
The rank-bm25 backend is :class:`LuceneBM25`, a ``rank_bm25.BM25`` subclass with this
exact formula, so both backends return the same top-k (bm25s stores float32 scores,
rank-bm25 sums float64: scores agree to ~1e-6 relative).

Build streams: each corpus batch is tokenized to flat term-id arrays and reduced to
``(doc, term, tf)`` postings spilled to disk; the CSC score matrix bm25s searches is
then filled column by column with a counting sort, written straight into bm25s's own
``.npy`` files and loaded back memory-mapped. Nothing holds one Python list per passage,
which is what ``bm25s.BM25.index`` would need for 21M passages. The build also stores
the pruning bounds: ``term_max.npy`` (per term) and ``block_max.npy`` (per 128 postings).

Search (bm25s backend): exact top-k by MaxScore with block-max skipping
(``maxscore.py``), identical to scoring every posting, ties included. The exhaustive
scorer stays as the reference: ``BM25Searcher(mode="exhaustive")`` or
``ZSEARCH_BM25_SEARCH=exhaustive``. numba is deliberately not used: with numba installed,
bm25s imports it and the vLLM CPU engine crashes at start-up.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, ContextManager, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.format import open_memmap
from rank_bm25 import BM25 as _RankBM25

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.maxscore import (
    BLOCK,
    KERNEL,
    ImpactIndex,
    block_upper_bounds,
    kernel_top_k_batch,
    maxscore_top_k,
    term_upper_bounds,
)
from zsearch_cli.retrieval.tokenize import Tokenizer
from zsearch_cli.retrieval.topk import top_k

BACKENDS = ("bm25s", "rank-bm25")
SEARCH_MODES = ("maxscore", "maxscore-numpy", "exhaustive")
"""How the bm25s backend finds the top-k: MaxScore pruning (default; its C loop, or the numpy
one where the C extension was not built; see maxscore.py), the numpy MaxScore loop, or
scoring every posting of every query term (the reference). All return identical lists.
``ZSEARCH_BM25_SEARCH=exhaustive`` selects the reference process-wide."""
TERM_MAX_FILE = "term_max.npy"
"""float32 [vocab]: each term's largest stored score contribution (MaxScore's bound)."""
BLOCK_MAX_FILE = "block_max.npy"
"""float32 [blocks]: the largest contribution of every ``maxscore.BLOCK`` consecutive
postings of each column (block-max skipping); term ``t``'s blocks start at
``maxscore.block_pointers(indptr)[t]``."""
VARIANT = "lucene"
EMPTY_TERM = ""
"""bm25s's convention: a term no passage has, so a query with no known terms still runs."""

_POSTINGS = (("doc", np.int32), ("term", np.int32), ("tf", np.int32))
_CHUNK = 1 << 21  # postings per pass when filling the CSC matrix (~100 MB of temporaries)
_TOKENIZE_ROWS = 8192  # passages tokenized at once: bounds the per-word Python strings alive


Progress = Callable[[str, int], ContextManager[Callable[[int], None]]] | None
"""``progress(description, total)``: a context manager yielding ``advance(n)`` (index.py's bar)."""


@contextlib.contextmanager
def _no_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def bm25_texts(batch: pa.RecordBatch) -> list[str]:
    """What BM25 indexes for a passage: its title and its text."""
    return pc.binary_join_element_wise(batch.column("title").fill_null(""),
                                       batch.column("text").fill_null(""), " ").to_pylist()


def _slices(batches: Iterable[pa.RecordBatch], rows: int) -> Iterable[pa.RecordBatch]:
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def lucene_idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """float32 idf per term, 0 for terms in no passage (only the empty term)."""
    df = np.asarray(df, dtype=np.float64)
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
    return np.where(df > 0, idf, 0.0).astype(np.float32)


def lucene_norm_lengths(lengths: np.ndarray) -> np.ndarray:
    """Each passage length as Lucene stores it: one byte per document
    (``SmallFloat.intToByte4``), decoded (``byte4ToInt``). Lengths below 24 are exact;
    above, only the 4 leading bits of ``length - 24`` survive (rounded down)."""
    free = 24  # NUM_FREE_VALUES = 255 - longToInt4(Integer.MAX_VALUE)
    x = np.asarray(lengths, dtype=np.int64) - free
    big = x >= 8  # 4 significant bits or more: keep the top 4
    bits = np.zeros_like(x)
    bits[big] = np.floor(np.log2(x[big])).astype(np.int64) + 1
    shift = np.maximum(bits - 4, 0)
    kept = (x >> shift) << shift
    return np.where(x < 0, lengths, np.where(big, kept, x) + free).astype(np.int64)


def lucene_scores(idf: np.ndarray, tf: np.ndarray, lengths: np.ndarray, avgdl: float, k1: float,
                  b: float) -> np.ndarray:
    """Per-(term, passage) scores in Lucene 9's BM25Similarity arithmetic, all float32::

        normInverse = 1f / (k1 * ((1 - b) + b * decodedLength / avgdl))
        score       = idf - idf / (1f + tf * normInverse)

    (algebraically ``idf * tf / (tf + k1 * (...))``; Lucene writes it this way to keep it
    monotonic in float arithmetic.)"""
    f = np.float32
    dl = lucene_norm_lengths(lengths).astype(f)
    norm_inv = f(1) / (f(k1) * ((f(1) - f(b)) + f(b) * dl / f(avgdl)))
    idf = np.asarray(idf, dtype=f)
    return (idf - idf / (f(1) + np.asarray(tf, dtype=f) * norm_inv)).astype(f)


# ----------------------------------------------------------------------------- build


def build_bm25(
    batches: Iterable[pa.RecordBatch],
    n_docs: int,
    out: Path,
    tokenizer: Tokenizer,
    k1: float,
    b: float,
    backend: str,
    progress: Progress = None,
    norms: str = "exact",
) -> dict:
    """Index ``batches`` (the corpus, in row order) into directory ``out``; returns manifest info.

    Two passes, each with its own bar from ``progress(description, total)``: tokenizing the
    passages (spilling (doc, term, tf) triples to disk), then placing every posting into the
    term-major arrays (at 21M passages, over a billion postings: the longer half).
    ``norms="lucene"`` scores as Lucene's BM25Similarity does (see :func:`lucene_scores`)."""
    progress = progress or _no_progress
    out.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    lengths = np.zeros(n_docs, dtype=np.int64)
    df = np.zeros(0, dtype=np.int64)
    spill = {name: open(out / f"_postings.{name}.bin", "wb") for name, _ in _POSTINGS}
    row = 0
    with progress("BM25 tokenize", n_docs) as on_rows, contextlib.ExitStack() as files:
        for fh in spill.values():
            files.callback(fh.close)
        for batch in _slices(batches, _TOKENIZE_ROWS):
            flat, lens = tokenizer.encode_batch(bm25_texts(batch), vocab)
            lengths[row : row + len(lens)] = lens
            # (doc, term) pairs -> unique with counts: one sort per batch, no Python loop.
            local = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
            keys, tf = np.unique((local << 32) | flat.astype(np.int64), return_counts=True)
            doc = (keys >> 32).astype(np.int32) + np.int32(row)
            term = (keys & 0xFFFFFFFF).astype(np.int32)
            doc.tofile(spill["doc"])
            term.tofile(spill["term"])
            tf.astype(np.int32).tofile(spill["tf"])
            if len(vocab) > len(df):  # grow geometrically: wiki-scale vocabularies reach millions
                df = np.concatenate([df, np.zeros(max(len(vocab) - len(df), len(df)), np.int64)])
            np.add.at(df, term, 1)  # each (doc, term) pair is unique: one passage per entry
            row += len(lens)
            on_rows(len(lens))
    vocab.setdefault(EMPTY_TERM, len(vocab))
    df = np.concatenate([df, np.zeros(max(0, len(vocab) - len(df)), np.int64)])[: len(vocab)]
    postings = {name: np.memmap(out / f"_postings.{name}.bin", dtype=dt, mode="r") if df.sum() else np.zeros(0, dt)
                for name, dt in _POSTINGS}
    avgdl = float(lengths.mean()) if n_docs else 0.0
    if backend == "bm25s":
        with progress("BM25 postings", int(df.sum())) as on_postings:
            _write_bm25s(out, postings, df, lengths, avgdl, n_docs, vocab, k1, b, norms, on_postings)
    else:
        for name, dt in _POSTINGS:
            np.save(out / f"postings.{name}.npy", np.asarray(postings[name], dtype=dt))
        np.save(out / "lengths.npy", lengths)
        _write_json(out / "vocab.index.json", vocab)
    del postings
    for name, _ in _POSTINGS:
        (out / f"_postings.{name}.bin").unlink()
    return {"backend": backend, "variant": VARIANT, "k1": k1, "b": b, "norms": norms, **tokenizer.config,
            **({"term_max": TERM_MAX_FILE, "block_max": BLOCK_MAX_FILE, "block_size": BLOCK}
               if backend == "bm25s" else {}),
            "vocab_size": len(vocab), "postings": int(df.sum()), "avg_doc_len": avgdl}


def _write_bm25s(out: Path, postings: dict, df: np.ndarray, lengths: np.ndarray, avgdl: float,
                 n_docs: int, vocab: dict[str, int], k1: float, b: float, norms: str = "exact",
                 on_postings: Callable[[int], None] = lambda n: None) -> None:
    """Fill bm25s's CSC arrays (column = term, row = doc, rows ascending) on disk.

    Per-entry arithmetic follows bm25s's own builder (float32 idf times float64 tf part,
    stored float32) so the stored scores equal what ``bm25s.BM25(method="lucene").index``
    would compute from the same tokens.
    """
    if norms == "lucene":  # Lucene counts only passages with at least one term
        doc_count = int(np.count_nonzero(lengths))
        avgdl = float(lengths.sum()) / doc_count if doc_count else 0.0
        idf = lucene_idf(df, doc_count)
    else:
        idf = lucene_idf(df, n_docs)
    indptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    data = open_memmap(out / "data.csc.index.npy", mode="w+", dtype=np.float32, shape=(nnz,))
    indices = open_memmap(out / "indices.csc.index.npy", mode="w+", dtype=np.int32, shape=(nnz,))
    fill = indptr[:-1].copy()  # next free slot of each column
    for start in range(0, nnz, _CHUNK):
        d = np.asarray(postings["doc"][start : start + _CHUNK])
        t = np.asarray(postings["term"][start : start + _CHUNK])
        tf = np.asarray(postings["tf"][start : start + _CHUNK], dtype=np.float32)
        if norms == "lucene":
            score = lucene_scores(idf[t], tf, lengths[d], avgdl, k1, b)
        else:
            tfc = tf / (k1 * ((1 - b) + b * lengths[d] / avgdl) + tf)
            score = (idf[t] * tfc).astype(np.float32)
        # Stable counting sort by term: docs arrive ascending, so each column stays sorted.
        order = np.argsort(t, kind="stable")
        st = t[order]
        starts = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
        sizes = np.diff(np.r_[starts, len(st)])
        pos = fill[st] + (np.arange(len(st)) - np.repeat(starts, sizes))
        fill[st[starts]] += sizes
        indices[pos] = d[order]
        data[pos] = score[order]
        on_postings(len(d))
    data.flush()
    indices.flush()
    np.save(out / TERM_MAX_FILE, term_upper_bounds(data, indptr))  # MaxScore's per-term bounds
    np.save(out / BLOCK_MAX_FILE, block_upper_bounds(data, indptr))  # and per-block bounds
    del data, indices
    np.save(out / "indptr.csc.index.npy", indptr)
    _write_json(out / "vocab.index.json", vocab)
    import bm25s

    _write_json(out / "params.index.json", {
        "k1": k1, "b": b, "delta": 0.5, "method": VARIANT, "idf_method": VARIANT, "dtype": "float32",
        "int_dtype": "int32", "num_docs": n_docs, "version": bm25s.__version__, "backend": "numpy",
    })


def _write_json(path: Path, obj: object) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False)


# ----------------------------------------------------------------------------- search


class LuceneBM25(_RankBM25):
    """``rank_bm25.BM25`` with the formula in this module's docstring (reference backend)."""

    def __init__(self, corpus: Sequence[Sequence], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        super().__init__(corpus)

    def _calc_idf(self, nd: dict) -> None:
        n = self.corpus_size
        self.idf = {word: math.log(1 + (n - freq + 0.5) / (freq + 0.5)) for word, freq in nd.items()}

    def get_scores(self, query: Sequence) -> np.ndarray:
        score = np.zeros(self.corpus_size)
        if not self.avgdl:  # every passage empty: nothing can match
            return score
        norm = self.k1 * (1 - self.b + self.b * np.array(self.doc_len) / self.avgdl)
        for q in query:
            q_freq = np.array([doc.get(q, 0) for doc in self.doc_freqs], dtype=np.float64)
            score += self.idf.get(q, 0.0) * (q_freq / (q_freq + norm))
        return score


class BM25Searcher:
    """Top-k BM25 over a built ``bm25/`` directory; ``search`` is batched and thread-safe.

    Scores come from bm25s's own scorer (``BM25.get_scores_from_ids``, the arithmetic its
    ``retrieve`` uses), the top-k from :func:`top_k`. Both only read the (memory-mapped)
    arrays, so concurrent callers need no lock; the tokenizer locks its stemmer itself.
    ``n_threads`` None = one per usable core (CPU affinity).
    """

    PARALLEL_MIN = 32
    """Batches at least this large are searched on ``n_threads`` threads (numpy's partition
    releases the GIL, bm25s's ``np.add.at`` scoring does not, so the gain is partial);
    smaller ones are not worth the hand-offs."""

    def __init__(self, directory: Path, info: dict, n_threads: int | None = None, mode: str | None = None):
        self.backend = info["backend"]
        self.tokenizer = Tokenizer(info["stemmer"], info["stopwords"], info.get("analyzer", "simple"))
        self.n_threads = _usable_cores() if n_threads is None else n_threads
        self.mode = mode or os.environ.get("ZSEARCH_BM25_SEARCH") or SEARCH_MODES[0]
        if self.mode not in SEARCH_MODES:
            raise ZsearchError(f"unknown BM25 search mode {self.mode!r} (choose from: {', '.join(SEARCH_MODES)})")
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        if self.backend == "bm25s":
            import bm25s

            self.model = bm25s.BM25.load(directory, mmap=True, load_vocab=True)
            # Plain ndarray views of the same mapped pages: np.memmap's per-slice subclass
            # bookkeeping costs ~3% of query time, which raw in-memory bm25s does not pay.
            for key in ("data", "indices", "indptr"):
                self.model.scores[key] = np.asarray(self.model.scores[key])
            self.vocab: dict[str, int] = self.model.vocab_dict
            sc = self.model.scores
            self.impacts = ImpactIndex(sc["data"], sc["indices"], sc["indptr"],
                                       _load_or(directory / TERM_MAX_FILE, term_upper_bounds, sc), sc["num_docs"],
                                       _load_or(directory / BLOCK_MAX_FILE, block_upper_bounds, sc))
        else:
            with open(directory / "vocab.index.json", encoding="utf-8") as fh:
                self.vocab = json.load(fh)
            self.model = LuceneBM25(_documents(directory), k1=info["k1"], b=info["b"])
        self.empty_id = self.vocab[EMPTY_TERM]

    def _scores(self, ids: Sequence[int]) -> np.ndarray:
        """One query's score for every passage (term ids, duplicates counted)."""
        if self.backend == "bm25s":
            return self.model.get_scores_from_ids(ids)
        return self.model.get_scores(ids)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:  # one pool for the searcher's lifetime: no per-batch thread start-up
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.n_threads, thread_name_prefix="zsearch-bm25")
            return self._pool

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)``, both shaped ``[len(queries), k]``, best first; row -1 = no hit.

        Equal scores come lower row first; passages with score 0 (no query term) are never
        hits, as in Lucene/Pyserini (idf > 0, so any matching term scores above 0)."""
        ids = [self.tokenizer.ids(q, self.vocab) or [self.empty_id] for q in queries]

        def one(q: list[int]) -> tuple[np.ndarray, np.ndarray]:
            if self.backend != "bm25s":
                return top_k(self._scores(q), k)
            indptr, indices = self.model.scores["indptr"], self.model.scores["indices"]
            if self.mode.startswith("maxscore"):
                return maxscore_top_k(q, k, self.impacts)
            # Only passages in a query term's posting list can score above 0.
            terms = sorted(set(q))
            postings = np.concatenate([indices[indptr[t] : indptr[t + 1]] for t in terms])
            return top_k(self._scores(q), k, postings, len(terms))

        scores = np.zeros((len(ids), max(k, 0)), dtype=np.float32)
        rows = np.full((len(ids), max(k, 0)), -1, dtype=np.int64)
        if self.backend == "bm25s" and self.mode == "maxscore" and KERNEL:
            # The C loop takes a chunk of queries per call; a big batch is cut into a few
            # chunks per thread (balanced even when some queries cost far more than others).
            parallel = len(ids) >= self.PARALLEL_MIN and self.n_threads > 1
            n_chunks = 4 * self.n_threads if parallel else 1
            bounds = np.linspace(0, len(ids), min(n_chunks, len(ids)) + 1).astype(int)
            chunks = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

            def chunk(span: tuple[int, int]) -> None:
                a, b = span
                kernel_top_k_batch(ids[a:b], k, self.impacts, scores[a:b], rows[a:b])

            if parallel:
                list(self._executor().map(chunk, chunks))
            else:
                for span in chunks:
                    chunk(span)
            return scores, rows
        if len(ids) >= self.PARALLEL_MIN and self.n_threads > 1 and self.backend == "bm25s":
            # Big batches (a GRPO step sends 2560 queries) go to the pool query by query:
            # numpy's sorts, searchsorted and partitions release the GIL.
            hits = list(self._executor().map(one, ids))
        else:
            hits = [one(q) for q in ids]
        for i, (s, r) in enumerate(hits):
            scores[i, : len(s)] = s
            rows[i, : len(r)] = r
        return scores, rows


def _load_or(path: Path, compute: Callable, scores: dict) -> np.ndarray:
    """A stored bound array (memory-mapped), or, for an index built before pruning
    existed, the same array computed now in one streaming pass over the scores."""
    if path.is_file():
        return np.load(path, mmap_mode="r")
    return compute(scores["data"], scores["indptr"])


def _usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _documents(directory: Path) -> list[list[int]]:
    """Rebuild each passage's term-id list (tf repeats, order lost) for rank-bm25.

    Postings are sorted by (doc, term) and a passage's tfs sum to its length, so the
    lengths alone cut the repeated-term stream into passages."""
    term, tf = np.load(directory / "postings.term.npy"), np.load(directory / "postings.tf.npy")
    lengths = np.load(directory / "lengths.npy")
    flat = np.repeat(term, tf).tolist()
    bounds = np.r_[0, np.cumsum(lengths)].tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]
