"""BM25: the tokenizer, hand-computed scores, bm25s == rank-bm25, and bm25s's own builder."""

from __future__ import annotations

import contextlib
import json
import math
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.bm25 import BM25Searcher, build_bm25
from zsearch_cli.retrieval.index import build_index, load_index
from zsearch_cli.retrieval.tokenize import Tokenizer

RAW = {"stemmer": "none", "stopwords": "none"}


def write_corpus(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"d{i}", "title": "", "text": text}) + "\n")
    return path


def scores_by_id(index, query: str, k: int = 5) -> dict[str, float]:
    return {p.id: p.score for p in index.search([query], k, "bm25")[0]}


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_lowercases_splits_drops_stopwords_and_stems() -> None:
    tok = Tokenizer("english", "en")
    assert tok.words("Dr. Zero_v2 RUNS, fast!") == ["dr", "zero", "v2", "runs", "fast"]
    assert tok.terms("The cats are running in the gardens") == ["cat", "run", "garden"]
    assert Tokenizer("none", "none").terms("The cats") == ["the", "cats"]
    assert Tokenizer("none", "en").terms("The cats") == ["cats"]


def test_tokenizer_encode_batch_matches_terms() -> None:
    """The cached indexing path gives the same terms as the plain query path."""
    tok, vocab = Tokenizer(), {}
    texts = ["The cats are running", "", "a an the", "Running cats, running dogs"]
    flat, lengths = tok.encode_batch(texts, vocab)
    inverse = {i: t for t, i in vocab.items()}
    got = np.split(flat, np.cumsum(lengths)[:-1])
    assert [[inverse[int(i)] for i in doc] for doc in got] == [Tokenizer().terms(t) for t in texts]


def test_tokenizer_rejects_unknown_options() -> None:
    with pytest.raises(ZsearchError, match="unknown stemmer 'klingon'"):
        Tokenizer("klingon", "en")
    with pytest.raises(ZsearchError, match="unknown stopword list 'fr'"):
        Tokenizer("english", "fr")


# ----------------------------------------------------------------------------- scores


HAND_CORPUS = [
    "cat dog",  # d0, |d| = 2
    "cat cat mouse",  # d1, |d| = 3
    "dog bird",  # d2, |d| = 2
    "fish",  # d3, |d| = 1
    "bird fish",  # d4, |d| = 2
]


@pytest.mark.parametrize("backend", ["bm25s", "rank-bm25"])
def test_scores_match_hand_computation(tmp_path: Path, backend: str) -> None:
    """BM25 (Lucene variant), k1 = 1.2, b = 0.75, no stemming or stopwords.

    N = 5, total length 2+3+2+1+2 = 10, avgdl = 10/5 = 2.
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))
      df = 2 (cat, dog, bird, fish): ln(1 + 3.5/2.5) = ln(2.4) = 0.875468737
      df = 1 (mouse):                ln(1 + 4.5/1.5) = ln(4)   = 1.386294361
    length norm K(d) = k1 * (1 - b + b * |d| / avgdl) = 1.2 * (0.25 + 0.75 * |d| / 2)
      |d| = 1: 1.2 * 0.625 = 0.75;  |d| = 2: 1.2 * 1.0 = 1.2;  |d| = 3: 1.2 * 1.375 = 1.65
    term score = idf * tf / (tf + K(d))
    """
    corpus = write_corpus(tmp_path / "c.jsonl", HAND_CORPUS)
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "bm25", "bm25_backend": backend, **RAW}))

    got = scores_by_id(index, "cat")
    # d1: tf 2, K 1.65 -> ln(2.4) * 2 / 3.65 = 0.875469 * 0.547945 = 0.479709
    # d0: tf 1, K 1.2  -> ln(2.4) * 1 / 2.2  = 0.875469 * 0.454545 = 0.397940
    assert list(got) == ["d1", "d0"]  # d2, d3, d4 lack 'cat': not hits
    assert got["d1"] == pytest.approx(0.479709, abs=1e-6)
    assert got["d0"] == pytest.approx(0.397940, abs=1e-6)

    got = scores_by_id(index, "mouse")
    # d1: tf 1, K 1.65 -> ln(4) / 2.65 = 1.386294 * 0.377358 = 0.523130
    assert got == {"d1": pytest.approx(0.523130, abs=1e-6)}

    got = scores_by_id(index, "fish")
    # d3: tf 1, K 0.75 -> ln(2.4) / 1.75 = 0.500268;  d4: K 1.2 -> ln(2.4) / 2.2 = 0.397940
    assert list(got) == ["d3", "d4"]
    assert got["d3"] == pytest.approx(0.500268, abs=1e-6)
    assert got["d4"] == pytest.approx(0.397940, abs=1e-6)

    got = scores_by_id(index, "dog bird")
    # d2 has both (tf 1 each, K 1.2): 2 * ln(2.4) / 2.2 = 0.795881; d0 (dog), d4 (bird): 0.397940
    assert got["d2"] == pytest.approx(0.795881, abs=1e-6)
    assert got["d0"] == pytest.approx(0.397940, abs=1e-6)
    assert got["d4"] == pytest.approx(0.397940, abs=1e-6)
    assert next(iter(got)) == "d2" and len(got) == 3

    assert scores_by_id(index, "zebra") == {}  # no known term: no hits, not random passages


def test_backends_give_identical_topk(tmp_path: Path) -> None:
    rng = random.Random(3)
    words = ("river rivers castle engines engine violin comet forests harbor running runs orbit "
             "piano the a of lantern falcon copper meadows volcano library").split()
    # Distinct lengths make score ties (and so tie-order differences) practically impossible.
    texts = [" ".join(rng.choice(words) for _ in range(3 + i)) for i in range(40)]
    corpus = write_corpus(tmp_path / "c.jsonl", texts)
    fast = load_index(build_index(corpus, tmp_path / "a", {"kind": "bm25", "bm25_backend": "bm25s"}))
    ref = load_index(build_index(corpus, tmp_path / "b", {"kind": "bm25", "bm25_backend": "rank-bm25"}))
    queries = ["river engine", "the running castles", "violin comet harbor", "meadow", "copper falcon lantern run"]
    got, want = fast.search(queries, 5, "bm25"), ref.search(queries, 5, "bm25")
    for g, w in zip(got, want):
        assert [p.id for p in g] == [p.id for p in w]
        assert [p.score for p in g] == pytest.approx([p.score for p in w], rel=1e-5)


def test_streamed_build_equals_bm25s_own_index(tmp_path: Path) -> None:
    """Our batched CSC writer stores exactly what ``bm25s.BM25(method='lucene').index`` does."""
    import bm25s

    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{j}" for j in rng.zipf(1.5, size=rng.integers(0, 30)) % 200) for _ in range(300)]
    batches = [pa.record_batch([[str(i) for i in range(s, min(s + 64, 300))], [""] * len(texts[s : s + 64]),
                                texts[s : s + 64]], names=["id", "title", "text"]) for s in range(0, 300, 64)]
    bars: dict[str, list[int]] = {}  # description -> [total, advanced]

    @contextlib.contextmanager
    def progress(description: str, total: int):
        bars[description] = [total, 0]
        yield lambda n: bars[description].__setitem__(1, bars[description][1] + n)

    info = build_bm25(batches, 300, tmp_path / "bm25", Tokenizer(), 1.5, 0.6, "bm25s", progress)
    ours = BM25Searcher(tmp_path / "bm25", info).model.scores
    # both passes show a bar that ends full: 300 passages tokenized, every posting placed
    assert bars == {"BM25 tokenize": [300, 300], "BM25 postings": [info["postings"], info["postings"]]}
    assert info["postings"] == len(ours["data"]) > 300

    vocab = json.loads((tmp_path / "bm25" / "vocab.index.json").read_text())
    docs = [Tokenizer().ids(" " + t, vocab) for t in texts]  # same term ids, one list per passage
    native = bm25s.BM25(k1=1.5, b=0.6, method="lucene")
    native.index((docs, vocab), show_progress=False)
    for key in ("indptr", "indices"):
        assert np.array_equal(np.asarray(ours[key]), np.asarray(native.scores[key])), key
    np.testing.assert_allclose(np.asarray(ours["data"]), native.scores["data"], rtol=1e-6)
    assert ours["num_docs"] == native.scores["num_docs"] == 300


def test_bm25_options_are_validated(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", HAND_CORPUS)
    with pytest.raises(ZsearchError, match="unknown BM25 backend 'lucene'"):
        build_index(corpus, tmp_path / "x", {"bm25_backend": "lucene"})
    with pytest.raises(ZsearchError, match="0 <= b <= 1"):
        build_index(corpus, tmp_path / "x", {"b": 1.5})
    assert not (tmp_path / "x").exists()


def test_lucene_idf_never_negative() -> None:
    """A term in every passage still scores > 0 (BM25Okapi would need an epsilon floor)."""
    from zsearch_cli.retrieval.bm25 import lucene_idf

    idf = lucene_idf(np.array([5, 4, 1, 0]), 5)
    assert idf[0] == pytest.approx(math.log(1 + 0.5 / 5.5))
    assert (idf[:3] > 0).all() and idf[3] == 0


# ----------------------------------------------------------------------------- top-k selection


def brute_force_topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Full sort, score desc then row asc, zero scores dropped, padded to k with (0, -1)."""
    order = [int(r) for r in np.lexsort((np.arange(len(scores)), -scores)) if scores[r] > 0][:k]
    rows = np.full(k, -1, dtype=np.int64)
    best = np.zeros(k, dtype=np.float32)
    rows[: len(order)] = order
    best[: len(order)] = scores[order]
    return best, rows


def test_top_k_equals_full_sort_with_ties_and_zeros() -> None:
    from zsearch_cli.retrieval.topk import top_k

    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 60))
        # Few distinct values (many ties), mostly zeros, sometimes no positive score at all.
        levels = rng.integers(0, 4, size=n).astype(np.float32) * (rng.random(n) < rng.random())
        scores = levels.astype(rng.choice([np.float32, np.float64]))
        for k in (1, 2, 3, 7, n - 1, n, n + 3):
            if k < 1:
                continue
            want_s, want_r = brute_force_topk(scores, k)
            hits = int((want_r >= 0).sum())
            # Candidates as posting lists give them: each positive row once per term it
            # has (1..repeats times), shuffled, plus some zero-score rows.
            repeats = int(rng.integers(1, 5))
            cand = np.repeat(np.arange(n), rng.integers(1, repeats + 1, size=n) * (scores > 0))
            zero = np.flatnonzero(scores == 0)
            cand = np.concatenate([cand, rng.choice(zero, size=min(len(zero), 3))]) if len(zero) else cand
            cand = rng.permutation(cand).astype(np.int32)
            for got_s, got_r in (top_k(scores, k), top_k(scores, k, cand, repeats)):
                assert got_r.tolist() == want_r[:hits].tolist(), (trial, k)
                assert got_s.tolist() == want_s[:hits].tolist(), (trial, k)


@pytest.mark.parametrize("backend", ["bm25s", "rank-bm25"])
def test_search_equals_full_sort_on_random_corpus(tmp_path: Path, backend: str) -> None:
    """BM25Searcher.search == brute force over the full score vector: best first, equal
    scores by lower row, zero scores never hits (row -1), fewer than k hits padded."""
    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(30)]
    p = 1.0 / np.arange(1, 31)
    p /= p.sum()
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 5), p=p)) for _ in range(250)]
    texts += texts[:50]  # exact duplicates: equal scores on different rows
    texts += [""] * 5  # passages no query can hit
    corpus = write_corpus(tmp_path / "c.jsonl", texts)
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "bm25", "bm25_backend": backend, **RAW}))
    searcher = index._bm25
    queries = ["w0", "w1 w2", "w0 w0 w3", "w28", "w29 w27", "w5 w17 w25", "unknown", "w0 unknown", ""]
    queries += [" ".join(rng.choice(words, size=rng.integers(1, 4))) for _ in range(40)]
    n = len(texts)
    boundary_ties = few_hits = 0
    for k in (1, 3, 10, 40, n, n + 2):
        got_s, got_r = searcher.search(queries, k)
        assert got_s.shape == got_r.shape == (len(queries), k)
        for q, gs, gr in zip(queries, got_s, got_r):
            full = searcher._scores(searcher.tokenizer.ids(q, searcher.vocab) or [searcher.empty_id])
            want_s, want_r = brute_force_topk(np.asarray(full), k)
            assert gr.tolist() == want_r.tolist(), (q, k)
            assert gs.tolist() == want_s.tolist(), (q, k)
            positive = np.sort(full[full > 0])[::-1]
            few_hits += len(positive) < k
            boundary_ties += len(positive) > k and positive[k - 1] == positive[k]
    assert boundary_ties and few_hits  # the cases that matter did occur
    # And the same through SearchIndex (k clamped to the corpus size, hits only).
    for q, hits in zip(queries, index.search(queries, 10, "bm25")):
        _, want_r = brute_force_topk(np.asarray(searcher._scores(searcher.tokenizer.ids(q, searcher.vocab)
                                                                 or [searcher.empty_id])), 10)
        assert [p.id for p in hits] == [f"d{r}" for r in want_r if r >= 0]
