"""The ``zsearch`` command line: one thin typer command per stage.

Commands parse options and call library functions; all logic lives in the modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from zsearch_cli import __version__
from zsearch_cli.config import ConfigOption, resolved_options, stage

app = typer.Typer(
    name="zsearch",
    help="Train LLM search agents: Search-R1, ZeroSearch, DSPO and Dr. Zero as composable stages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zsearch {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """zsearch: index, search, roll out, train and evaluate search agents."""


# ----------------------------------------------------------------------------- index / search / serve


@app.command()
@stage
def index(
    corpus: Optional[Path] = typer.Argument(None, help="Corpus jsonl(.gz)/Parquet; default: the bundled demo corpus."),
    out: Path = typer.Option(Path("runs/index"), "--out", "-o", help="Index directory to write."),
    kind: str = typer.Option("bm25", "--kind", help="Comma list of bm25, dense (hybrid = bm25,dense)."),
    bm25_backend: str = typer.Option("bm25s", help="bm25s (fast, default) or rank-bm25 (reference)."),
    k1: float = typer.Option(1.2, help="BM25 term-frequency saturation."),
    b: float = typer.Option(0.75, help="BM25 length normalisation."),
    stemmer: str = typer.Option("english", help="Snowball stemmer language, or 'none'."),
    stopwords: str = typer.Option("en", help="Stopword list: 'en' or 'none'."),
    encoder: str = typer.Option("minilm", help="Dense encoder: HF id or local path; 'minilm' is the bundled default."),
    faiss_type: str = typer.Option("Flat", help="faiss index: Flat, HNSW32, IVF{n},PQ{m} (e.g. IVF1024,PQ64)."),
    batch_size: int = typer.Option(128, help="Encoder batch size."),
    max_length: int = typer.Option(256, help="Encoder max tokens per passage."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Build a BM25 and/or dense index over a corpus."""
    from zsearch_cli.retrieval.index import build_index

    build_index(corpus, out, options=resolved_options())


@app.command()
@stage
def search(
    query: str = typer.Argument(..., help="The query to search for."),
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index directory from `zsearch index`."),
    method: str = typer.Option("auto", help="bm25, dense, hybrid, or auto (hybrid when both exist)."),
    topk: int = typer.Option(3, "--topk", "-k", help="Passages to show."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Search an index and print the top-k as a table (for humans)."""
    from zsearch_cli.retrieval.index import print_search

    print_search(query, index_dir, method=method, topk=topk)


@app.command()
@stage
def serve(
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index directory from `zsearch index`."),
    host: str = typer.Option("127.0.0.1", help="Bind address; anything but loopback must be asked for explicitly."),
    port: int = typer.Option(8000, help="TCP port."),
    method: str = typer.Option("auto", help="bm25, dense, hybrid, or auto."),
    max_queries: int = typer.Option(512, help="Most queries one request may carry."),
    max_topk: int = typer.Option(100, help="Largest topk a request may ask for."),
    cache_size: int = typer.Option(100_000, help="LRU cache entries keyed by (query, topk, index)."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Serve an index over HTTP with Search-R1's /retrieve API."""
    from zsearch_cli.retrieval.server import run_server

    run_server(index_dir, host=host, port=port, method=method, max_queries=max_queries,
               max_topk=max_topk, cache_size=cache_size)


if __name__ == "__main__":  # pragma: no cover
    app()
