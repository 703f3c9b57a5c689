"""Adopting an existing faiss index as an index's dense part, without re-encoding:
``zsearch index CORPUS --adopt-faiss e5_Flat.index --encoder intfloat/e5-base-v2``.

Search-R1's and FlashRAG's ``e5_Flat.index`` is a faiss ``IndexFlatIP`` of e5-base-v2
embeddings of ``"passage: " + contents`` (mean-pooled, L2-normalised, one per corpus line,
in corpus order), built by Search-R1's ``index_builder.py``. zsearch's own dense build makes
the same vectors, so such a file can be the dense part as it is, provided it really holds
this encoder's vectors of this corpus in this order. Nothing here can see how a file was
built, so the adoption measures it, before anything is written, cheapest first:

1. the header (no vector read): a flat index (exact search, vectors readable back), inner
   product, the encoder's dimension;
2. once the corpus is read: one vector per passage;
3. a sample (the first ``SAMPLE`` passages and ``SAMPLE`` seeded random ones) re-encoded
   here must match its stored vectors: unit norms, cosine >= ``MIN_COSINE``.

A sample that does not match is told apart, each with its own line: encoded with the other
passage prefix (re-encoding it with that prefix matches); a corpus in another order (the
passage re-encoded here is stored at another row: one top-1 search over the file); only
the longer passages differ (another ``--max-length``); else another encoder or pooling. The file itself is never copied (:mod:`.faiss_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zsearch_cli.data.corpus import join_contents
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.dense import E5_PREFIXES, Encoder
from zsearch_cli.retrieval.faiss_file import adopted_record, open_flat
from zsearch_cli.retrieval.index_format import corpus_batches

SAMPLE = 16
"""Passages checked from the start of the corpus, and again at seeded random rows: the
start catches an offset (a header line, a dropped first passage), the random rows a
change anywhere in the order."""
SAMPLE_SEED = 0
MIN_COSINE = 0.999
"""The same encoder in fp16 on a GPU (how Search-R1 built e5_Flat.index) and in fp32 here
agree to ~0.9999; another encoder, prefix or passage is far below (0.3-0.97 measured)."""
MAX_NORM_ERROR = 1e-3


def adopt_kinds(kinds: list[str], adopt_faiss: str | None) -> None:
    """An adoption replaces the dense part, so the kinds must have one."""
    if adopt_faiss and "dense" not in kinds:
        raise ZsearchError(f"--adopt-faiss makes the dense part, but --kind {','.join(kinds)} has none "
                           f"(use --kind dense, or hybrid to build BM25 beside it)")


class Adoption:
    """One ``--adopt-faiss`` file, its header checked against the encoder on construction
    (before the corpus is read); :meth:`adopt` checks it against the corpus."""

    def __init__(self, opts: dict[str, Any]):
        import faiss

        if opts.get("faiss_type", "Flat").strip() != "Flat":
            raise ZsearchError(f"--faiss-type {opts['faiss_type']} does not apply to --adopt-faiss: the adopted file "
                               f"is searched as it is (a Flat index)")
        self.path = Path(opts["adopt_faiss"]).expanduser()
        if not self.path.is_file():
            raise ZsearchError(f"--adopt-faiss {self.path}: no such file")
        self.name = self.path.name
        self.index = open_flat(self.path)
        if not isinstance(self.index, faiss.IndexFlat):
            raise ZsearchError(f"{self.name} is a faiss {type(self.index).__name__}; --adopt-faiss takes a Flat "
                               f"index (exact search, its vectors readable back), e.g. e5_Flat.index")
        if self.index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ZsearchError(f"{self.name} uses metric {_metric_name(self.index.metric_type)}, not inner product; "
                               f"zsearch's dense search is inner product over normalised vectors (cosine)")
        self.encoder = Encoder(opts["encoder"], opts["device"], int(opts["max_length"]), int(opts["batch_size"]),
                               query_prefix=opts.get("query_prefix"), passage_prefix=opts.get("passage_prefix"))
        if self.index.d != self.encoder.dim:
            raise ZsearchError(f"{self.name} holds {self.index.d}-dimensional vectors, encoder {opts['encoder']!r} "
                               f"makes {self.encoder.dim}; give the --encoder the file was built with")

    def adopt(self, corpus_file: Path, n_docs: int, part_dir: Path) -> dict[str, Any]:
        """Check the file against the corpus in ``corpus_file`` (Arrow, ``n_docs`` rows);
        returns the manifest's ``dense`` entry. ``part_dir`` gets no file of the adopted
        index, only the folder its seal goes in."""
        if self.index.ntotal != n_docs:
            raise ZsearchError(f"{self.name} holds {self.index.ntotal} vectors, the corpus has {n_docs} passages; "
                               f"give the corpus the index was built from (one vector per line)")
        rows = sample_rows(n_docs)
        texts = passage_texts_at(corpus_file, rows)
        stored = np.stack([self.index.reconstruct(int(r)) for r in rows])
        norms = np.linalg.norm(stored, axis=1)
        if np.abs(norms - 1).max() > MAX_NORM_ERROR:
            raise ZsearchError(f"{self.name}'s vectors are not L2-normalised (norms {norms.min():.3f} to "
                               f"{norms.max():.3f} in the sample); zsearch adopts normalised embeddings only")
        here = self.encoder.encode(texts, "passage")
        cosine = np.einsum("ij,ij->i", stored, here)
        if cosine.min() < MIN_COSINE:
            raise self._diagnose(rows, texts, stored, here, cosine)
        part_dir.mkdir(parents=True, exist_ok=True)
        enc = self.encoder
        return {"encoder": enc.name, "encoder_path": enc.path, "dim": enc.dim, "max_length": enc.max_length,
                "prefixes": list(enc.prefixes), "faiss_type": "Flat", "faiss_type_requested": "Flat",
                "pooling": "mean", "normalize": True, "passage_text": "contents",
                "adopted": {**adopted_record(self.path), "ntotal": int(self.index.ntotal), "metric": "inner_product",
                            "check": {"first": min(SAMPLE, n_docs), "random": len(rows) - min(SAMPLE, n_docs),
                                      "seed": SAMPLE_SEED, "min_cosine": round(float(cosine.min()), 6)}}}

    def _diagnose(self, rows: np.ndarray, texts: list[str], stored: np.ndarray, here: np.ndarray,
                  cosine: np.ndarray) -> ZsearchError:
        """The one-line error for a sample that does not match: which of prefix, order,
        truncation or encoder differs (each its own message)."""
        bad = np.flatnonzero(cosine < MIN_COSINE)
        worst = int(bad[np.argmin(cosine[bad])])
        what = f"{len(bad)} of {len(rows)} sampled passages"
        prefix = self.encoder.prefixes[1]
        other = "" if prefix else E5_PREFIXES[1]
        unprefixed = [texts[i] for i in bad]
        saved = self.encoder.prefixes
        self.encoder.prefixes = (saved[0], other)
        try:
            with_other = np.einsum("ij,ij->i", stored[bad], self.encoder.encode(unprefixed, "passage"))
        finally:
            self.encoder.prefixes = saved
        if with_other.min() >= MIN_COSINE:
            if prefix:
                return ZsearchError(f"{self.name} was encoded without the passage prefix {prefix!r} ({what}: cosine "
                                    f"{cosine[bad].min():.4f} with it, {with_other.min():.4f} without); "
                                    f"pass --passage-prefix '' (and --query-prefix '' if its queries had none)")
            return ZsearchError(f"{self.name} was encoded with the passage prefix {other!r} ({what}: cosine "
                                f"{cosine[bad].min():.4f} without it, {with_other.min():.4f} with); "
                                f"pass --passage-prefix {other!r} --query-prefix {E5_PREFIXES[0]!r}")
        # A full scan of the file, but only on this failure path: where is each passage stored?
        scores, found = self.index.search(np.ascontiguousarray(here[bad]), 1)
        moved = [(int(rows[i]), int(r)) for i, s, r in zip(bad, scores[:, 0], found[:, 0])
                 if s >= MIN_COSINE and r != rows[i]]
        if moved:
            row, at = moved[0]
            return ZsearchError(f"the corpus is in another order than {self.name}: passage {row} of the corpus is "
                                f"stored as vector {at} ({len(moved)} of {len(bad)} mismatched sampled passages "
                                f"found at other rows); give the corpus file the index was built from, in its order")
        # Another truncation: the short passages match and every mismatched one is longer than them.
        def count(text: str) -> int:
            return len(self.encoder.tokenizer(prefix + text, truncation=False)["input_ids"])

        good = [count(texts[i]) for i in np.flatnonzero(cosine >= MIN_COSINE)]
        longer = [count(t) for t in unprefixed]
        if good and max(good) < min(longer):
            return ZsearchError(f"{self.name} matches the sampled passages of up to {max(good)} tokens and none of "
                                f"the {len(longer)} longer ones ({min(longer)} tokens or more; cosine down to "
                                f"{cosine[bad].min():.4f}): it was built with another --max-length than "
                                f"{self.encoder.max_length}")
        return ZsearchError(f"{self.name} does not hold {self.encoder.name!r}'s embeddings of this corpus "
                            f"(mean-pooled, prefix {prefix!r}): cosine {cosine[worst]:.4f} at passage {int(rows[worst])} "
                            f"({what} below {MIN_COSINE}); give the --encoder (and pooling) the file was built with")


def sample_rows(n_docs: int) -> np.ndarray:
    """The first ``SAMPLE`` rows and ``SAMPLE`` seeded random rows after them, sorted."""
    first = np.arange(min(SAMPLE, n_docs))
    rest = n_docs - len(first)
    picked = np.random.default_rng(SAMPLE_SEED).choice(rest, size=min(SAMPLE, rest), replace=False) + len(first)
    return np.sort(np.concatenate([first, picked])).astype(np.int64)


def passage_texts_at(corpus_file: Path, rows: np.ndarray) -> list[str]:
    """What Search-R1's builder encoded for each of ``rows`` (sorted): the raw wiki-18
    ``contents`` string when the corpus has one, else ``"Title"\\ntext`` as zsearch's own
    dense build writes it. Read batch by batch: a ``take`` on the whole table would copy it."""
    out: list[str] = []
    start, todo = 0, list(rows)
    for batch in corpus_batches(corpus_file):
        end = start + batch.num_rows
        while todo and todo[0] < end:
            j = int(todo.pop(0)) - start
            contents = batch.column("contents")[j].as_py()
            title, text = batch.column("title")[j].as_py(), batch.column("text")[j].as_py() or ""
            out.append(contents if contents is not None else (join_contents(title, text) if title else text))
        if not todo:
            break
        start = end
    return out


def _metric_name(metric: int) -> str:
    import faiss

    names = {faiss.METRIC_L2: "L2", faiss.METRIC_INNER_PRODUCT: "inner product", faiss.METRIC_L1: "L1"}
    return names.get(metric, f"#{metric}")
