"""Search backends behind one interface: in-process index, HTTP, SerpAPI (and the
ZeroSearch simulator). See :func:`zsearch_cli.search.factory.make_search_backend`."""
