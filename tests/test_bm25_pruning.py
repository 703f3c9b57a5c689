"""MaxScore pruning (retrieval/maxscore.py) returns exactly the exhaustive top-k, ties included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.bm25 import BLOCK_MAX_FILE, TERM_MAX_FILE, BM25Searcher
from zsearch_cli.retrieval.topk import top_k
from zsearch_cli.retrieval.index import build_index, load_index
from zsearch_cli.retrieval import maxscore
from zsearch_cli.retrieval.maxscore import (ImpactIndex, block_pointers, block_upper_bounds, kernel_top_k,
                                             kernel_top_k_batch, maxscore_top_k, term_upper_bounds)

needs_kernel = pytest.mark.skipif(not maxscore.KERNEL, reason="the C loop is not built (make setup builds it, "
                                                                "and make test refuses to run without it)")


def exhaustive(query: list[int], k: int, data, indices, indptr, n_docs: int):
    """The reference: bm25s's own accumulation (np.add.at in query order), then top_k."""
    scores = np.zeros(n_docs, dtype=np.float32)
    for t in query:
        np.add.at(scores, indices[indptr[t] : indptr[t + 1]], data[indptr[t] : indptr[t + 1]])
    return top_k(scores, k)


def random_csc(rng: np.random.Generator, n_docs: int, n_terms: int, levels: int):
    """A random impact index. ``levels`` distinct contribution values make ties common."""
    cols_idx, cols_data = [], []
    values = rng.uniform(0.1, 3.0, size=levels).astype(np.float32)
    for _ in range(n_terms):
        df = int(rng.integers(0, n_docs + 1)) if rng.random() < 0.8 else int(rng.integers(0, 4))
        docs = np.sort(rng.choice(n_docs, size=df, replace=False)).astype(np.int32)
        cols_idx.append(docs)
        cols_data.append(rng.choice(values, size=df))
    indptr = np.r_[0, np.cumsum([len(c) for c in cols_idx])].astype(np.int64)
    return np.concatenate(cols_data).astype(np.float32), np.concatenate(cols_idx), indptr


@pytest.mark.parametrize("small", [0, 10**9], ids=["maxscore", "compact"])
@pytest.mark.parametrize("seed", range(8))
def test_maxscore_equals_exhaustive_on_random_indexes(seed: int, small: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit-identical scores and identical rows, for k from 1 to beyond the number of
    matches, repeated terms, empty columns (unknown terms) and the empty query; with
    term bounds only and with block-max bounds (small blocks so lists span many); and
    the compact exhaustive path short queries take (``small``)."""
    monkeypatch.setattr(maxscore, "BLOCK", [2, 3, 4, 128][seed % 4])
    monkeypatch.setattr(maxscore, "SMALL", small)
    rng = np.random.default_rng(seed)
    n_docs, n_terms = int(rng.integers(1, 400)), int(rng.integers(1, 30))
    data, indices, indptr = random_csc(rng, n_docs, n_terms, levels=int(rng.integers(1, 6)))
    bounds = term_upper_bounds(data, indptr, chunk=int(rng.integers(1, 64)))
    blocks = block_upper_bounds(data, indptr, chunk_blocks=int(rng.integers(1, 64)))
    indexes = [ImpactIndex(data, indices, indptr, bounds, n_docs), ImpactIndex(data, indices, indptr, bounds, n_docs, blocks)]
    checked = 0
    for _ in range(150):
        query = rng.integers(0, n_terms, size=int(rng.integers(0, 9))).tolist()
        if rng.random() < 0.3 and query:  # repeated terms
            query += query[: int(rng.integers(1, len(query) + 1))]
        for k in (1, 3, 10, n_docs + 5):
            want_s, want_r = exhaustive(query, k, data, indices, indptr, n_docs)
            for ix in indexes:
                got_s, got_r = maxscore_top_k(query, k, ix)
                assert got_r.tolist() == want_r.tolist(), (query, k)
                assert got_s.tobytes() == want_s.astype(np.float32).tobytes(), (query, k)
            checked += len(want_r)
    assert checked > 0


@needs_kernel
@pytest.mark.parametrize("seed", range(12))
def test_c_loop_equals_exhaustive_on_random_indexes(seed: int) -> None:
    """The C loop (document-at-a-time MaxScore): bit-identical scores and identical rows to
    the reference, on indexes large enough that pruning and the non-essential seeks happen
    (up to 5,000 passages, long lists), few distinct contributions (ties everywhere), k from 1
    to beyond the matches, repeated terms, empty columns, and long queries."""
    rng = np.random.default_rng(100 + seed)
    n_docs, n_terms = int(rng.integers(1, 5000)), int(rng.integers(1, 60))
    data, indices, indptr = random_csc(rng, n_docs, n_terms, levels=int(rng.integers(1, 6)))
    ix = ImpactIndex(data, indices, indptr, term_upper_bounds(data, indptr), n_docs)
    checked = 0
    for _ in range(60):
        query = rng.integers(0, n_terms, size=int(rng.integers(1, 9 if rng.random() < 0.9 else 200))).tolist()
        if rng.random() < 0.3:  # repeated terms
            query += query[: int(rng.integers(1, len(query) + 1))]
        for k in (1, 2, 10, 100, n_docs + 5):
            want_s, want_r = exhaustive(query, k, data, indices, indptr, n_docs)
            got_s, got_r = kernel_top_k(query, k, ix)
            assert got_r.tolist() == want_r.tolist(), (query, k)
            assert got_s.tobytes() == want_s.astype(np.float32).tobytes(), (query, k)
            checked += len(want_r)
    assert checked > 0


@needs_kernel
def test_c_loop_ties_and_bad_input() -> None:
    # Six identical passages: top-2 must be rows 0 and 1 even though row 4 and 5 score more on
    # the second term (a loop that kept the first-found ties would differ once pruning starts).
    data = np.array([1.0] * 6 + [0.5, 0.5], dtype=np.float32)
    indices = np.array([0, 1, 2, 3, 4, 5, 4, 5], dtype=np.int32)
    indptr = np.array([0, 6, 8], dtype=np.int64)
    ix = ImpactIndex(data, indices, indptr, term_upper_bounds(data, indptr), 6)
    s, r = kernel_top_k([0], 2, ix)
    assert r.tolist() == [0, 1] and s.tolist() == [1.0, 1.0]
    s, r = kernel_top_k([0, 1], 3, ix)
    assert r.tolist() == [4, 5, 0] and s.tolist() == [1.5, 1.5, 1.0]
    assert kernel_top_k([], 3, ix)[1].tolist() == [] and kernel_top_k([0], 0, ix)[1].tolist() == []
    with pytest.raises(IndexError, match="outside the index's 2 terms"):
        kernel_top_k([2], 3, ix)  # the searcher never sends one; the loop still refuses it
    with pytest.raises(TypeError):
        kernel_top_k([0], 3, ImpactIndex(data.astype(np.float64), indices, indptr, ix.term_max, 6))


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
def test_c_batch_equals_the_reference_query_by_query(seed: int) -> None:
    """top_k_batch (one C call for a chunk of queries; what the searcher's threads run) gives
    every query exactly the reference list: queries of different lengths share its scratch
    buffers, so a buffer sized for the first query, or a heap not reset between queries, or
    hits written at the wrong row offset would show here. Empty queries get no hits, and the
    slots past a query's hits keep their fill value (-1 rows), as the searcher expects."""
    rng = np.random.default_rng(200 + seed)
    n_docs, n_terms = int(rng.integers(1, 3000)), int(rng.integers(1, 40))
    data, indices, indptr = random_csc(rng, n_docs, n_terms, levels=int(rng.integers(1, 5)))
    ix = ImpactIndex(data, indices, indptr, term_upper_bounds(data, indptr), n_docs)
    queries = [rng.integers(0, n_terms, size=int(rng.integers(0, 12 if rng.random() < 0.9 else 120))).tolist()
               for _ in range(80)]
    for k in (1, 3, 25, n_docs + 5):
        scores, rows = np.zeros((len(queries), k), np.float32), np.full((len(queries), k), -1, np.int64)
        kernel_top_k_batch(queries, k, ix, scores, rows)
        for i, query in enumerate(queries):
            want_s, want_r = exhaustive(query, k, data, indices, indptr, n_docs) if query else (
                np.zeros(0, np.float32), np.zeros(0, np.int64))
            assert rows[i, : len(want_r)].tolist() == want_r.tolist(), (i, query, k)
            assert (rows[i, len(want_r):] == -1).all() and (scores[i, len(want_r):] == 0).all()
            assert scores[i, : len(want_s)].tobytes() == want_s.astype(np.float32).tobytes(), (i, query, k)


@needs_kernel
def test_c_batch_refuses_bad_input() -> None:
    data = np.array([1.0, 0.5], dtype=np.float32)
    indices, indptr = np.array([0, 1], dtype=np.int32), np.array([0, 2], dtype=np.int64)
    ix = ImpactIndex(data, indices, indptr, term_upper_bounds(data, indptr), 2)
    out_s, out_r, counts = np.zeros(6, np.float32), np.zeros(6, np.int64), np.zeros(2, np.int64)
    kernel = maxscore._kernel
    with pytest.raises(IndexError, match="outside the index's 1 terms"):
        kernel.top_k_batch(indptr, indices, data, ix.term_max, np.array([0, 1], np.int64),
                           np.array([0, 1, 2], np.int64), 3, out_s, out_r, counts)
    with pytest.raises(ValueError, match="out of order"):
        kernel.top_k_batch(indptr, indices, data, ix.term_max, np.array([0, 0], np.int64),
                           np.array([0, 2, 1], np.int64), 3, out_s, out_r, counts)
    with pytest.raises(ValueError, match="outputs of queries"):
        kernel.top_k_batch(indptr, indices, data, ix.term_max, np.array([0, 0], np.int64),
                           np.array([0, 1, 2], np.int64), 4, out_s, out_r, counts)


def test_term_upper_bounds_are_column_maxima() -> None:
    """Every chunk size (1 splits every column across chunks) gives the plain column max."""
    rng = np.random.default_rng(7)
    data, _, indptr = random_csc(rng, 50, 40, levels=20)
    want = np.array([data[a:b].max() if b > a else 0 for a, b in zip(indptr[:-1], indptr[1:])], np.float32)
    for chunk in (1, 2, 3, 17, 1 << 20):
        assert term_upper_bounds(data, indptr, chunk).tolist() == want.tolist()


@pytest.mark.parametrize("block", [1, 2, 5, 128])
def test_block_upper_bounds_are_block_maxima(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxscore, "BLOCK", block)
    rng = np.random.default_rng(block)
    data, _, indptr = random_csc(rng, 60, 30, levels=50)
    ptr = block_pointers(indptr)
    want = []
    for t in range(len(indptr) - 1):
        col = data[indptr[t] : indptr[t + 1]]
        want += [col[i : i + block].max() for i in range(0, len(col), block)]
        assert ptr[t + 1] - ptr[t] == -(-len(col) // block)
    for chunk in (1, 3, 1 << 16):
        assert block_upper_bounds(data, indptr, chunk).tolist() == np.array(want, np.float32).tolist()


def test_ties_keep_the_lower_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six identical passages tie; top-2 must be rows 0 and 1 in both modes, wherever
    the pruning order visits them. A pruner keeping the first-found passages would
    return the highest-impact ones (rows 4, 5 after the 'x' term's visit)."""
    # term 0 = "a" in every passage with the same impact; term 1 = "x" only in rows 4, 5
    data = np.array([1.0] * 6 + [0.5, 0.5], dtype=np.float32)
    indices = np.array([0, 1, 2, 3, 4, 5, 4, 5], dtype=np.int32)
    indptr = np.array([0, 6, 8], dtype=np.int64)
    monkeypatch.setattr(maxscore, "SMALL", 0)
    ix = ImpactIndex(data, indices, indptr, term_upper_bounds(data, indptr), 6)
    s, r = maxscore_top_k([0], 2, ix)
    assert r.tolist() == [0, 1] and s.tolist() == [1.0, 1.0]
    s, r = maxscore_top_k([0, 1], 3, ix)
    assert r.tolist() == [4, 5, 0] and s.tolist() == [1.5, 1.5, 1.0]


def words_corpus(path: Path, rng: np.random.Generator, n_docs: int) -> list[str]:
    words = [f"w{i}" for i in range(40)]
    p = 1.0 / np.arange(1, 41) ** 1.1
    p /= p.sum()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 12)), p=p)) for _ in range(n_docs)]
    texts += texts[:20]  # exact duplicates: equal scores everywhere
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"d{i}", "title": "", "text": text}) + "\n")
    return words


@pytest.mark.parametrize("small", [0, 10**9])
def test_index_search_modes_agree_end_to_end(tmp_path: Path, small: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through build_index/load_index: the stored bounds, the default mode (maxscore),
    batched threaded search, unknown and empty queries."""
    monkeypatch.setattr(maxscore, "SMALL", small)
    rng = np.random.default_rng(3)
    words = words_corpus(tmp_path / "c.jsonl", rng, 300)
    out = build_index(tmp_path / "c.jsonl", tmp_path / "idx", {"kind": "bm25", "stemmer": "none", "stopwords": "none"})
    assert (out / "bm25" / TERM_MAX_FILE).is_file() and (out / "bm25" / BLOCK_MAX_FILE).is_file()
    index = load_index(out, n_threads=2)
    assert index._bm25.mode == "maxscore"  # the C loop where built, else the numpy one
    queries = [" ".join(rng.choice(words + ["zzunknown"], size=int(rng.integers(0, 8)))) for _ in range(200)]
    queries += ["", "zzunknown", "w0 w0 w0 w1"]
    for k in (1, 3, 50, 400):
        results = {}
        for mode in ("maxscore", "maxscore-numpy", "exhaustive"):
            index._bm25.mode = mode
            results[mode] = index._bm25.search(queries, k)
        for mode in ("maxscore", "maxscore-numpy"):
            assert results[mode][1].tolist() == results["exhaustive"][1].tolist()
            assert results[mode][0].tobytes() == results["exhaustive"][0].tobytes()


def test_unknown_mode_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    words_corpus(tmp_path / "c.jsonl", np.random.default_rng(0), 10)
    out = build_index(tmp_path / "c.jsonl", tmp_path / "idx", {"kind": "bm25"})
    monkeypatch.setenv("ZSEARCH_BM25_SEARCH", "wand")
    with pytest.raises(ZsearchError, match="unknown BM25 search mode 'wand'"):
        load_index(out)
    monkeypatch.setenv("ZSEARCH_BM25_SEARCH", "exhaustive")
    assert load_index(out)._bm25.mode == "exhaustive"


def test_index_without_stored_bounds_still_searches(tmp_path: Path) -> None:
    """An index built before MaxScore has no term_max.npy: bounds are computed at load."""
    rng = np.random.default_rng(5)
    words = words_corpus(tmp_path / "c.jsonl", rng, 100)
    out = build_index(tmp_path / "c.jsonl", tmp_path / "idx", {"kind": "bm25", "stemmer": "none", "stopwords": "none"})
    stored = [np.load(out / "bm25" / name) for name in (TERM_MAX_FILE, BLOCK_MAX_FILE)]
    for name in (TERM_MAX_FILE, BLOCK_MAX_FILE):
        (out / "bm25" / name).unlink()
    # (load_index's per-part checks refuse such a directory; the searcher itself copes)
    searcher = BM25Searcher(out / "bm25", json.loads((out / "manifest.json").read_text())["bm25"])
    assert searcher.impacts.term_max.tolist() == stored[0].tolist()
    assert searcher.impacts.block_max.tolist() == stored[1].tolist()
    assert searcher.search([words[0] + " " + words[5]], 3)[1][0, 0] >= 0
