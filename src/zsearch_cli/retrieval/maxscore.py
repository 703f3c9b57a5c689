"""Exact BM25 top-k with MaxScore dynamic pruning, in numpy, over bm25s's CSC impact index.

The index stores, per term ``t``, the docs containing it (``indices``, ascending) and each
one's precomputed float32 score contribution (``data``), plus ``term_max[t]``, the largest
contribution in the column (computed at build time, stored as ``term_max.npy``).

Reference ("exhaustive") score of passage ``d`` for query tokens ``q_1..q_n`` (duplicates
kept, query order): the float32 running sum ``((0 + c(q_1,d)) + c(q_2,d)) + ...`` with
``c = 0`` when ``d`` lacks the term; bm25s's ``np.add.at`` over the concatenated columns
adds in exactly that order. Ranking: score descending, then lower row; zero scores are
never hits. :func:`maxscore_top_k` returns exactly that list (same float32 scores, same
tie order), but scores only passages that can still reach the current k-th best score.

Algorithm (MaxScore, term at a time, vectorised per term):

* unique query terms are visited by decreasing upper bound ``m_t * term_max[t]`` (``m_t``
  = the term's multiplicity in the query); ``rest[i]`` = sum of the bounds of terms i..end.
* ``theta`` = the k-th best exact score found so far (0 until k passages are scored).
  Before term ``i``: if ``rest[i] < theta`` stop. A passage not yet seen contains only
  terms ``i..end``, so it scores at most ``rest[i]`` and cannot enter the top-k, not even
  on a tie (strictly below the k-th best).
* Term ``i``'s passages not in an earlier visited term's list (those were settled when
  that term was visited) are candidates. Each gets an upper bound: its own exact
  contribution plus ``rest[i+1]``. The k candidates with the largest own contribution are
  scored in full first, which lifts ``theta`` early; then the rest are pruned
  (bound < theta) and the later terms' lists probed one by one with ``searchsorted``,
  tightening each survivor's bound (the probed contribution replaces the term's bound)
  and pruning again. Survivors get their exact score in query order and are merged into
  the running top-k.

Bounds are summed in float64 and inflated by ``(1 + 1e-6 * (n + 1))``: a float32 sum of
``n`` non-negative terms exceeds the exact sum by at most a factor ``(1 + 2^-24)^n``, so a
pruned passage's true float32 score is strictly below theta. Scores themselves are never
approximated, so the result equals exhaustive scoring bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import threading

import numpy as np

from zsearch_cli.retrieval.topk import top_k

BLOCK = 128
"""Postings per block-max block (the per-block bounds are ``block_max.npy``)."""
SMALL = 60_000
"""Queries with at most this many postings in all are scored exhaustively on the union of
their lists: below it, MaxScore's per-term Python steps cost more than they save."""
_local = threading.local()
_EMPTY = (np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64))

try:  # the same MaxScore, document at a time, in C (retrieval/_maxscore.c; built at install)
    from zsearch_cli.retrieval import _maxscore as _kernel
except ImportError:  # no C compiler at install time: the numpy loop below, same results
    _kernel = None
KERNEL = _kernel is not None
"""Whether the C loop is installed (``make test`` refuses to run without it)."""


def term_upper_bounds(data: np.ndarray, indptr: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
    """``max(data[indptr[t]:indptr[t+1]])`` per term (0 for empty columns), float32.

    Streams ``data`` in chunks so a memory-mapped 21M-passage index is read once, never
    copied whole."""
    n_terms = len(indptr) - 1
    out = np.zeros(n_terms, dtype=np.float32)
    nnz = int(indptr[-1])
    for start in range(0, nnz, chunk):
        stop = min(start + chunk, nnz)
        block = np.asarray(data[start:stop], dtype=np.float32)
        # terms whose columns intersect [start, stop)
        t0 = int(np.searchsorted(indptr, start, side="right")) - 1
        t1 = int(np.searchsorted(indptr, stop, side="left"))
        cuts = np.clip(indptr[t0 : t1 + 1], start, stop) - start
        nonempty = cuts[1:] > cuts[:-1]
        if not nonempty.any():
            continue
        starts = cuts[:-1][nonempty]
        maxima = np.maximum.reduceat(block, starts)
        terms = np.arange(t0, t1)[nonempty]
        np.maximum.at(out, terms, maxima)
    return out


def _probe(indices: np.ndarray, data: np.ndarray, start: int, stop: int, docs: np.ndarray) -> np.ndarray:
    """Contribution (float32, 0 if absent) of the column ``[start, stop)`` for each of ``docs``."""
    column = indices[start:stop]
    pos = np.searchsorted(column, docs)
    pos_c = np.minimum(pos, len(column) - 1)
    hit = column[pos_c] == docs
    return np.where(hit, data[start:stop][pos_c], np.float32(0)).astype(np.float32, copy=False)


def _compact_exhaustive(q: np.ndarray, k: int, ix: ImpactIndex) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive scoring of the query's lists into a per-thread scratch array that is
    zeroed again only where written (no O(passages) allocation or memset per query):
    ``np.add.at`` in query order is the reference's float32 arithmetic."""
    docs = np.concatenate([ix.indices[ix.indptr[t] : ix.indptr[t + 1]] for t in q])
    vals = np.concatenate([ix.data[ix.indptr[t] : ix.indptr[t + 1]] for t in q])
    scratch = getattr(_local, "scratch", None)
    if scratch is None or len(scratch) != ix.n_docs:  # one per thread (and corpus size)
        scratch = _local.scratch = np.zeros(ix.n_docs, dtype=np.float32)
    try:
        np.add.at(scratch, docs, vals)
        return top_k(scratch, k, docs, len(q))
    finally:
        scratch[docs] = 0


def _contains(indices: np.ndarray, start: int, stop: int, docs: np.ndarray) -> np.ndarray:
    """Whether each of ``docs`` is in the (ascending) column ``[start, stop)``."""
    column = indices[start:stop]
    pos = np.minimum(np.searchsorted(column, docs), len(column) - 1)
    return column[pos] == docs


def _merge(best_s: np.ndarray, best_r: np.ndarray, s: np.ndarray, r: np.ndarray, k: int):
    """The k best of two disjoint (score, row) sets, by (-score, row)."""
    s = np.concatenate([best_s, s])
    r = np.concatenate([best_r, r])
    keep = s > 0
    s, r = s[keep], r[keep]
    if len(s) > 4 * k:  # partition first: most candidates are far below the k-th
        kth = -np.partition(-s, k - 1)[k - 1]
        keep = s >= kth
        s, r = s[keep], r[keep]
    order = np.lexsort((r, -s))[:k]
    return s[order], r[order]


@dataclass
class ImpactIndex:
    """The arrays MaxScore reads (all may be memory-mapped): bm25s's CSC columns plus the
    stored bounds. ``block_max[block_ptr[t] + i]`` bounds postings ``[i*B, (i+1)*B)`` of
    term ``t``'s column (``B = BLOCK``)."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    term_max: np.ndarray
    n_docs: int
    block_max: np.ndarray | None = None
    block_ptr: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        if self.block_max is not None and self.block_ptr is None:
            self.block_ptr = block_pointers(self.indptr)


def block_pointers(indptr: np.ndarray) -> np.ndarray:
    """Where each term's blocks start in ``block_max`` (int64, len = vocab + 1)."""
    n_blocks = (np.diff(np.asarray(indptr, dtype=np.int64)) + BLOCK - 1) // BLOCK
    return np.r_[0, np.cumsum(n_blocks)].astype(np.int64)


def block_upper_bounds(data: np.ndarray, indptr: np.ndarray, chunk_blocks: int = 1 << 16) -> np.ndarray:
    """The max of every ``BLOCK`` consecutive postings of each column (float32), streamed."""
    ptr = block_pointers(indptr)
    n_blocks = int(ptr[-1])
    out = np.zeros(n_blocks, dtype=np.float32)
    nnz = int(indptr[-1])
    starts = np.asarray(indptr[:-1], dtype=np.int64)

    def first(ids: np.ndarray) -> np.ndarray:  # posting position where each block begins
        term = np.searchsorted(ptr, ids, side="right") - 1
        return starts[term] + (ids - ptr[term]) * BLOCK

    for c0 in range(0, n_blocks, chunk_blocks):
        c1 = min(c0 + chunk_blocks, n_blocks)
        at = first(np.arange(c0, c1))
        lo, hi = int(at[0]), (int(first(np.array([c1]))[0]) if c1 < n_blocks else nnz)
        out[c0:c1] = np.maximum.reduceat(np.asarray(data[lo:hi], dtype=np.float32), at - lo)
    return out


def kernel_top_k(query: Sequence[int], k: int, ix: ImpactIndex) -> tuple[np.ndarray, np.ndarray]:
    """:func:`maxscore_top_k` by the C loop (``retrieval/_maxscore.c``): the same list, bit
    for bit. The C loop goes document at a time: each candidate's bound is tightened list by
    list and it is scored exactly, in query order, only while it can still beat the k-th best
    score; it runs without the GIL, so a thread pool scales a batch over every core."""
    if k < 1 or len(query) == 0:
        return _EMPTY
    scores, rows = np.empty((1, k), dtype=np.float32), np.empty((1, k), dtype=np.int64)
    n = int(kernel_top_k_batch([query], k, ix, scores, rows)[0])
    return scores[0, :n], rows[0, :n]


def kernel_top_k_batch(queries: Sequence[Sequence[int]], k: int, ix: ImpactIndex,
                       scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """:func:`kernel_top_k` for many queries in one C call (one release of the GIL): the C
    loop writes query ``i``'s hits straight into ``scores[i]`` / ``rows[i]`` (C-contiguous
    ``[len(queries), k]`` float32 / int64, best first) and leaves the slots past them as they
    were. Returns each query's number of hits."""
    counts = np.zeros(len(queries), dtype=np.int64)
    if k < 1 or not len(queries):
        return counts
    lengths = np.fromiter((len(q) for q in queries), dtype=np.int64, count=len(queries))
    offsets = np.zeros(len(queries) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter((t for q in queries for t in q), dtype=np.int64, count=int(offsets[-1]))
    _kernel.top_k_batch(ix.indptr, ix.indices, ix.data, ix.term_max, tokens, offsets, k, scores, rows, counts)
    return counts


def maxscore_top_k(query: Sequence[int], k: int, ix: ImpactIndex) -> tuple[np.ndarray, np.ndarray]:
    """``(scores float32, rows int64)`` of the ``k`` best passages for term ids ``query``
    (query order, duplicates counted), identical to exhaustive scoring; see module doc."""
    if k < 1 or len(query) == 0:
        return _EMPTY
    data, indices, indptr = ix.data, ix.indices, ix.indptr
    q = np.asarray(query, dtype=np.int64)
    terms, mult = np.unique(q, return_counts=True)
    starts, stops = indptr[terms].astype(np.int64), indptr[terms + 1].astype(np.int64)
    present = stops > starts
    if not present.any():
        return _EMPTY
    if int((stops - starts).sum()) <= SMALL:
        return _compact_exhaustive(q, k, ix)
    bound = ix.term_max[terms].astype(np.float64) * mult
    # visit order: largest bound first; equal bounds: shorter list first
    visit = [int(i) for i in np.lexsort((stops - starts, -bound)) if present[i]]
    margin = 1.0 + 1e-6 * (len(q) + 1)
    rest = np.r_[np.cumsum(bound[visit][::-1])[::-1], 0.0]  # rest[j] = sum of bounds of visit[j:]
    slot = {int(t): i for i, t in enumerate(terms)}
    query_slots = [slot[int(t)] for t in q]
    best_s, best_r = _EMPTY

    def theta() -> float:
        return float(best_s[k - 1]) if len(best_s) >= k else 0.0

    for j, i in enumerate(visit):
        th = theta()
        if th > 0 and rest[j] * margin < th:
            break
        s0, length = int(starts[i]), int(stops[i] - starts[i])
        if th > 0 and ix.block_max is not None and length > BLOCK:
            # Block-max: skip whole blocks whose best posting cannot reach theta.
            t = int(terms[i])
            bmax = np.asarray(ix.block_max[ix.block_ptr[t] : ix.block_ptr[t + 1]], dtype=np.float64)
            live = np.flatnonzero((bmax * mult[i] + rest[j + 1]) * margin >= th)
            if not len(live):
                continue
            pos = (live[:, None] * BLOCK + np.arange(BLOCK)).ravel()
            pos = pos[pos < length] + s0
            docs, own = indices[pos].astype(np.int64), data[pos]
        else:
            docs = np.asarray(indices[s0 : s0 + length], dtype=np.int64)
            own = np.asarray(data[s0 : s0 + length], dtype=np.float32)
        if th > 0:
            alive = (own.astype(np.float64) * mult[i] + rest[j + 1]) * margin >= th
            docs, own = docs[alive], own[alive]
        # A passage in an earlier visited term's list was settled there (scored or pruned).
        for e in visit[:j]:
            if not len(docs):
                break
            fresh = ~_contains(indices, int(starts[e]), int(stops[e]), docs)
            docs, own = docs[fresh], own[fresh]
        if not len(docs):
            continue
        # Seed: the k candidates with the largest own contribution, scored in full first.
        if len(docs) > k:
            top = np.argpartition(-own, k - 1)[:k]
            mask = np.zeros(len(docs), dtype=bool)
            mask[top] = True
            groups = [(docs[mask], own[mask]), (docs[~mask], own[~mask])]
        else:
            groups = [(docs, own)]
        for g_docs, g_own in groups:
            s, r = _score_group(g_docs, g_own, i, j, visit, mult, starts, stops, rest, margin,
                                theta(), data, indices, query_slots)
            if len(s):
                best_s, best_r = _merge(best_s, best_r, s, r, k)
    return best_s, best_r


def _score_group(docs, own, i, j, visit, mult, starts, stops, rest, margin, th, data, indices, query_slots):
    """Exact scores of the candidates ``docs`` (first seen in term ``visit[j] == i``) that
    can still reach ``th``; the others are dropped."""
    contrib = {i: own}
    known = own.astype(np.float64) * mult[i]  # exact part of the bound, term by term
    for jj in range(j + 1, len(visit) + 1):
        if th > 0:
            alive = (known + rest[jj]) * margin >= th
            if not alive.all():
                docs, known = docs[alive], known[alive]
                contrib = {t: c[alive] for t, c in contrib.items()}
                if not len(docs):
                    return _EMPTY
        if jj == len(visit):
            break
        t = visit[jj]
        c = _probe(indices, data, int(starts[t]), int(stops[t]), docs)
        contrib[t] = c
        known += c.astype(np.float64) * mult[t]
    zero = np.zeros(len(docs), dtype=np.float32)
    score = np.zeros(len(docs), dtype=np.float32)
    for s in query_slots:  # float32, query order: the exhaustive path's exact arithmetic
        score += contrib.get(s, zero)
    return score, docs
