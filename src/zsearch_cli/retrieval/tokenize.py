"""The one BM25 tokenizer, shared by indexing and querying and by both BM25 backends.

A term is produced by (analyzer ``simple``, the default): lowercase -> split on anything
that is not a letter or digit (underscore included) -> drop stopwords -> Snowball-stem
(PyStemmer). Analyzer ``lucene`` with stemmer ``porter-lucene`` is Lucene's English chain
instead, as Pyserini runs it (see lucene_analyzer.py). Using one
function for corpus and queries, and for bm25s and rank-bm25, is what makes their
scores comparable at all: any difference in terms would show up as a score gap.
"""

from __future__ import annotations

import re
import threading
from typing import Iterable, Sequence

import numpy as np

from zsearch_cli.errors import ZsearchError

_WORD = re.compile(r"[^\W_]+")
"""Maximal runs of Unicode letters/digits: 'Dr. Zero_v2' -> ['dr', 'zero', 'v2']."""

STOPWORD_LISTS = ("en", "none")
ANALYZERS = ("simple", "lucene")
LUCENE_PORTER = "porter-lucene"
"""Porter's original algorithm as Lucene's PorterStemFilter runs it (not PyStemmer's)."""


def _stopwords(name: str) -> frozenset[str]:
    if name == "none":
        return frozenset()
    if name == "en":
        # Lucene's English stopword set, as shipped by bm25s: keeping the raw-bm25s
        # baseline (bench/bm25.py) and zsearch on the same list keeps them comparable.
        from bm25s.stopwords import STOPWORDS_EN

        return frozenset(STOPWORDS_EN)
    raise ZsearchError(f"unknown stopword list {name!r} (choose from: {', '.join(STOPWORD_LISTS)})")


def _stemmer(language: str):
    if language == "none":
        return None
    if language == LUCENE_PORTER:
        from zsearch_cli.retrieval.lucene_analyzer import porter_stem

        return porter_stem
    import Stemmer  # PyStemmer

    if language not in Stemmer.algorithms():
        raise ZsearchError(
            f"unknown stemmer {language!r} (choose 'none', '{LUCENE_PORTER}' or one of: "
            f"{', '.join(sorted(Stemmer.algorithms()))})"
        )
    return Stemmer.Stemmer(language)


class Tokenizer:
    """Text -> BM25 terms. Thread-safe: the PyStemmer object is guarded by a lock.

    ``encode_batch`` is the indexing fast path: it maps each distinct surface word to a
    term id once (a per-tokenizer cache), so stemming costs O(vocabulary), not O(tokens).
    """

    def __init__(self, stemmer: str = "english", stopwords: str = "en", analyzer: str = "simple"):
        if analyzer not in ANALYZERS:
            raise ZsearchError(f"unknown analyzer {analyzer!r} (choose from: {', '.join(ANALYZERS)})")
        self.stemmer_name = stemmer
        self.stopwords_name = stopwords
        self.analyzer = analyzer
        if analyzer == "lucene":
            from zsearch_cli.retrieval.lucene_analyzer import english_words

            self.words = english_words  # type: ignore[method-assign]
        self.stopwords = _stopwords(stopwords)
        self._stemmer = _stemmer(stemmer)
        self._lock = threading.Lock()
        self._word_ids: dict[str, int] = {}
        """surface word -> term id, or -1 for a stopword (filled by encode_batch)."""
        self._cache_vocab: dict[str, int] | None = None

    @property
    def config(self) -> dict[str, str]:
        return {"stemmer": self.stemmer_name, "stopwords": self.stopwords_name, "analyzer": self.analyzer}

    @staticmethod
    def words(text: str) -> list[str]:
        """Lowercased alphanumeric runs, before stopwords and stemming."""
        return _WORD.findall(text.lower())

    def _stem(self, words: list[str]) -> list[str]:
        if self._stemmer is None or not words:
            return words
        if self.stemmer_name == LUCENE_PORTER:  # pure Python: stateless, cached, no lock needed
            return [self._stemmer(w) for w in words]
        with self._lock:  # PyStemmer keeps C state and a cache: not safe to share
            return self._stemmer.stemWords(words)

    def terms(self, text: str) -> list[str]:
        """The terms of one text, in order, duplicates kept (BM25 counts them)."""
        return self._stem([w for w in self.words(text) if w not in self.stopwords])

    def terms_batch(self, texts: Sequence[str]) -> list[list[str]]:
        return [self.terms(t) for t in texts]

    def encode_batch(self, texts: Iterable[str], vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """Term ids of many texts as one flat int32 array plus per-text lengths.

        New terms are appended to ``vocab`` (term -> id, ids dense from 0). Returning flat
        arrays instead of one Python list per document keeps a corpus batch compact.
        """
        if vocab is not self._cache_vocab:  # the cache holds ids of one vocabulary only
            self._word_ids, self._cache_vocab = {}, vocab
        docs = [self.words(t) for t in texts]
        cache = self._word_ids
        new = {w for d in docs for w in d if w not in cache}
        if new:
            kept = sorted(w for w in new if w not in self.stopwords)
            for w in new - set(kept):
                cache[w] = -1
            for w, term in zip(kept, self._stem(kept)):
                cache[w] = vocab.setdefault(term, len(vocab))
        raw_lens = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        flat = np.fromiter((cache[w] for d in docs for w in d), dtype=np.int64, count=int(raw_lens.sum()))
        keep = flat >= 0
        doc_of = np.repeat(np.arange(len(docs)), raw_lens)
        lengths = np.bincount(doc_of[keep], minlength=len(docs))
        return flat[keep].astype(np.int32), lengths.astype(np.int64)

    def ids(self, text: str, vocab: dict[str, int]) -> list[int]:
        """Query-time term ids; terms the corpus never had are dropped (they score 0)."""
        return [vocab[t] for t in self.terms(text) if t in vocab]
