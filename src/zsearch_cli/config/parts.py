"""The parts several commands share, each option declared once: a field with its default,
its docstring (the ``--help`` text) and, through :func:`~zsearch_cli.config.fields.option`,
its flags and accepted range. Commands and library configs (``config/commands.py``,
``TrainConfig``, ``SFTConfig``) are made of them.

Light on purpose (no typer, no torch): the CLI imports it to build ``--help``, and the
library to check its options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from zsearch_cli.config.fields import Options, option
from zsearch_cli.config.ranges import AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, Range

@dataclass(kw_only=True)
class ModelOptions:
    """The model a command loads and where it runs."""

    model: str = "smollm2"
    """HF id, local path, checkpoint dir, or the smollm2 alias."""
    backend: str = option("auto", choices=("auto", "hf", "vllm"), execution=True)
    """Generation backend: hf, vllm or auto (vLLM with CUDA when installed)."""
    device: str = option("auto", execution=True)
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
class SimOptions:
    """ZeroSearch's simulated search: the noise curriculum (``--search sim:MODEL`` or
    ``sim+http://...`` only; docs/methods.md §3). ``None`` = the simulator's default; checked
    by ``search.simulated.sim_options``."""

    noise_start: Optional[float] = option(None, range=FRACTION)
    """sim search: curriculum noise p_s [0]."""
    noise_end: Optional[float] = option(None, range=FRACTION)
    """sim search: curriculum noise p_e [0.25; paper 7B: 0.75]."""
    noise_base: Optional[float] = option(None, range=POSITIVE)
    """sim search: curriculum base b [4]."""
    noise_schedule: Optional[str] = option(None, choices=("curriculum", "fixed"))
    """sim search: curriculum (eq. 1) or fixed (p = --noise-start) [curriculum]."""


@dataclass(kw_only=True)
class RolloutOptions:
    """The rollout engine's limits and sampling: the engine takes this part as it is, so an
    option added here reaches every command that rolls out."""

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
    rollout_mode: str = option("sync", choices=("sync", "async"), execution=True)
    """sync (every sample generates a turn, then the turn's searches run) or async (each sample
    advances on its own: it searches while others generate); both give the same samples."""
    search_concurrency: int = option(16, range=AT_LEAST_1, execution=True)
    """Search calls in flight at once in async mode (a backend that is not thread-safe gets one)."""


@dataclass(kw_only=True)
class Seeded(Options):
    seed: int = option(0, range=Range(0, 2**32 - 1, why="numpy's seed range"))
    """Seeds everything the command draws at random (data order, sampling, splits)."""


@dataclass(kw_only=True)
class Subset(Options):
    limit: Optional[int] = option(None, range=AT_LEAST_1, execution=True)  # which rows, not what each computes
    """Only the first N questions (rows) of each input [all]."""


@dataclass(kw_only=True)
class OptimConfig:
    """The optimizer, its schedule, and what it trains (LoRA)."""

    lr: float = option(1e-6, range=POSITIVE, aliases=("learning_rate",))
    """Peak learning rate (policy/actor)."""
    lr_schedule: str = option("constant", choices=("constant", "cosine"))
    """constant or cosine (to min_lr_ratio · lr at the last step), after the warmup."""
    warmup_ratio: float = option(0.0, range=Range(0, 1, hi_open=True, why="1 would never reach the peak lr"))
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
    gradient_checkpointing: bool = option(False, execution=True)
    """Recompute activations in the backward pass (less memory, ~30% slower updates)."""


@dataclass(kw_only=True)
class RunConfig:
    """Where a training run writes, how it checkpoints, resumes and reports."""

    out: Path = option(Path("runs/train"), flags=("--out", "-o"), aliases=("output_dir",), execution=True)
    """Run directory: checkpoints/, final/, metrics."""
    save_every: int = option(50, range=AT_LEAST_0, execution=True)
    """Checkpoint every N steps (0 = final only)."""
    keep_checkpoints: int = option(2, range=AT_LEAST_1, execution=True)
    """Most recent checkpoints to keep."""
    resume: bool = option(False, execution=True)
    """Continue from the latest checkpoint in --out (a fresh start if there is none)."""
    save_rollouts: bool = option(False, execution=True)
    """Write OUT/rollouts/step-N.parquet (ROLLOUT artifact) every step."""
    report_to: str = option("none", choices=("none", "tensorboard", "wandb"), execution=True)
    """none, tensorboard or wandb (through accelerate's trackers)."""
    merge_lora: bool = option(False, execution=True)
    """LoRA: also write OUT/final/merged, a plain HF folder with the LoRA merged in (full weights, for
    vLLM and transformers); OUT/final stays the adapter (resume, eval)."""
    vllm_sleep: int = option(0, range=Range(0, 2, why="vLLM's sleep levels"), execution=True)
    """--backend vllm on a GPU: the engine sleeps during each update (vLLM's sleep mode): 1 moves its
    weights to CPU memory and frees its KV cache, 2 frees both (the weight sync refills them); 0 = off.
    Not with --rollout-overlap."""
    gpu_memory_utilization: Optional[float] = option(None, range=Range(0, 1, lo_open=True), execution=True)
    """--backend vllm on a GPU: the share of the GPU's memory the colocated engine reserves (weights
    and KV cache) [0.5; Search-R1: 0.6]. More KV cache rolls out larger batches; less leaves the update room."""


@dataclass(kw_only=True)
class ValidationConfig:
    """Validation during training: greedy, on a real search engine. It measures the policy and
    never changes what training computes, so every option here may change on resume."""

    val_data: Optional[str] = option(None, execution=True)
    """QA file to validate on during training (greedy, real search) [none: no validation]."""
    val_every: int = option(50, range=AT_LEAST_0, execution=True)
    """Validate every N steps and after the last (0 = after the last only)."""
    val_limit: Optional[int] = option(None, range=AT_LEAST_1, execution=True)
    """Validate on the first N questions only [all]."""
    val_search: Optional[str] = option(None, execution=True)
    """Validation search backend [bm25 over --index]."""
    val_allow_sim: bool = option(False, flags=("--val-allow-sim",), execution=True)
    """Allow a sim: --val-search (validation measures real search by default)."""


@dataclass(kw_only=True)
class RetrievalOptions:
    """An index on disk and how to query it."""

    index: Path = option(Path("runs/index"), flags=("--index",), param="index_dir")
    """Index directory from `zsearch index`."""
    method: str = "auto"
    """bm25, dense, hybrid, or auto (hybrid when both exist)."""


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
    # The registry is rollout.protocols.PROTOCOLS; this module stays free of it (light on purpose).
    solver_protocol: str = option("tool_call", choices=("tool_call", "tags"))
    """The solver's action format: tool_call (Dr. Zero's) or tags (Search-R1's: a solver warmed on it,
    like smollm2-warm, never answers under tool calls)."""
    proposer_prompt: str = option("figure5", choices=("figure5", "short"))
    """The proposer's prompt: figure5 (Dr. Zero's, ~2,600 tokens) or short (one worked example,
    1-hop questions only: what a 135M model follows)."""
    answer_reward: str = option("extractable", choices=("extractable", "grounded"))
    """The format reward's answer part: extractable (the paper's: any <answer>) or grounded (Dr. Zero's
    code's: the answer is in the source passage or a tool response, at most 5 words; half for 10)."""


@dataclass(kw_only=True)
class DatasetOptions:
    """The QA sets a command reads, keyed as `zsearch eval` keys them (eval, audit). Which rows are
    asked for, never what one computes: an eval reuses saved rows across all of these."""

    datasets: str = option("demo", execution=True)
    """demo (bundled test split), all (the seven benchmarks), a comma list, or QA files. Keys: nq/test
    under --data-dir, else the file's path."""
    data_dir: Path = option(Path("data"), execution=True)
    """Benchmark files, FlashRAG layout: DATA_DIR/nq/test.jsonl."""
    download: bool = option(False, execution=True)
    """Fetch missing benchmark files from the FlashRAG hub dataset (network)."""
    group_by: str = option("data_source", execution=True)
    """Treat each value of this column (or metadata key) as its own dataset, KEY/VALUE, when a file
    holds several (Search-R1's merged test file); none = never split."""


# ----------------------------------------------------------------------------- the RL update's parts
# TrainConfig, `zsearch solve` and DrZeroOptions hold these; drzero passes them to its training
# sub-steps as they are, so an option added here reaches `train`, `solve`, `propose` and `drzero`.


@dataclass(kw_only=True)
class BatchOptions:
    """How one step's rollout batch is cut for the update: its passes, its optimizer steps and
    the micro-batches each forward/backward takes (memory). The step's own shape, B prompts x
    G responses, is the algorithm's (``--batch-size``, ``--group-size``)."""

    ppo_epochs: int = option(1, range=AT_LEAST_1)
    """Passes over each rollout batch."""
    mini_batch_size: Optional[int] = option(None, range=AT_LEAST_1)
    """Sequences per optimizer step [whole batch]."""
    # gradient accumulation sums the same loss in other slices: memory, not the update
    micro_batch_size: int = option(8, range=AT_LEAST_1, execution=True)
    """Sequences per forward/backward (gradient accumulation); not read under --micro-batch-tokens."""
    micro_batch_tokens: Optional[int] = option(None, range=AT_LEAST_1, execution=True)
    """Token budget per forward/backward: samples grouped by length, a longer one alone (verl's
    use_dynamic_bsz); wins over --micro-batch-size [off]."""
    pack: str = option("auto", choices=("auto", "on", "off"), execution=True)
    """Concatenate each micro-batch's samples into one row, attention confined to each: auto with a
    flash-attention kernel where a start-up probe shows it exact, on (refuse a model where not), off
    (right-padded rows, without the attention mask where attention is causal)."""
    balance_tokens: bool = option(True, execution=True)
    """Under several processes, deal the prompt groups so each process updates on a like number of
    tokens, keeping its sample count (verl's balance_batch)."""
    attn_implementation: str = option("sdpa", choices=("sdpa", "eager", "flash_attention_2", "flash_attention_3"),
                                      execution=True)
    """Attention kernel of the trained models (transformers' name); flash-attention's varlen kernels
    (installed separately) let --pack auto pack."""
    logits_chunk: Optional[int] = option(None, range=AT_LEAST_0, execution=True)
    """LM-head rows at a time, recomputed in backward (no [tokens, vocab] tensor whole); 0 = the whole
    head at once [2^26 / vocab rows]."""


@dataclass(kw_only=True)
class LossOptions:
    """What the policy loss weighs, beside the algorithm's clipped objective: the KL to the
    reference, how token terms are aggregated, and which samples count (docs/methods.md §4.8)."""

    beta: Optional[float] = option(None, range=AT_LEAST_0)
    """KL weight to the reference [algo default]; 0 loads no reference."""
    loss_agg: Optional[str] = option(None, choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    """token-mean, seq-mean-token-mean or seq-mean-token-sum-norm [algo default: ppo token-mean, others
    seq-mean-token-mean]."""
    mask_truncated: bool = option(False, aliases=("mask_truncated_completions",))
    """No loss on a sample whose last turn hit the token cap without an answer or EOS (it still counts
    in its group's baseline)."""


@dataclass(kw_only=True)
class CorrectionOptions:
    """Rollout correction between the sampler and the trainer (docs/methods.md §4.8): the names
    are the flags', and ``algos/correction.py`` takes this part as it is."""

    rollout_is: str = option("none", choices=("none", "token", "sequence"))
    """Truncated importance weights pi_old/pi_rollout on the loss: none, token or sequence (product)."""
    rollout_is_cap: float = option(2.0, range=Range(1, why="an on-policy weight is 1"))
    """C: the importance weights are capped at C."""
    rollout_rs: str = option("none", choices=("none", "token", "sequence", "geometric"))
    """Reject (mask out of the loss and its denominator): none, token, sequence or geometric ratios
    outside [--rollout-rs-low, --rollout-rs-high]."""
    rollout_rs_low: Optional[float] = option(None, range=POSITIVE)
    """Lower rejection bound [1/high]."""
    rollout_rs_high: Optional[float] = option(None, range=POSITIVE)
    """Upper rejection bound [2 for token/sequence, 1.001 for geometric]."""


@dataclass(kw_only=True)
class GuardOptions:
    """The collapse guard (docs/stability.md). It watches and reacts; it never changes what a
    healthy step computes, so a resumed run may change it."""

    guard: bool = option(True, execution=True)
    """Watch every step for collapse (reward, length, entropy, garbage text, KL, grad norm, NaN,
    logp mismatch, format failures); events go to OUT/guard.jsonl."""
    on_collapse: str = option("warn", choices=("warn", "stop", "rollback"), execution=True)
    """What a guard event does: warn, stop, or rollback (to the newest healthy checkpoint, skipping
    the batch, with a lower lr). A non-finite value stops under warn too."""
