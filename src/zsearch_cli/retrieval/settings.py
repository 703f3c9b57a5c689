"""The retriever settings an index's manifest fixes (method, corpus, BM25 k1/b/analyzer,
encoder): what a protocol records for a local index, and what ``zsearch serve`` reports in
``/health`` so that a remote retriever is recorded as fully (``protocol._retriever``)."""

from __future__ import annotations

from typing import Any


def index_settings(manifest: dict[str, Any], spec: str) -> dict[str, Any]:
    """The retriever fields an index's manifest fixes for a search method (bm25, dense,
    hybrid, or auto): method, corpus, BM25 k1/b/analyzer, encoder. ``zsearch serve`` reports
    the same in /health, so a remote retriever is recorded as fully as a local one."""
    kinds = manifest.get("kinds", [])
    method = spec if spec in ("bm25", "dense", "hybrid") else ("hybrid" if len(kinds) > 1 else kinds[0])
    params = manifest.get("params", {})
    out: dict[str, Any] = dict(retriever=method, corpus_fingerprint=manifest.get("corpus", {}).get("fingerprint"),
                               corpus_size=manifest.get("n_docs"))
    if method in ("bm25", "hybrid"):
        analyzer = f"{params.get('bm25_backend')} stemmer={params.get('stemmer')} stopwords={params.get('stopwords')}"
        if params.get("bm25_preset", "zsearch") != "zsearch":  # e.g. pyserini: Lucene's analyzer and norms
            analyzer = (f"preset={params['bm25_preset']} {analyzer} analyzer={params.get('analyzer')} "
                        f"norms={params.get('bm25_norms')}")
        out.update(bm25_k1=float(params["k1"]), bm25_b=float(params["b"]), bm25_analyzer=str(analyzer))
    if method in ("dense", "hybrid"):
        out["encoder"] = str(params.get("encoder"))
    return out
