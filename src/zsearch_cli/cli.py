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
    ctx: typer.Context,
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

    options = resolved_options(ctx)
    path = build_index(corpus, out, options=options)
    typer.echo(f"index written to {path}")


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
    port: int = typer.Option(8000, help="TCP port; 0 picks a free one (printed at start)."),
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


# ----------------------------------------------------------------------------- eval


@app.command("eval")
@stage
def eval_(
    ctx: typer.Context,
    datasets: str = typer.Option("demo", help="demo (bundled test split), all (the seven benchmarks), a comma list, or QA files."),
    data_dir: Path = typer.Option(Path("data"), help="Benchmark files, FlashRAG layout: DATA_DIR/nq/test.jsonl."),
    download: bool = typer.Option(False, help="Fetch missing benchmark files from the FlashRAG hub dataset (network)."),
    out: Path = typer.Option(Path("runs/eval"), "--out", "-o", help="Output directory."),
    model: str = typer.Option("smollm2", help="HF id, local path, checkpoint dir, or the smollm2 alias."),
    method: str = typer.Option("agent", help="direct, cot, rag or agent (multi-turn search)."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port or serpapi."),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="Index directory for in-process search [runs/index]."),
    protocol: str = typer.Option("tags", help="tags (Search-R1) or tool_call (Dr. Zero)."),
    topk: int = typer.Option(3, help="Passages per search."),
    max_turns: int = typer.Option(4, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(500, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(500, help="Tokens per observation (whole passages are cut)."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response token budget."),
    batch_size: int = typer.Option(16, help="Questions per generation batch."),
    limit: Optional[int] = typer.Option(None, help="Only the first N examples of each dataset."),
    temperature: float = typer.Option(0.0, help="0 = greedy (default)."),
    seed: int = typer.Option(0, help="Sampling seed (when temperature > 0)."),
    backend: str = typer.Option("auto", help="hf, vllm or auto."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    predictions: Optional[Path] = typer.Option(None, help="Score this predictions file (id, prediction[, golden_answers]) instead of a model."),
    qa: Optional[Path] = typer.Option(None, help="With --predictions: QA file to join golden answers from by id."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Evaluate a model (EM, F1, subEM) per dataset, or score a predictions file."""
    from zsearch_cli.stages.evaluate import EvalOptions, evaluate, score_predictions

    options = resolved_options(ctx)
    if predictions is not None:
        score_predictions(predictions, qa, out, options)
        return
    evaluate(EvalOptions(
        datasets=datasets, data_dir=data_dir, download=download, out=out, model=model, method=method, search=search,
        index=index_dir, protocol=protocol, topk=topk, max_turns=max_turns, max_turn_tokens=max_turn_tokens,
        max_obs_tokens=max_obs_tokens, max_context_tokens=max_context_tokens, batch_size=batch_size,
        limit=limit, temperature=temperature, seed=seed, backend=backend, device=device,
    ), options)


# ----------------------------------------------------------------------------- Dr. Zero


@app.command()
@stage
def propose(
    ctx: typer.Context,
    generate_only: bool = typer.Option(False, "--generate-only", help="Write a QA set from the proposer without training."),
    out: Path = typer.Option(Path("runs/propose/questions.parquet"), "--out", "-o", help="Output Parquet (PROPOSED_QA)."),
    model: str = typer.Option("smollm2", help="Proposer model: HF id, path, checkpoint or smollm2."),
    solver_model: Optional[str] = typer.Option(None, help="Solver that measures difficulty [same as --model]."),
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index: seed passages and in-process search."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port or serpapi."),
    num_questions: int = typer.Option(64, help="Proposer prompts (one seed passage each)."),
    samples: int = typer.Option(4, help="Proposer samples per prompt; the best by format score is kept."),
    solver_samples: int = typer.Option(5, help="Solver answers per question (n of the difficulty reward)."),
    hop_ratio: str = typer.Option("4:3:2:1", help="Ratio of 1:2:3:4-hop questions."),
    seed: int = typer.Option(0, help="Seeds passages, hop draws and sampling."),
    topk: int = typer.Option(3, help="Passages per search."),
    max_turns: int = typer.Option(5, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(512, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(512, help="Tokens per tool response."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response budget."),
    temperature: float = typer.Option(1.0, help="Sampling temperature for proposer and solver."),
    batch_size: int = typer.Option(16, help="Proposer prompts per batch."),
    backend: str = typer.Option("auto", help="hf, vllm or auto."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Dr. Zero proposer: n-hop questions from corpus passages, rewarded by solver difficulty."""
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.stages.propose import GenerateOptions, generate_questions

    if not generate_only:
        raise ZsearchError("proposer training (HRPO) is not available yet; use --generate-only")
    opts = GenerateOptions(
        model=model, solver_model=solver_model, index=str(index_dir), search=search, num_questions=num_questions,
        samples=samples, solver_samples=solver_samples, hop_ratio=hop_ratio, seed=seed, topk=topk,
        max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_obs_tokens=max_obs_tokens,
        max_context_tokens=max_context_tokens, temperature=temperature, batch_size=batch_size,
        backend=backend, device=device,
    )
    generate_questions(opts, out, resolved_options(ctx))


if __name__ == "__main__":  # pragma: no cover
    app()
