"""Every command's options, each declared once: the parts several commands share, and the
options of the commands that have no library config of their own.

Each field is one option: its default, its docstring (the ``--help`` text) and, through
:func:`~zsearch_cli.cli_options.option`, its flags and accepted range. A command's options
are a dataclass that composes parts with :func:`~zsearch_cli.cli_options.uses` (picking
fields and, where a paper's setting differs, their defaults) and declares its own fields;
:func:`~zsearch_cli.cli_options.command` makes the typer command from it. The training
configs (``TrainConfig``, ``SFTConfig``) compose the same parts.

Light on purpose: the CLI imports this module to build ``--help``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from zsearch_cli.cli_options import AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, Range, option, uses

# ----------------------------------------------------------------------------- shared parts


@dataclass(kw_only=True)
class ModelOptions:
    """The model a command loads and where it runs."""

    model: str = "smollm2"
    """HF id, local path, checkpoint dir, or the smollm2 alias."""
    backend: str = "auto"
    """Generation backend: hf, vllm or auto (vLLM with CUDA when installed)."""
    device: str = "auto"
    """auto, cpu or cuda (under accelerate launch: the process's device)."""
    dtype: str = "auto"
    """auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16."""


@dataclass(kw_only=True)
class SearchConfig:
    """The search backend the agent's queries go to."""

    search: str = "bm25"
    """bm25, dense, hybrid, http://host:port, serpapi, or (train, solve) the ZeroSearch simulator:
    sim:MODEL[?opt=v&..] or sim+http://host:port/v1."""
    index: Optional[Path] = option(None, flags=("--index",), param="index_dir")
    """Index directory for in-process search [runs/index]."""


@dataclass(kw_only=True)
class RolloutOptions:
    """The rollout engine's limits and sampling; ``RolloutConfig`` (the engine's config) is made of them."""

    protocol: str = "tags"
    """tags (Search-R1) or tool_call (Dr. Zero)."""
    topk: int = option(3, range=AT_LEAST_1)
    """Passages per search."""
    max_turns: int = option(4, range=AT_LEAST_0)
    """Search turns before the final no-search turn."""
    max_turn_tokens: int = option(500, range=AT_LEAST_1)
    """New tokens per turn (TRL's max_completion_length caps a whole completion instead)."""
    max_obs_tokens: int = option(500, range=AT_LEAST_1)
    """Tokens per observation (whole passages are cut)."""
    max_context_tokens: int = option(4096, range=AT_LEAST_1)
    """Prompt + response token budget."""
    temperature: float = option(1.0, range=AT_LEAST_0)
    """Sampling temperature (0 = greedy); training computes its logprobs at the same temperature."""
    top_p: float = option(1.0, range=Range(0, 1, lo_open=True))
    """Nucleus sampling mass."""
    rollout_mode: str = "sync"
    """sync (every sample generates a turn, then the turn's searches run) or async (each sample
    advances on its own: it searches while others generate); both give the same samples."""
    search_concurrency: int = option(16, range=AT_LEAST_1)
    """Search calls in flight at once in async mode (a backend that is not thread-safe gets one)."""


@dataclass(kw_only=True)
class Seeded:
    seed: int = option(0, range=Range(0, 2**32 - 1, why="numpy's seed range"))
    """Seeds everything the command draws at random (data order, sampling, splits)."""


@dataclass(kw_only=True)
class Subset:
    limit: Optional[int] = option(None, range=AT_LEAST_1)
    """Only the first N questions (rows) of each input [all]."""


@dataclass(kw_only=True)
class OptimConfig:
    """The optimizer, its schedule, and what it trains (LoRA)."""

    lr: float = option(1e-6, range=POSITIVE, aliases=("learning_rate",))
    """Peak learning rate (policy/actor)."""
    lr_schedule: str = "constant"
    """constant or cosine (to min_lr_ratio · lr at the last step), after the warmup."""
    warmup_ratio: float = option(0.0, range=FRACTION)
    """Fraction of the steps with a linear warmup (Dr. Zero: 0.03)."""
    min_lr_ratio: float = option(0.0, range=FRACTION)
    """Cosine floor as a fraction of the peak lr."""
    weight_decay: float = option(0.0, range=AT_LEAST_0)
    """AdamW weight decay (verl's actor default is 0.01; Dr. Zero's 0.01)."""
    max_grad_norm: float = option(1.0, range=AT_LEAST_0)
    """Clip the global gradient norm to this (0 = off; the norm is still logged)."""
    lora_r: int = option(0, range=AT_LEAST_0)
    """LoRA rank (0 = full fine-tune)."""
    lora_alpha: int = option(16, range=AT_LEAST_1)
    """LoRA alpha (scale alpha/r)."""
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj"
    """Comma list of module names that get LoRA adapters."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower updates)."""


@dataclass(kw_only=True)
class RunConfig:
    """Where a training run writes, how it checkpoints, resumes and reports."""

    out: Path = option(Path("runs/train"), flags=("--out", "-o"), aliases=("output_dir",))
    """Run directory: checkpoints/, final/, metrics."""
    save_every: int = option(50, range=AT_LEAST_0)
    """Checkpoint every N steps (0 = final only)."""
    keep_checkpoints: int = option(2, range=AT_LEAST_1)
    """Most recent checkpoints to keep."""
    resume: bool = False
    """Continue from the latest checkpoint in --out (a fresh start if there is none)."""
    save_rollouts: bool = False
    """Write OUT/rollouts/step-N.parquet (ROLLOUT artifact) every step."""
    report_to: str = "none"
    """none, tensorboard or wandb (through accelerate's trackers)."""


@dataclass(kw_only=True)
class ValidationConfig:
    """Validation during training: greedy, on a real search engine."""

    val_data: Optional[str] = None
    """QA file to validate on during training (greedy, real search) [none: no validation]."""
    val_every: int = option(50, range=AT_LEAST_0)
    """Validate every N steps and after the last (0 = after the last only)."""
    val_limit: Optional[int] = option(None, range=AT_LEAST_1)
    """Validate on the first N questions only [all]."""
    val_search: Optional[str] = None
    """Validation search backend [bm25 over --index]."""
    val_allow_sim: bool = option(False, flags=("--val-allow-sim",))
    """Allow a sim: --val-search (validation measures real search by default)."""


# ----------------------------------------------------------------------------- index / search / serve / show / plot


@dataclass(kw_only=True)
class RetrievalOptions:
    """An index on disk and how to query it."""

    index: Path = option(Path("runs/index"), flags=("--index",), param="index_dir")
    """Index directory from `zsearch index`."""
    method: str = "auto"
    """bm25, dense, hybrid, or auto (hybrid when both exist)."""


@dataclass(kw_only=True)
@uses(ModelOptions, "device")
class IndexOptions:
    """``zsearch index``."""

    corpus: Optional[Path] = option(None, argument=True)
    """Corpus jsonl(.gz)/Parquet [the bundled demo corpus]."""
    out: Path = option(Path("runs/index"), flags=("--out", "-o"), aliases=("output_dir",))
    """Index directory to write."""
    kind: str = "bm25"
    """Comma list of bm25, dense (hybrid = bm25,dense)."""
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
    faiss_type: str = "Flat"
    """faiss index: Flat, HNSW32, IVF{n},PQ{m} (e.g. IVF1024,PQ64)."""
    batch_size: int = option(128, range=AT_LEAST_1)
    """Encoder batch size."""
    max_length: int = option(256, range=AT_LEAST_1)
    """Encoder max tokens per passage."""


@dataclass(kw_only=True)
@uses(RetrievalOptions)
class QueryOptions:
    """``zsearch search``."""

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
@uses(RetrievalOptions)
class ServeOptions:
    """``zsearch serve``."""

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
class ShowOptions:
    """``zsearch show``."""

    file: Path = option(argument=True)
    """A trajectory, rollout (train --save-rollouts) or eval examples Parquet file."""
    ids: Optional[list[str]] = option(None, flags=("--id",))
    """Only this trajectory id, or all samples of a question id (repeatable) [all]."""
    where: Optional[str] = None
    """Only correct (EM 1) or wrong (EM 0) ones [both]."""
    limit: int = option(3, range=AT_LEAST_1)
    """Show at most this many."""


@dataclass(kw_only=True)
class PlotOptions:
    """``zsearch plot``."""

    run_dir: Path = option(argument=True)
    """A `zsearch train` output folder."""
    out: Optional[Path] = option(None, flags=("--out", "-o"), aliases=("output_dir",))
    """PNG to write [RUN_DIR/curves.png]."""
    title: Optional[str] = option(None, flags=("--title",))
    """Figure title [zsearch train: RUN_DIR's name]."""


# ----------------------------------------------------------------------------- eval / collect / judge / warmup-data


@dataclass(kw_only=True)
@uses(ModelOptions, "model", "backend", "device")
@uses(SearchConfig)
@uses(RolloutOptions, "protocol", "topk", "max_turns", "max_turn_tokens", "max_obs_tokens", "max_context_tokens",
      "temperature", "rollout_mode", "search_concurrency", temperature=0.0)
@uses(Seeded)
@uses(Subset)
class EvalOptions:
    """What ``zsearch eval`` runs; the CLI fills it from flags/YAML."""

    datasets: str = "demo"
    """demo (bundled test split), all (the seven benchmarks), a comma list, or QA files. Keys: nq/test
    under --data-dir, else the file's path."""
    data_dir: Path = Path("data")
    """Benchmark files, FlashRAG layout: DATA_DIR/nq/test.jsonl."""
    download: bool = False
    """Fetch missing benchmark files from the FlashRAG hub dataset (network)."""
    out: Path = option(Path("runs/eval"), flags=("--out", "-o"), aliases=("output_dir",))
    """Output directory: OUT/KEY/METHOD.*.parquet; a rerun reuses rows only under equal options."""
    method: str = "agent"
    """direct, cot, rag or agent (multi-turn search)."""
    batch_size: int = option(16, range=AT_LEAST_1)
    """Questions per generation batch."""
    predictions: Optional[Path] = None
    """Score this predictions file (id, prediction[, golden_answers]) instead of a model [none]."""
    qa: Optional[Path] = None
    """With --predictions: QA file to join golden answers from by id [none: the predictions file's]."""
    group_by: str = "data_source"
    """Score each value of this column (or metadata key) as its own dataset, KEY/VALUE, when a file
    holds several (Search-R1's merged test file); none = never split."""
    pooled: bool = False
    """Also score each split file as one pooled dataset, KEY/pooled."""


@dataclass(kw_only=True)
class ExportOptions:
    """``zsearch export``: a trained model as a plain HF folder for another machine."""

    source: Path = option(argument=True)
    """A `zsearch train`/`sft` run folder (its final/, else its newest checkpoint), a checkpoint
    folder (OUT/checkpoints/step-N: its weights only) or a final folder."""
    out: Path = option(flags=("--out", "-o"), aliases=("output_dir",))
    """Folder to write: safetensors, tokenizer and chat template, config, a README model card."""
    merge_lora: bool = option(False, flags=("--merge-lora",))
    """A LoRA adapter: merge it into its base and write full weights (without: the adapter, naming its
    base portably)."""
    dtype: str = "auto"
    """Weights' dtype: auto (as stored; a merge keeps the base's), float32, bfloat16 or float16."""
    eval: Optional[Path] = option(None, flags=("--eval",), param="eval_dir")
    """A `zsearch eval --out` folder whose summaries go into the model card [the run folder's own]."""
    force: bool = option(False, flags=("--force",))
    """Replace a non-empty --out."""


@dataclass(kw_only=True)
@uses(ModelOptions, "model", "backend", "device")
@uses(SearchConfig)
@uses(RolloutOptions, topk=5, max_turns=5)
@uses(Seeded)
@uses(Subset)
class CollectOptions:
    """What ``zsearch collect`` runs: ZeroSearch's settings (five documents, five turns)."""

    data: Optional[Path] = option(None, flags=("--data",))
    """QA file (jsonl/Parquet) [the bundled demo train split]."""
    out: Path = option(Path("runs/collect"), flags=("--out", "-o"), aliases=("output_dir",))
    """Directory for trajectories.parquet and queries.parquet."""
    samples_per_question: int = option(5, flags=("--samples-per-question", "-G"), range=AT_LEAST_1)
    """Trajectories per question."""
    batch_size: int = option(8, range=AT_LEAST_1)
    """Questions per generation batch; files are rewritten after each."""


@dataclass(kw_only=True)
@uses(ModelOptions, "backend", "device")
@uses(Seeded)
@uses(Subset)
class JudgeOptions:
    """What ``zsearch judge`` runs; the CLI fills it from flags/YAML."""

    queries: Path = option(argument=True)
    """queries.parquet from `zsearch collect` (the COLLECTED_QUERY artifact)."""
    judge_model: str = option(flags=("--judge-model",))
    """Local HF id/path/alias, or the endpoint's model name."""
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
    balance: bool = option(False, flags=("--balance",))
    """Also write a useful/noisy-balanced set (majority downsampled, seeded by --seed)."""


@dataclass(kw_only=True)
@uses(ModelOptions, "model")
@uses(SearchConfig, index=Path("runs/index"))
@uses(RolloutOptions, "protocol", "topk", "max_obs_tokens", "max_context_tokens")
@uses(Subset)
class WarmupOptions:
    """``zsearch warmup-data``: teacher trajectories over a QA file (the model's tokenizer and
    chat template, real search results)."""

    qa: str = option(argument=True)
    """QA file (jsonl or Parquet) to play: each question, then its first gold answer."""
    out: Path = option(Path("runs/warmup/trajectories.parquet"), flags=("--out", "-o"), aliases=("output_dir",))
    """TRAJECTORY Parquet for `zsearch sft`."""



# ----------------------------------------------------------------------------- Dr. Zero


@dataclass(kw_only=True)
class ProposerOptions:
    """The Dr. Zero proposer's reward: the frozen solver and the hop mix."""

    solver_model: Optional[str] = None
    """Frozen solver that measures difficulty [same as --model; loaded as a separate copy]. With
    --solver-url: its tokenizer."""
    solver_url: Optional[str] = None
    """OpenAI-compatible server the solver answers from, e.g. `vllm serve SOLVER` at
    http://127.0.0.1:8000/v1 (token ids in and out) [none: an in-process copy]."""
    solver_samples: int = option(5, range=Range(2, why="the difficulty reward divides by n - 1"))
    """Solver answers per question (n of the difficulty reward)."""
    hop_ratio: str = "4:3:2:1"
    """Ratio of 1:2:3:4-hop questions."""


@dataclass(kw_only=True)
@uses(ModelOptions, "model", "backend", "device")
@uses(SearchConfig, index=Path("runs/index"))
@uses(RolloutOptions, "topk", "max_turns", "max_turn_tokens", "max_obs_tokens", "max_context_tokens", "temperature",
      "rollout_mode", "search_concurrency")
@uses(Seeded)
@uses(ProposerOptions)
class GenerateOptions:
    """``zsearch propose --generate-only``: write a QA set from a proposer checkpoint (the rollout
    settings are the drzero-proposer preset's unless set)."""

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


# ----------------------------------------------------------------------------- agent serve


@dataclass(kw_only=True)
@uses(ModelOptions, "model", "backend", "device")
@uses(SearchConfig)
@uses(RolloutOptions, "protocol", "topk", "max_turns", "max_turn_tokens", "max_obs_tokens", "max_context_tokens",
      "temperature", "top_p", "rollout_mode", "search_concurrency", temperature=0.0)
@uses(Seeded)
class AgentServeOptions:
    """``zsearch agent serve``: the search agent behind an OpenAI-compatible chat API (the engine
    and settings of ``zsearch eval --method agent``; a request's temperature, top_p, max_tokens
    and seed override the server's)."""

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
