"""``zsearch search --search SPEC``: one query through any search backend, as a rich table.

For humans checking a backend by eye, in particular the ZeroSearch simulator, whose
quality is forced (``--quality``) instead of drawn from the curriculum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchRequest


def _print_table(title: str, passages: Sequence[Passage], note: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("id", no_wrap=True)
    table.add_column("title")
    table.add_column("text")
    for rank, p in enumerate(passages, start=1):
        table.add_row(str(rank), p.id, p.title, p.text)
    console = Console()
    console.print(table)
    if note:
        console.print(note)


def print_simulation(
    spec: str, query: str, question: str, answers: Sequence[str], quality: str, topk: int, **options: Any
) -> None:
    """One simulated search with a forced ``quality``; flags (padded, re-asked) are printed."""
    from zsearch_cli.search.simulated import make_simulated_search

    if not answers:
        raise ZsearchError("the simulator writes documents for a question and its answer: pass --answer")
    backend = make_simulated_search(spec, **options)
    request = SearchRequest(query, "cli", question, tuple(answers), 0)
    result = backend.simulate([request], topk, qualities=[quality])[0]
    flags = [f for f in ("padded", "reasked") if result.log.get(f)]
    note = f"flags: {', '.join(flags)} ({result.log['n_docs']} documents parsed)" if flags else None
    _print_table(f"{backend.name}: {quality} top-{topk} for {query!r}", result.passages, note)


def print_backend_search(spec: str, query: str, index_dir: Path, topk: int, question: str | None = None,
                         answers: Sequence[str] = ()) -> None:
    """One query through ``make_search_backend(spec)``."""
    from zsearch_cli.search.factory import make_search_backend

    backend = make_search_backend(spec, index_dir=index_dir)
    request = SearchRequest(query, "cli", question or query, tuple(answers), 0)
    passages = backend.search([request], topk)[0].passages
    _print_table(f"{backend.name} top-{topk} for {query!r}", passages, None if passages else "no results")
