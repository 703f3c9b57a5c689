"""zsearch: train LLM search agents."""
__version__ = "0.1.0"
