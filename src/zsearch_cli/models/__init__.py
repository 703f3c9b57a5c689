"""Model loading and generation backends (HF transformers, vLLM)."""
