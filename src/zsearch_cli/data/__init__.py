"""Corpus and QA loaders, and the bundled demo data."""
