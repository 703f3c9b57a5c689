"""The single-turn baselines of ``zsearch eval`` (``direct``, ``cot``, ``rag``; docs/methods.md §2).

Our wording, in the style of Search-R1's template. All three end in the same ``<answer>`` tag,
so one extractor scores every method, the agent's multi-turn runs included.
"""

DIRECT_PROMPT = (
    "Answer the given question directly, inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)
COT_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. "
    "After reasoning, provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)
RAG_PROMPT = (
    "Answer the given question using the documents below. You may reason inside <think> and "
    "</think> first, then provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>.\n\nDocuments:\n{documents}\n\nQuestion: {question}"
)
