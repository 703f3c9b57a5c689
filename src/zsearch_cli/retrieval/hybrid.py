"""Hybrid retrieval: BM25 and dense rankings fused with reciprocal-rank fusion (RRF).

    rrf(d) = sum over rankings r that contain d of 1 / (k + rank_r(d)),   rank from 1

with k = 60 (Cormack, Clarke & Buettcher, SIGIR 2009). RRF uses ranks only, so BM25
scores (unbounded) and cosine similarities (in [-1, 1]) need no calibration against each
other; a passage ranked well by both beats one ranked first by only one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

RRF_K = 60
DEPTH = 100
"""How deep each ranking is read before fusion: deeper than topk so a passage ranked,
say, 12th by both retrievers can still surface."""


def rrf_fuse(rankings: Sequence[Sequence[int]], topk: int, k: int = RRF_K) -> tuple[list[int], list[float]]:
    """Fuse best-first row lists into the top-``topk`` ``(rows, rrf scores)``.

    Negative rows (faiss's 'no result') are skipped. Ties go to the lower row number so the
    output is deterministic.
    """
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking, start=1):
            row = int(row)
            if row >= 0:
                scores[row] = scores.get(row, 0.0) + 1.0 / (k + rank)
    best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:topk]
    return [row for row, _ in best], [score for _, score in best]


def rrf_fuse_batch(
    first: np.ndarray, second: np.ndarray, topk: int, k: int = RRF_K
) -> tuple[list[list[int]], list[list[float]]]:
    """:func:`rrf_fuse` per query over two ``[n_queries, depth]`` row matrices."""
    rows, scores = [], []
    for a, b in zip(first, second):
        r, s = rrf_fuse((a, b), topk, k)
        rows.append(r)
        scores.append(s)
    return rows, scores
