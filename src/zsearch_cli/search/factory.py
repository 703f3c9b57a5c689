"""``--search`` strings to backends, through a plain mapping of prefixes."""

from __future__ import annotations

from pathlib import Path

from zsearch_cli.errors import ZsearchError, shown_kind, shown_name

INDEX_METHODS = ("bm25", "dense", "hybrid", "auto", "index")


def is_simulated(spec: str) -> bool:
    """True for the ZeroSearch simulator's specs (``sim:…``, ``sim+http://…``): the backends
    whose documents an LLM writes, which the noise curriculum and validation care about."""
    return spec.strip().startswith(("sim:", "sim+"))


def make_search_backend(spec: str, index_dir: str | Path | None = None, **kwargs):
    """``bm25|dense|hybrid|auto`` (in-process index at ``index_dir``), ``http://host:port``
    (or replicas: ``http://a:8000,http://b:8000``), ``serpapi[?engine=…&base_url=…&cache=FILE]``,
    or the ZeroSearch simulator: ``sim:MODEL_OR_PATH`` (in-process) or
    ``sim+http://host:port/v1`` (an OpenAI-compatible server), either optionally followed by
    ``?option=value&…`` (see :class:`zsearch_cli.search.simulated.SimConfig`)."""
    spec = spec.strip()
    if is_simulated(spec):
        from zsearch_cli.search.simulated import make_simulated_search

        return make_simulated_search(spec, **kwargs)
    if spec in INDEX_METHODS:
        from zsearch_cli.search.local import IndexSearch

        if index_dir is None:
            raise ZsearchError(f"--search {spec} needs --index DIR (build one with `zsearch index`)")
        return IndexSearch(index_dir, method="auto" if spec == "index" else spec)
    if spec.startswith(("http://", "https://")):
        from zsearch_cli.search.http import HTTPSearch

        return HTTPSearch(spec, **kwargs)
    if spec == "serpapi" or spec.startswith("serpapi?"):
        from zsearch_cli.search.web import SerpAPISearch

        return SerpAPISearch(**{**serpapi_options(spec), **kwargs})
    raise ZsearchError(f"unknown --search {shown_kind(spec)}: use bm25, dense, hybrid, http://host:port, serpapi, "
                       "sim:MODEL or sim+http://host:port/v1")


SERPAPI_OPTIONS = ("engine", "base_url", "cache")


def serpapi_options(spec: str) -> dict[str, str]:
    """The ``?name=value&…`` options of a ``serpapi`` spec (engine, base_url, cache)."""
    _, _, query = spec.partition("?")
    options: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        name, eq, value = part.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in SERPAPI_OPTIONS:
            # neither the spec nor a name that is no plain word is echoed: either could hold a key
            what = f"option {shown_name(name)}" if eq else f"{shown_name(name)} has no value and"
            raise ZsearchError(f"--search serpapi: {what} is not one of {', '.join(SERPAPI_OPTIONS)} "
                               "(written serpapi?name=value&…; the key comes from SERPAPI_API_KEY)")
        options[name] = value.strip()
    return options
