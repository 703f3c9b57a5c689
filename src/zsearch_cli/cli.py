"""The ``zsearch`` command line: one thin typer command per stage.

Commands parse options and call library functions; all logic lives in the modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from zsearch_cli import __version__, cli_drzero, cli_train
from zsearch_cli import cli_options as opt
from zsearch_cli.config import ConfigOption, OneLineErrors, resolved_options, stage

app = typer.Typer(
    name="zsearch",
    help="Train LLM search agents: Search-R1, ZeroSearch, DSPO and Dr. Zero as composable stages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: with rich markup on, "[whole batch]" or "[algo default 1e-6]"
    # would be parsed as a style tag and silently vanish from --help.
    rich_markup_mode=None,
    cls=OneLineErrors,
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
    bm25_preset: str = typer.Option("zsearch", help="BM25 defaults: zsearch, or pyserini (Lucene's English "
                                    "analyzer + BM25Similarity, k1 0.9, b 0.4: Search-R1/DSPO's retriever)."),
    k1: Optional[float] = typer.Option(None, help="BM25 term-frequency saturation [1.2; pyserini 0.9]."),
    b: Optional[float] = typer.Option(None, help="BM25 length normalisation [0.75; pyserini 0.4]."),
    stemmer: Optional[str] = typer.Option(None, help="Snowball stemmer language, 'porter-lucene', or 'none' "
                                          "[english; pyserini porter-lucene]."),
    stopwords: Optional[str] = typer.Option(None, help="Stopword list: 'en' (Lucene's 33) or 'none' [en]."),
    encoder: str = typer.Option("minilm", help="Dense encoder: HF id or local path; 'minilm' is the bundled default."),
    faiss_type: str = typer.Option("Flat", help="faiss index: Flat, HNSW32, IVF{n},PQ{m} (e.g. IVF1024,PQ64)."),
    batch_size: int = typer.Option(128, help="Encoder batch size."),
    max_length: int = typer.Option(256, help="Encoder max tokens per passage."),
    device: str = opt.DEVICE,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Build a BM25 and/or dense index over a corpus."""
    from zsearch_cli.retrieval.index import build_index

    options = resolved_options(ctx)
    path = build_index(corpus, out, options=options)
    typer.echo(f"index written to {path}")


@app.command()
@stage
def show(
    file: Path = typer.Argument(..., help="A trajectory, rollout (train --save-rollouts) or eval examples Parquet file."),
    ids: Optional[list[str]] = typer.Option(None, "--id", help="Only this trajectory id, or all samples of a question id (repeatable)."),
    where: Optional[str] = typer.Option(None, help="Only correct (EM 1) or wrong (EM 0) ones."),
    limit: int = typer.Option(3, help="Show at most this many."),
) -> None:
    """Print trajectories turn by turn: reasoning, queries, retrieved titles, answer, gold, reward."""
    from zsearch_cli.stages.show import show as show_trajectories

    show_trajectories(file, ids or (), where, limit)


@app.command()
@stage
def search(
    query: str = typer.Argument(..., help="The query to search for."),
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index directory from `zsearch index`."),
    method: str = typer.Option("auto", help="bm25, dense, hybrid, or auto (hybrid when both exist)."),
    topk: Optional[int] = typer.Option(None, "--topk", "-k", help="Passages to show [3; 5 with the simulator]."),
    search_spec: Optional[str] = typer.Option(
        None, "--search", help="Another backend instead of --index: sim:MODEL[?opt=v&..], sim+http://host:port/v1, "
        "http://host:port, serpapi, bm25, dense, hybrid."),
    question: Optional[str] = typer.Option(None, help="Simulator: the question the documents are for [the query]."),
    answer: Optional[list[str]] = typer.Option(None, help="Simulator: a gold answer (repeatable; the first is used)."),
    quality: str = typer.Option("useful", help="Simulator: useful or noisy documents."),
    sim_mode: Optional[str] = typer.Option(None, help="Simulator prompt: sft (paper Table 2) or prompt (one-shot) [sft]."),
    sim_model: Optional[str] = typer.Option(None, help="sim+http: the server's model name [GET /v1/models, first id]."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Search an index (or any --search backend) and print the top-k as a table (for humans)."""
    if search_spec is None:
        from zsearch_cli.retrieval.index import print_search

        print_search(query, index_dir, method=method, topk=topk or 3)
    elif search_spec.strip().startswith(("sim:", "sim+")):
        from zsearch_cli.search.show import print_simulation

        print_simulation(search_spec.strip(), query, question or query, answer or [], quality, topk or 5,
                         mode=sim_mode, model=sim_model)
    else:
        from zsearch_cli.search.show import print_backend_search

        print_backend_search(search_spec, query, index_dir, topk or 3, question, answer or [])


@app.command()
@stage
def serve(
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index directory from `zsearch index`."),
    host: str = typer.Option("127.0.0.1", help="Bind address; anything but loopback must be asked for explicitly."),
    port: int = typer.Option(8000, help="TCP port; 0 picks a free one (printed at start)."),
    method: str = typer.Option("auto", help="bm25, dense, hybrid, or auto."),
    max_queries: int = typer.Option(8192, help="Most queries one request may carry (Search-R1's GRPO sends 2560)."),
    max_topk: int = typer.Option(100, help="Largest topk a request may ask for."),
    cache_size: int = typer.Option(100_000, help="LRU cache entries keyed by (query, topk, index)."),
    cache_mb: int = typer.Option(512, help="LRU cache memory bound in MiB (estimated; 0 turns the cache off)."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Serve an index over HTTP with Search-R1's /retrieve API."""
    from zsearch_cli.retrieval.server import run_server

    run_server(index_dir, host=host, port=port, method=method, max_queries=max_queries,
               max_topk=max_topk, cache_size=cache_size, cache_bytes=cache_mb << 20)


# ----------------------------------------------------------------------------- eval


@app.command("eval")
@stage
def eval_(
    ctx: typer.Context,
    datasets: str = typer.Option("demo", help="demo (bundled test split), all (the seven benchmarks), a comma list, or QA "
                                 "files. Keys: nq/test under --data-dir, else the file's path."),
    data_dir: Path = typer.Option(Path("data"), help="Benchmark files, FlashRAG layout: DATA_DIR/nq/test.jsonl."),
    download: bool = typer.Option(False, help="Fetch missing benchmark files from the FlashRAG hub dataset (network)."),
    out: Path = typer.Option(Path("runs/eval"), "--out", "-o",
                             help="Output directory: OUT/KEY/METHOD.*.parquet; a rerun reuses rows only under equal options."),
    model: str = typer.Option("smollm2", help="HF id, local path, checkpoint dir, or the smollm2 alias."),
    method: str = typer.Option("agent", help="direct, cot, rag or agent (multi-turn search)."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port or serpapi."),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="Index directory for in-process search [runs/index]."),
    protocol: str = opt.PROTOCOL,
    topk: int = opt.TOPK,
    max_turns: int = typer.Option(4, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(500, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(500, help="Tokens per observation (whole passages are cut)."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response token budget."),
    batch_size: int = typer.Option(16, help="Questions per generation batch."),
    limit: Optional[int] = typer.Option(None, help="Only the first N examples of each dataset."),
    temperature: float = typer.Option(0.0, help="0 = greedy (default)."),
    seed: int = typer.Option(0, help="Sampling seed (when temperature > 0)."),
    backend: str = opt.BACKEND,
    device: str = opt.DEVICE,
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

# propose (HRPO training / --generate-only), solve and drzero live in cli_drzero.py (length only).
app.command()(cli_drzero.propose)
app.command()(cli_drzero.solve)
app.command()(cli_drzero.drzero)


# ----------------------------------------------------------------------------- ZeroSearch data: collect / judge


@app.command()
@stage
def collect(
    ctx: typer.Context,
    data: Optional[Path] = typer.Option(None, "--data", help="QA file (jsonl/Parquet); default: the bundled demo train split."),
    out: Path = typer.Option(Path("runs/collect"), "--out", "-o", help="Directory for trajectories.parquet and queries.parquet."),
    model: str = typer.Option("smollm2", help="Agent model: HF id, local path, checkpoint dir, or smollm2."),
    backend: str = opt.BACKEND,
    device: str = opt.DEVICE,
    search: str = typer.Option("bm25", help="A real engine: bm25, dense, hybrid, http://host:port or serpapi."),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="Index directory for in-process search [runs/index]."),
    protocol: str = typer.Option("tags", help="tags (Search-R1/ZeroSearch) or tool_call."),
    samples_per_question: int = typer.Option(5, "--samples-per-question", "-G", help="Trajectories per question."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (1.0: diverse queries)."),
    top_p: float = opt.TOP_P,
    seed: int = typer.Option(0, help="Sampling seed."),
    topk: int = typer.Option(5, help="Passages per search (ZeroSearch: 5)."),
    max_turns: int = typer.Option(5, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(500, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(500, help="Tokens per observation (whole passages are cut)."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response token budget."),
    batch_size: int = typer.Option(8, help="Questions per generation batch; files are rewritten after each."),
    limit: Optional[int] = typer.Option(None, help="Only the first N questions."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Collect agent trajectories against a real search engine and their query-document rows."""
    from zsearch_cli.stages.collect import CollectOptions, collect as run_collect

    run_collect(CollectOptions(
        data=data, out=out, model=model, backend=backend, device=device, search=search, index=index_dir,
        protocol=protocol, samples_per_question=samples_per_question, temperature=temperature, top_p=top_p,
        seed=seed, topk=topk, max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_obs_tokens=max_obs_tokens,
        max_context_tokens=max_context_tokens, batch_size=batch_size, limit=limit,
    ), resolved_options(ctx))


@app.command()
@stage
def judge(
    ctx: typer.Context,
    queries: Path = typer.Argument(..., help="queries.parquet from `zsearch collect`."),
    judge_model: str = typer.Option(..., "--judge-model", help="Local HF id/path/alias, or the endpoint's model name."),
    judge_url: Optional[str] = typer.Option(None, "--judge-url", help="OpenAI-compatible API root, e.g. http://host:port/v1 (key: $OPENAI_API_KEY)."),
    judge_api: str = typer.Option("chat", "--judge-api", help="Endpoint API: chat or completions."),
    out: Path = typer.Option(Path("runs/judge"), "--out", "-o", help="Directory for judgments(.balanced).parquet."),
    backend: str = typer.Option("auto", help="Local judge: hf, vllm or auto."),
    device: str = typer.Option("auto", help="Local judge: auto, cpu or cuda."),
    batch_size: int = typer.Option(16, help="Query rows per batch; the output is rewritten after each."),
    concurrency: int = typer.Option(8, help="Endpoint: requests in flight at most."),
    timeout: float = typer.Option(60.0, help="Endpoint: seconds per request."),
    retries: int = typer.Option(3, help="Endpoint: retries per request (bounded, exponential backoff)."),
    max_new_tokens: int = typer.Option(32, help="Judge tokens per verdict."),
    limit: Optional[int] = typer.Option(None, help="Only the first N query rows."),
    balance: bool = typer.Option(False, "--balance", help="Also write a useful/noisy-balanced set (majority downsampled)."),
    seed: int = typer.Option(0, help="Seed of --balance's downsampling."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Label each collected query's documents useful or noisy with an LLM judge (ZeroSearch §3.3)."""
    from zsearch_cli.stages.judge import JudgeOptions, judge as run_judge

    run_judge(JudgeOptions(
        queries=queries, judge_model=judge_model, out=out, judge_url=judge_url, judge_api=judge_api,
        backend=backend, device=device, batch_size=batch_size, concurrency=concurrency, timeout=timeout,
        retries=retries, max_new_tokens=max_new_tokens, limit=limit, balance=balance, seed=seed,
    ), resolved_options(ctx))


# ----------------------------------------------------------------------------- training

# train, plot, warmup-data, sft and simsft live in cli_train.py (length only).
app.command()(cli_train.train)
app.command()(cli_train.plot)
app.command("warmup-data")(cli_train.warmup_data)
app.command()(cli_train.sft)
app.command()(cli_train.simsft)


if __name__ == "__main__":  # pragma: no cover
    app()
