"""Indexes (BM25, dense, hybrid), the retrieval server and its client."""
