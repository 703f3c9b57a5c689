"""What a number can mean: the corpus ceiling (``zsearch audit``), counterfactual retrievers
(``zsearch eval --probe``) and the search-behaviour measures shared by probes and training.

- :mod:`.answers`: where a gold answer occurs (FlashRAG's normalisation, as a token sequence);
- :mod:`.corpus`: the audit of a QA set against an index (answerable, answer recall@k,
  support coverage), reusing the BM25 inverted index to find candidate passages;
- :mod:`.ceiling`: the audit that matches an eval (fingerprints), for the ceiling beside EM
  and the ``gold`` probe;
- :mod:`.behaviour`: per-trajectory search behaviour (searches after the answer appeared,
  repeated queries, answer in context) and the derived probe measures.

docs/commands/audit.md defines every number.
"""
