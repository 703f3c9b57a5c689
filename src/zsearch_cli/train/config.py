"""``TrainConfig``: every knob of ``zsearch train`` in one dataclass (the TRL/cleanrl pattern).

The options are composed of the parts in ``config/parts.py`` (each declared once there) and the
algorithm's own: the loss's hyper-parameters that the papers fix (β, ε, the critic lr, DSPO's
budget) default to ``None``, meaning "the algorithm's paper default" from ``algos/*.py``, and
:func:`algo_config` merges what the user set into the algorithm's frozen loss config. The
learning rate and G are the trainer's and the rollout's: plain values (G unset takes the
algorithm's, ``AlgoSpec.group_size``, when the config is made). :func:`check_config` turns every invalid
value and combination into one :class:`ZsearchError` line before anything heavy is loaded (a
value outside its declared range or choices: ``config.fields.check_options``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from zsearch_cli.config.fields import Record, check_options, option, part, to_flat, with_options
from zsearch_cli.config.parts import (BatchOptions, CorrectionOptions, GuardOptions, LossOptions, ModelOptions, OptimConfig,
                                      RolloutOptions, RunConfig, SearchConfig, Seeded, SimOptions, ValidationConfig)
from zsearch_cli.config.ranges import ANY, AT_LEAST_0, AT_LEAST_1, POSITIVE, Range
from zsearch_cli.errors import ZsearchError, read_back, shown_spec
from zsearch_cli.presets import apply_preset


def parse_algo_args(items: list[str] | None) -> dict[str, Any]:
    """``["baseline=rloo", "gamma=0.99"]`` -> dict, values read as YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ZsearchError(f"--algo-arg {item!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out


@dataclass(kw_only=True)
class TrainConfig(Seeded, Record):
    """Options of one RL training run: the shared parts (``config/parts.py``), nested, and the
    algorithm's own options. ``None`` = the algorithm's paper default. Saved and read back
    flat (:meth:`Record.to_dict`), as the flags are."""

    # ---- the shared parts (every option of each; a new one reaches train, solve, propose and drzero)
    policy: ModelOptions = part(ModelOptions)
    retrieval: SearchConfig = part(SearchConfig)
    sim: SimOptions = part(SimOptions)
    rollout: RolloutOptions = part(RolloutOptions, ranges={"temperature": Range(0, lo_open=True, why="RL samples")})
    optim: OptimConfig = part(OptimConfig)
    run: RunConfig = part(RunConfig)
    validation: ValidationConfig = part(ValidationConfig)
    # ---- the update: batch slicing, the loss's terms, rollout correction, collapse guard
    # (docs/methods.md §4.8, docs/stability.md)
    batch: BatchOptions = part(BatchOptions)
    loss: LossOptions = part(LossOptions)
    correction: CorrectionOptions = part(CorrectionOptions)
    collapse: GuardOptions = part(GuardOptions)

    # ---- what to train
    algo: str = "grpo"
    """reinforce, ppo, grpo, gspo, dspo (+ dspo-nofilter, dspo-token)."""
    train_data: str | None = None
    """Comma list of QA files [the bundled demo train split]."""
    # a resume may extend (or shorten) a run: the steps done stay what they were
    steps: int = option(100, range=AT_LEAST_1, aliases=("max_steps",), execution=True)
    """Training steps (one rollout batch and its updates each)."""

    # ---- batch shapes (TRL counts completions; here B counts prompts, each with G responses)
    batch_size: int = option(8, range=AT_LEAST_1)
    """B, prompts per step (DSPO: mixed groups to collect); B x G sequences (TRL counts completions)."""
    group_size: int | None = option(None, flags=("--group-size", "-G", "--num-generations"), range=AT_LEAST_1)
    """G, responses per prompt [the algorithm's: PPO and HRPO 1, others 5]."""

    # ---- the algorithm's loss (None = paper default of --algo)
    critic_lr: float = option(1e-5, range=POSITIVE)
    """Critic learning rate (PPO's critic only; Search-R1: 1e-5). A trainer setting like --lr."""
    clip_eps: float | None = option(None, range=POSITIVE, aliases=("epsilon",))
    """Ratio clip epsilon, both sides [algo default]."""
    clip_eps_low: float | None = option(None, range=Range(0, 1, lo_open=True, hi_open=True))
    """Lower ratio clip epsilon (token ratio, or GSPO's sequence ratio) [--clip-eps, else algo default]."""
    clip_eps_high: float | None = option(None, range=POSITIVE)
    """Upper ratio clip epsilon [--clip-eps, else algo default]."""
    max_gen_batches: int | None = option(None, range=AT_LEAST_1)
    """DSPO: generation batches per step at most [10]."""
    algo_args: dict[str, Any] = option(factory=dict, flags=("--algo-arg",), param="algo_arg", cli_type=Optional[list[str]],
                                       convert=parse_algo_args)
    """KEY=VALUE for any other algo config field (repeatable), e.g. baseline=rloo [none]."""
    critic_model: str | None = None
    """PPO critic backbone [a copy of the policy]; 'none' means no critic (an error for PPO)."""
    reward: str | None = option(None, choices=("em", "f1", "subem"))
    """em, f1 or subem [algo default: ppo/grpo em, reinforce f1, dspo/gspo subem]."""
    format_bonus: float = option(0.0, range=ANY)
    """Added when the response is well formed (0 = papers)."""

    # ---- off-policy overlap (docs/architecture.md, "Rollout overlap")
    rollout_overlap: int = option(0, range=AT_LEAST_0)
    """K > 0: later steps' rollouts start while a step trains, on weights up to K updates old
    (off-policy: the loss takes the sampler's logprobs as pi_old); 0 = on-policy."""

    # the preset's values are in the other options already; its name alone computes nothing
    preset: str | None = option(None, execution=True)
    """search-r1, zerosearch, dspo or drzero-solver: the papers' settings; flags override [none]."""

    def __post_init__(self) -> None:
        if self.group_size is None and self.algo in _algos():
            self.group_size = _algos()[self.algo].group_size  # the algorithm's paper G

    @classmethod
    def from_preset(cls, name: str | None, **overrides: Any) -> "TrainConfig":
        """Library form of ``--preset``: the preset's values, then ``overrides`` on top."""
        return cls.from_flat(**{**apply_preset(name, overrides, set(overrides)), "preset": name})


def _algos() -> dict[str, Any]:
    from zsearch_cli.algos import ALGOS

    return ALGOS


def get_spec(name: str) -> Any:
    """The AlgoSpec for ``--algo``; unknown names list the valid ones."""
    from zsearch_cli.algos import ALGOS

    if name not in ALGOS:
        valid = ", ".join(ALGOS)
        raise ZsearchError(f"unknown --algo {name!r}: use one of {valid}")
    return ALGOS[name]


def algo_config(cfg: TrainConfig) -> Any:
    """The algorithm's frozen config: paper defaults, then whatever ``cfg`` sets.

    ``target_groups`` (DSPO's B) is the batch size; ``reward`` (DSPO's filter metric) is the
    run's reward. Unknown ``algo_args`` keys are an error naming the valid ones.
    """
    spec = get_spec(cfg.algo)
    fields = {f.name: f for f in dataclasses.fields(spec.config_cls)}
    flat = to_flat(cfg)
    values: dict[str, Any] = {}
    for key in ("beta", "max_gen_batches", "loss_agg"):
        if flat[key] is not None and key in fields:
            values[key] = flat[key]
    for side in ("low", "high"):
        eps = getattr(cfg, f"clip_eps_{side}")
        eps = cfg.clip_eps if eps is None else eps
        if eps is not None and f"clip_eps_{side}" in fields:
            values[f"clip_eps_{side}"] = eps
    if "target_groups" in fields:
        values["target_groups"] = cfg.batch_size
    if "reward" in fields:
        values["reward"] = cfg.reward or spec.reward
    for key, value in cfg.algo_args.items():
        if key not in fields:
            raise ZsearchError(f"--algo-arg {key}: {cfg.algo} has no such option (it has: {', '.join(fields)})")
        values[key] = value
    try:
        return spec.config_cls(**values)
    except ValueError as err:  # the loss config's own checks (e.g. a loss_agg GSPO refuses)
        raise ZsearchError(f"--algo {cfg.algo}: {err}") from None


RESOLVED_FIELDS = ("beta", "clip_eps_low", "clip_eps_high", "max_gen_batches", "loss_agg")
"""TrainConfig fields whose ``None`` means "the algorithm's paper default"."""


def resolve_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every "paper default" (``None``) replaced by the value the run uses:
    the reward metric from the algorithm, and β, the clip range and DSPO's budget from its
    loss config (lr, the critic's lr and G are the trainer's own, never None). What is logged
    and checkpointed is this, so a metrics file never says ``beta: null``. Idempotent; a
    field the algorithm lacks (clipping under HRPO,
    DSPO's budget under GRPO) stays None."""
    spec = get_spec(cfg.algo)
    with_reward = dataclasses.replace(cfg, reward=cfg.reward or spec.reward)
    acfg = algo_config(with_reward)
    values = {key: getattr(acfg, key, None) for key in RESOLVED_FIELDS}
    low, high = values["clip_eps_low"], values["clip_eps_high"]
    return with_options(with_reward, **values, clip_eps=low if low is not None and low == high else None)


def with_later_options(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's recorded config plus the options added to zsearch since it was written,
    at the values that run used without naming them (their defaults; ``loss_agg``: its
    algorithm's), so ``--resume`` compares like with like instead of refusing every checkpoint
    of an older version; read back (errors.read_back) so that a key the checkpoint withheld
    (``http://***@host``) equals the key given again."""
    implicit = resolve_config(TrainConfig(algo=saved.get("algo", "grpo"))).to_dict()
    return read_back({**{k: v for k, v in implicit.items() if k not in saved}, **saved})


def resolved_dict(cfg: TrainConfig, num_processes: int = 1) -> dict[str, Any]:
    """:meth:`TrainConfig.to_dict` of a resolved config, plus the mini-batch actually used:
    ``mini_batch_size`` None means one optimizer step over a process's whole share of the
    batch, ``batch_size // num_processes`` prompts × G sequences."""
    out = cfg.to_dict()
    if out["mini_batch_size"] is None and cfg.group_size is not None:
        out["mini_batch_size"] = cfg.batch_size // max(1, num_processes) * cfg.group_size
    return out


def check_processes(cfg: "TrainConfig", num_processes: int) -> None:
    """The refusals that need only the number of processes: run before any model loads (with
    the launch's ``WORLD_SIZE``) and again with the accelerator's count."""
    check_even_shards(cfg.batch_size, num_processes)
    if cfg.rollout_overlap and num_processes > 1:
        raise ZsearchError("--rollout-overlap runs on one process for now (the rollout thread would issue "
                           "collectives beside training's); use --rollout-overlap 0 under accelerate launch")


def check_even_shards(batch_size: int, num_processes: int) -> None:
    """Refuse a batch that the processes cannot share equally, before any model loads.

    Each process rolls out ``rows[rank::world]`` and averages its loss over its own share,
    and DDP then averages the processes' gradients: with unequal shares that weights the
    smaller share's samples more (B = 3 on 2 processes: an update ~39% off the one-process
    one), and with ``--mini-batch-size`` the processes would take different numbers of
    optimizer steps and fall out of step."""
    if num_processes > 1 and batch_size % num_processes:
        raise ZsearchError(f"--batch-size {batch_size} cannot be shared equally by {num_processes} processes "
                           f"(unequal shares would change the update): use a multiple of {num_processes}")


def check_config(cfg: TrainConfig) -> Any:
    """Validate ``cfg`` and return its algorithm config; every problem is one line."""
    from zsearch_cli.algos.correction import check_correction
    from zsearch_cli.rollout.protocols import get_protocol

    spec = get_spec(cfg.algo)
    check_options(cfg)  # the declared ranges and choices: the same check as the command line's
    cfg = resolve_config(cfg)
    acfg = algo_config(cfg)

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ZsearchError(msg)

    need(cfg.group_size >= spec.group_size_min,
         f"--algo {cfg.algo} needs --group-size >= {spec.group_size_min} (a group baseline needs G >= 2), "
         f"got {cfg.group_size}; use --algo reinforce for G = 1")
    if spec.on_policy:
        need(cfg.batch.ppo_epochs == 1 and cfg.batch.mini_batch_size is None,
             f"--algo {cfg.algo} is strictly on-policy: one update per batch (no --ppo-epochs/--mini-batch-size)")
    need(acfg.beta >= 0, f"--beta must be >= 0, got {acfg.beta}")
    if spec.needs_critic:
        need((cfg.critic_model or "").lower() != "none",
             f"--algo {cfg.algo} needs a critic: drop --critic-model none (default: a copy of the policy) "
             "or give a model path")
    else:
        need(cfg.critic_model in (None, "", "none"), f"--critic-model is only used by ppo, not --algo {cfg.algo}")
    if spec.filter_groups:
        need(acfg.max_gen_batches >= 1, f"--max-gen-batches must be >= 1, got {acfg.max_gen_batches}")
    need(not (cfg.rollout_overlap and spec.filter_groups),
         f"--rollout-overlap with --algo {cfg.algo}: DSPO's dynamic filter draws generation batches on demand, "
         "which a rollout started steps ahead cannot serve; use --rollout-overlap 0 (or --algo dspo-nofilter)")
    check_correction(cfg.correction)
    corrects = cfg.correction.rollout_is != "none" or cfg.correction.rollout_rs != "none"
    need(not (cfg.rollout_overlap and corrects),
         "--rollout-is/--rollout-rs with --rollout-overlap: the overlap already takes pi_old from the sampler "
         "(verl's bypass), so pi_old/pi_rollout is 1 and there is nothing to correct; the clip bounds the ratio")
    need(not (cfg.rollout_overlap and spec.on_policy),
         f"--rollout-overlap with --algo {cfg.algo}: its objective has no clipped ratio, and an unclipped "
         "update on stale samples destabilises within a few steps; use --rollout-overlap 0")
    def need_vllm_engine(option: str, why: str) -> None:  # an option that only the vLLM engine reads
        from zsearch_cli.models.factory import vllm_available

        backend = cfg.policy.backend
        need(backend == "vllm" or (backend == "auto" and vllm_available()),
             f"{option} with --backend {backend}{' (no vLLM with CUDA here: auto is hf)' if backend == 'auto' else ''}"
             f": {why}")

    if cfg.run.vllm_sleep:  # the engine sleeps during each update (models/vllm.py, "Sleep mode")
        from zsearch_cli.models.vllm_setup import check_sleep_mode

        need(not cfg.rollout_overlap, f"--vllm-sleep {cfg.run.vllm_sleep} with --rollout-overlap: the engine rolls out "
             "the next steps during the update, so it cannot sleep then; use --vllm-sleep 0 or --rollout-overlap 0")
        need_vllm_engine(f"--vllm-sleep {cfg.run.vllm_sleep}",
                         "the HF backend has no engine to put to sleep; use --backend vllm or --vllm-sleep 0")
        check_sleep_mode(cfg.run.vllm_sleep)  # the platform's vLLM has a sleep mode (not the CPU build)
    if cfg.run.gpu_memory_utilization is not None:
        need_vllm_engine("--gpu-memory-utilization",
                         "it sizes the vLLM engine's share of the GPU; the HF backend has no engine")
    if cfg.collapse.guard and cfg.collapse.on_collapse == "rollback":
        need(cfg.run.save_every > 0, "--on-collapse rollback needs checkpoints to go back to: set --save-every > 0")
        need(not cfg.rollout_overlap, "--on-collapse rollback with --rollout-overlap: the rollouts drawn ahead "
             "would come from the weights being rolled back; use warn or stop")
    get_protocol(cfg.rollout.protocol)  # the protocols' registry is their declaration
    search_options(cfg)
    check_validation(cfg)
    return acfg


def search_options(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword options for ``make_search_backend(cfg.retrieval.search, …)``: the simulator's
    (``search/sim_options.py``, which also refuses ``--noise-*`` on a real engine)."""
    from zsearch_cli.search.sim_options import sim_search_options

    return sim_search_options(cfg.retrieval.search, cfg.sim, seed=cfg.seed, topk=cfg.rollout.topk)


def validation_search(cfg: TrainConfig) -> str:
    """The validation backend's spec: ``--val-search``, else bm25 over ``--index``."""
    return (cfg.validation.val_search or "bm25").strip()


def check_validation(cfg: TrainConfig) -> None:
    """Validation options; a simulated validation backend needs ``--val-allow-sim``."""
    from zsearch_cli.search.factory import is_simulated

    if cfg.validation.val_data and is_simulated(validation_search(cfg)) and not cfg.validation.val_allow_sim:
        raise ZsearchError(f"--val-search {shown_spec(validation_search(cfg))} is the simulator: validation measures real "
                           "retrieval (default: bm25 over --index); pass --val-allow-sim to validate on it anyway")
