"""A trained search agent behind an OpenAI-compatible chat API (``zsearch agent serve``)."""
