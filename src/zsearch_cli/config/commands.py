"""The options of each command that has no library config of its own (``zsearch eval``,
``collect``, ``serve`` …): its own fields, and the shared parts of ``config/parts.py`` it
uses. ``TrainConfig`` and ``SFTConfig`` live beside their trainers.

Light on purpose (no typer, no torch): the CLI imports it to build ``--help``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from zsearch_cli.config.fields import Options, option, part
from zsearch_cli.config.parts import (DatasetOptions, ModelOptions, ProposerOptions, RetrievalOptions, RolloutOptions,
                                      SearchConfig, Seeded, SimOptions, Subset)
from zsearch_cli.config.ranges import AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, Range


@dataclass(kw_only=True)
class IndexOptions(Options):
    """``zsearch index``."""

    runtime: ModelOptions = part(ModelOptions, exclude=("model", "backend", "dtype"))

    corpus: Optional[Path] = option(None, argument=True)
    """Corpus jsonl(.gz)/Parquet [the bundled demo corpus]."""
    out: Path = option(Path("runs/index"), flags=("--out", "-o"), aliases=("output_dir",))
    """Index directory to write."""
    kind: Optional[str] = None
    """Comma list of bm25, dense (hybrid = bm25,dense) [bm25; dense with --adopt-faiss]."""
    bm25_backend: str = "bm25s"
    """bm25s (fast, default) or rank-bm25 (reference)."""
    bm25_preset: str = "zsearch"
    """BM25 defaults: zsearch, or pyserini (Lucene's English analyzer + BM25Similarity, k1 0.9, b 0.4:
    Search-R1/DSPO's retriever)."""
    k1: Optional[float] = option(None, range=AT_LEAST_0)
    """BM25 term-frequency saturation [1.2; pyserini 0.9]."""
    b: Optional[float] = option(None, range=FRACTION)
    """BM25 length normalisation [0.75; pyserini 0.4]."""
    stemmer: Optional[str] = None
    """Snowball stemmer language, 'porter-lucene', or 'none' [english; pyserini porter-lucene]."""
    stopwords: Optional[str] = None
    """Stopword list: 'en' (Lucene's 33) or 'none' [en]."""
    encoder: str = "minilm"
    """Dense encoder: HF id or local path; 'minilm' is the bundled default."""
    query_prefix: Optional[str] = None
    """Text put before each query for the encoder; '' for none ['query: ' for e5 encoders, else none]."""
    passage_prefix: Optional[str] = None
    """Text put before each passage for the encoder; '' for none ['passage: ' for e5 encoders, else none]."""
    adopt_faiss: Optional[Path] = None
    """An existing faiss Flat inner-product index of --encoder's embeddings of CORPUS (Search-R1's e5_Flat.index)
    as the dense part, checked on a sample, memory-mapped and never copied, instead of encoding [none: encode]."""
    faiss_type: str = "Flat"
    """faiss index: Flat, HNSW32, IVF{n},PQ{m} (e.g. IVF1024,PQ64)."""
    batch_size: int = option(128, range=AT_LEAST_1)
    """Encoder batch size."""
    max_length: int = option(256, range=AT_LEAST_1)
    """Encoder max tokens per passage."""
    encode_slice: int = option(16384, range=AT_LEAST_1)
    """Passages per dense-encode slice: sorted by length on its own, the unit that processes of `accelerate
    launch` share and that a rerun resumes (docs/methods.md §7.1)."""


@dataclass(kw_only=True)
class QueryOptions(Options):
    """``zsearch search``."""

    retrieval: RetrievalOptions = part(RetrievalOptions)

    query: str = option(argument=True)
    """The query to search for."""
    topk: Optional[int] = option(None, flags=("--topk", "-k"), range=AT_LEAST_1)
    """Passages to show [3; 5 with the simulator]."""
    search: Optional[str] = option(None, param="search_spec")
    """Another backend instead of --index: sim:MODEL[?opt=v&..], sim+http://host:port/v1, http://host:port,
    serpapi, bm25, dense, hybrid."""
    question: Optional[str] = None
    """Simulator: the question the documents are for [the query]."""
    answer: Optional[list[str]] = None
    """Simulator: a gold answer (repeatable; the first is used) [none]."""
    quality: str = "useful"
    """Simulator: useful or noisy documents."""
    sim_mode: Optional[str] = None
    """Simulator prompt: sft (paper Table 2) or prompt (one-shot) [sft]."""
    sim_model: Optional[str] = None
    """sim+http: the server's model name [GET /v1/models, first id]."""


@dataclass(kw_only=True)
class ServeOptions(Options):
    """``zsearch serve``."""

    retrieval: RetrievalOptions = part(RetrievalOptions)
    sim: SimOptions = part(SimOptions)

    search: Optional[str] = option(None, param="search_spec")
    """Serve another backend instead of --index: http://host:port[,http://host2:port] (a caching proxy over
    replicas), serpapi[?engine=..&base_url=..], sim:MODEL[?opt=v&..], sim+http://host:port/v1, bm25, dense, hybrid."""
    workers: int = option(1, range=AT_LEAST_1)
    """Server processes (uvicorn workers) sharing the port and the memory-mapped index; each has its own LRU
    cache. Not with the simulator."""
    serpapi_cache: Optional[Path] = None
    """--search serpapi: the on-disk answer cache (SQLite, shared by the workers; 'off' disables it)
    [$ZSEARCH_CACHE/serpapi.sqlite]."""

    host: str = "127.0.0.1"
    """Bind address; anything but loopback must be asked for explicitly."""
    port: int = option(8000, range=Range(0, 65535, why="0 picks a free port"))
    """TCP port; 0 picks a free one (printed at start)."""
    max_queries: int = option(8192, range=AT_LEAST_1)
    """Most queries one request may carry (Search-R1's GRPO sends 2560)."""
    max_topk: int = option(100, range=AT_LEAST_1)
    """Largest topk a request may ask for."""
    cache_size: int = option(100_000, range=AT_LEAST_0)
    """LRU cache entries keyed by (query, topk, index)."""
    cache_mb: int = option(512, range=AT_LEAST_0)
    """LRU cache memory bound in MiB (estimated; 0 turns the cache off)."""


@dataclass(kw_only=True)
class ShowOptions(Options):
    """``zsearch show``."""

    file: Path = option(argument=True)
    """A trajectory, rollout (train --save-rollouts) or eval examples Parquet file."""
    ids: Optional[list[str]] = option(None, flags=("--id",))
    """Only this trajectory id, or all samples of a question id (repeatable) [all]."""
    where: Optional[str] = option(None, choices=("correct", "wrong"))
    """Only correct (EM 1) or wrong (EM 0) ones [both]."""
    limit: int = option(3, range=AT_LEAST_1)
    """Show at most this many."""


@dataclass(kw_only=True)
class PlotOptions(Options):
    """``zsearch plot``."""

    run_dir: Path = option(argument=True)
    """A `zsearch train` output folder."""
    out: Optional[Path] = option(None, flags=("--out", "-o"), aliases=("output_dir",))
    """PNG to write [RUN_DIR/curves.png]."""
    title: Optional[str] = option(None, flags=("--title",))
    """Figure title [zsearch train: RUN_DIR's name]."""


@dataclass(kw_only=True)
class EvalOptions(Seeded, Subset):
    """What ``zsearch eval`` runs; the CLI fills it from flags/YAML."""

    policy: ModelOptions = part(ModelOptions, exclude=("dtype",))
    retrieval: SearchConfig = part(SearchConfig)
    rollout: RolloutOptions = part(RolloutOptions, temperature=0.0)
    data: DatasetOptions = part(DatasetOptions)

    # execution: a rerun reuses saved rows across these (which rows, where, how batched)
    out: Path = option(Path("runs/eval"), flags=("--out", "-o"), aliases=("output_dir",), execution=True)
    """Output directory: OUT/KEY/METHOD.*.parquet; a rerun reuses rows only under equal options."""
    method: str = option("agent", choices=("direct", "cot", "rag", "agent"))
    """direct, cot, rag or agent (multi-turn search)."""
    batch_size: int = option(16, range=AT_LEAST_1, execution=True)
    """Questions per generation batch."""
    predictions: Optional[Path] = option(None, execution=True)
    """Score this predictions file (id, prediction[, golden_answers]) instead of a model [none]."""
    qa: Optional[Path] = option(None, execution=True)
    """With --predictions: QA file to join golden answers from by id [none: the predictions file's]."""
    pooled: bool = option(False, execution=True)
    """Also score each split file as one pooled dataset, KEY/pooled."""
    # each probe's rows are their own method (METHOD+PROBE), compared on their own
    probe: Optional[str] = option(None, execution=True)
    """Counterfactual retrievers, each scored as method METHOD+PROBE: comma list of real, empty (no
    passages), random, shuffled (ranks k+1..2k) and gold (a passage holding the answer first, from
    `zsearch audit`); prints reliance, gold headroom, over- and under-search [none: real only]."""


@dataclass(kw_only=True)
class ExportOptions(Options):
    """``zsearch export``: a trained model as a plain HF folder for another machine."""

    source: Path = option(argument=True)
    """A `zsearch train`/`sft` run folder (its final/, else its newest checkpoint), a checkpoint
    folder (OUT/checkpoints/step-N: its weights only) or a final folder."""
    out: Path = option(flags=("--out", "-o"), aliases=("output_dir",))
    """Folder to write: safetensors, tokenizer and chat template, config, a README model card."""
    merge_lora: bool = option(False, flags=("--merge-lora",))
    """A LoRA adapter: merge it into its base and write full weights (without: the adapter, naming its
    base portably)."""
    dtype: str = option("auto", choices=("auto", "float32", "bfloat16", "float16"))
    """Weights' dtype: auto (as stored; a merge keeps the base's), float32, bfloat16 or float16."""
    eval: Optional[Path] = option(None, flags=("--eval",), param="eval_dir")
    """A `zsearch eval --out` folder whose summaries go into the model card [the run folder's own]."""
    force: bool = option(False, flags=("--force",))
    """Replace a non-empty --out."""


@dataclass(kw_only=True)
class CollectOptions(Seeded, Subset):
    """What ``zsearch collect`` runs: ZeroSearch's settings (five documents, five turns)."""

    policy: ModelOptions = part(ModelOptions, exclude=("dtype",))
    retrieval: SearchConfig = part(SearchConfig)
    rollout: RolloutOptions = part(RolloutOptions, topk=5, max_turns=5)

    data: Optional[Path] = option(None, flags=("--data",))
    """QA file (jsonl/Parquet) [the bundled demo train split]."""
    out: Path = option(Path("runs/collect"), flags=("--out", "-o"), aliases=("output_dir",))
    """Directory for trajectories.parquet and queries.parquet."""
    samples_per_question: int = option(5, flags=("--samples-per-question", "-G"), range=AT_LEAST_1)
    """Trajectories per question."""
    batch_size: int = option(8, range=AT_LEAST_1)
    """Questions per generation batch; files are rewritten after each."""


@dataclass(kw_only=True)
class JudgeOptions(Seeded, Subset):
    """What ``zsearch judge`` runs; the CLI fills it from flags/YAML."""

    runtime: ModelOptions = part(ModelOptions, exclude=("model", "dtype"))

    queries: Path = option(argument=True)
    """queries.parquet from `zsearch collect` (the COLLECTED_QUERY artifact)."""
    judge_model: str = option(flags=("--judge-model",))
    """Local HF id/path/alias, the endpoint's model name, or rule:answer (a gold answer in the documents: no model)."""
    judge_url: Optional[str] = option(None, flags=("--judge-url",))
    """OpenAI-compatible API root, e.g. http://host:port/v1 (key: $OPENAI_API_KEY) [none: a local judge]."""
    judge_api: str = option("chat", flags=("--judge-api",))
    """Endpoint API: chat (/chat/completions) or completions (raw prompt)."""
    out: Path = option(Path("runs/judge"), flags=("--out", "-o"), aliases=("output_dir",))
    """Directory for judgments(.balanced).parquet."""
    batch_size: int = option(16, range=AT_LEAST_1)
    """Query rows per batch; the output is rewritten after each."""
    concurrency: int = option(8, range=AT_LEAST_1)
    """Endpoint: requests in flight at most."""
    timeout: float = option(60.0, range=POSITIVE)
    """Endpoint: seconds per request."""
    retries: int = option(3, range=AT_LEAST_0)
    """Endpoint: retries per request (bounded, exponential backoff)."""
    max_new_tokens: int = option(32, range=AT_LEAST_1)
    """Judge tokens per verdict (one short line; more only helps models that reason first)."""
    prefill_verdict: bool = option(False, flags=("--prefill-verdict",))
    """Local judge: start its reply with "Verdict:" (a small model, e.g. smollm2, answers in prose otherwise)."""
    balance: bool = option(False, flags=("--balance",))
    """Also write a useful/noisy-balanced set (majority downsampled, seeded by --seed)."""


@dataclass(kw_only=True)
class WarmupOptions(Subset):
    """``zsearch warmup-data``: teacher trajectories over a QA file (the model's tokenizer and
    chat template, real search results)."""

    policy: ModelOptions = part(ModelOptions, exclude=("backend", "device", "dtype"))
    retrieval: SearchConfig = part(SearchConfig, index=Path("runs/index"))
    # teacher trajectories: no sampling, so none of the sampling options
    rollout: RolloutOptions = part(RolloutOptions, exclude=("max_turns", "max_turn_tokens", "temperature", "top_p",
                                                          "rollout_mode", "search_concurrency"))


    qa: str = option(argument=True)
    """QA file (jsonl or Parquet) to play: each question, then its first gold answer."""
    out: Path = option(Path("runs/warmup/trajectories.parquet"), flags=("--out", "-o"), aliases=("output_dir",))
    """TRAJECTORY Parquet for `zsearch sft`."""


@dataclass(kw_only=True)
class GenerateOptions(Seeded):
    """``zsearch propose --generate-only``: write a QA set from a proposer checkpoint (the rollout
    settings are the drzero-proposer preset's unless set)."""

    policy: ModelOptions = part(ModelOptions, exclude=("dtype",))
    retrieval: SearchConfig = part(SearchConfig, index=Path("runs/index"))
    # the proposer's protocol is tool calls (Dr. Zero), fixed by its preset
    rollout: RolloutOptions = part(RolloutOptions, exclude=("protocol",))
    proposer: ProposerOptions = part(ProposerOptions)

    generate_only: bool = option(False, flags=("--generate-only",))
    """Write a QA set from the proposer without training."""
    out: Optional[Path] = option(None, flags=("--out", "-o"), aliases=("output_dir",))
    """Training: run directory [runs/propose]; --generate-only: output Parquet, PROPOSED_QA
    [runs/propose/questions.parquet]."""
    num_questions: int = option(64, range=AT_LEAST_1)
    """--generate-only: proposer prompts (one seed passage each)."""
    samples: int = option(4, range=AT_LEAST_1)
    """--generate-only: proposer samples per prompt; the best by format score is kept."""
    batch_size: int = option(16, range=AT_LEAST_1)
    """Proposer prompts per step (training) or per batch (generation)."""


@dataclass(kw_only=True)
class AgentServeOptions(Seeded):
    """``zsearch agent serve``: the search agent behind an OpenAI-compatible chat API (the engine
    and settings of ``zsearch eval --method agent``; a request's temperature, top_p, max_tokens
    and seed override the server's)."""

    policy: ModelOptions = part(ModelOptions, exclude=("dtype",))
    retrieval: SearchConfig = part(SearchConfig)
    rollout: RolloutOptions = part(RolloutOptions, temperature=0.0)

    host: str = "127.0.0.1"
    """Bind address; anything but loopback must be asked for explicitly."""
    port: int = option(8001, range=Range(0, 65535, why="0 picks a free port"))
    """TCP port; 0 picks a free one (printed at start)."""
    served_model_name: Optional[str] = None
    """The model id /v1/models lists and requests name [the --model value]."""
    max_concurrent: int = option(16, range=AT_LEAST_1)
    """Requests in flight at most, running or queued (one rollout runs at a time); more get a 429."""
    max_body_kb: int = option(1024, range=AT_LEAST_1)
    """Largest request body in KiB (a larger one gets a 413)."""


@dataclass(kw_only=True)
class AuditOptions(Subset):
    """``zsearch audit``: what a QA set can score on a corpus (docs/commands/audit.md)."""

    retrieval: RetrievalOptions = part(RetrievalOptions)
    data: DatasetOptions = part(DatasetOptions)

    out: Optional[Path] = option(None, flags=("--out", "-o"), aliases=("output_dir",))
    """Output directory: OUT/KEY/audit.{examples,summary}.parquet [INDEX/audit, where `zsearch eval`
    looks for it]."""


@dataclass(kw_only=True)
class DoctorOptions(Seeded):
    """``zsearch doctor``: the self-check to run on a machine before training on it
    (docs/commands/doctor.md). Give it the model, backend, dtype, search and rollout options of the
    training run it vouches for."""

    policy: ModelOptions = part(ModelOptions)
    retrieval: SearchConfig = part(SearchConfig)
    # three generations per prompt (two searches, then the final turn): several turns, in seconds
    rollout: RolloutOptions = part(RolloutOptions, max_turns=2)

    out: Path = option(Path("runs/doctor"), flags=("--out", "-o"), aliases=("output_dir",))
    """Folder for doctor.json."""
    checks: str = "environment,parity,sync,template,retrieval"
    """Comma list of the checks to run: environment, parity, sync, template, retrieval."""
    prompts: int = option(8, range=AT_LEAST_1)
    """K: demo questions rolled out for the parity check."""
    template_turns: int = option(3, range=Range(2, why="history needs an earlier turn"))
    """Assistant turns of the conversation the chat-template check builds."""
    concurrency: int = option(256, range=AT_LEAST_1)
    """Retrieval check: single-query requests in flight at once (slime's search_concurrency)."""
    requests: int = option(1024, range=AT_LEAST_1)
    """Retrieval check: single-query requests in all."""
    batch_requests: int = option(2, range=AT_LEAST_1)
    """Retrieval check: batch requests, all in flight at once."""
    batch_queries: int = option(2560, range=AT_LEAST_1)
    """Retrieval check: queries per batch request (Search-R1's GRPO turn: 512 prompts x 5)."""
    load_timeout: float = option(60.0, range=POSITIVE)
    """Retrieval check: seconds before a request counts as failed."""
