"""``zsearch drzero``'s sub-steps are ``zsearch solve`` and ``zsearch propose`` (issue 34).

Every option of ``solve`` must reach drzero's solve step, and every option of ``propose``
drzero's propose step (its training, or its generation for the ``--generate-only`` options),
with the value given to drzero, unless the loop sets it itself: those are listed below by
name, each with the reason. The loop runs with every other option at a value that is no
default, the sub-step's library call is captured, and each value is read back from it.

Before the RL options became parts, a Dr. Zero run reached none of ``--micro-batch-size``,
``--guard``, ``--on-collapse``, ``--rollout-is*``, ``--rollout-rs*``, ``--loss-agg``,
``--mask-truncated``, ``--merge-lora`` or ``--beta``: "solve = drzero's solve step" held
only at the defaults, and no test noticed.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from zsearch_cli import cli_drzero
from zsearch_cli.commands.drzero import DrZeroOptions, Loop
from zsearch_cli.config.fields import Option, leaves, to_flat

SOLVE_SET_BY_LOOP = {
    # option of `solve`: the drzero option that feeds it (None: the loop's own value), and why
    "model": (None, "each iteration's solver starts from the previous iteration's"),
    "train_data": (None, "the questions this iteration generated"),
    "out": (None, "OUT/iter-N/solver"),
    "resume": (None, "the loop resumes an interrupted sub-step itself (OUT/lineage.json)"),
    "seed": (None, "derived per iteration and sub-step from --seed (iteration_seeds)"),
    "lr": ("solver_lr", "each side has its own learning rate"),
    "steps": ("solver_steps", "each side has its own step count"),
    "max_context_tokens": ("solver_context_tokens", "each side has its own context budget"),
    "batch_size": ("solver_batch_size", "--batch-size is the proposer's; capped at the generated set's size"),
}

PROPOSE_SET_BY_LOOP = {
    "model": (None, "each iteration's proposer starts from the previous iteration's"),
    "solver_model": (None, "the loop's current solver is the frozen reward model"),
    "solver_url": (None, "the loop's solver is its own checkpoint, loaded in-process"),
    "out": (None, "OUT/iter-N/proposer, and OUT/iter-N/questions.parquet for the generate step"),
    "resume": (None, "the loop resumes an interrupted sub-step itself (OUT/lineage.json)"),
    "seed": (None, "derived per iteration and sub-step from --seed (iteration_seeds)"),
    "generate_only": (None, "the loop runs both: training (propose step), then generation (generate step)"),
    "lr": ("proposer_lr", "each side has its own learning rate"),
    "steps": ("proposer_steps", "each side has its own step count"),
    "max_context_tokens": ("proposer_context_tokens", "each side has its own context budget"),
    "num_questions": ("questions_per_iteration", "the generate step's prompts, named for the loop"),
}

GENERATE_ONLY = ("num_questions", "samples")
"""`propose` options that only `--generate-only` uses: they reach drzero's generate step."""


def _other_value(opt: Option) -> Any:
    """A value of ``opt`` that is not its default, within its declared range or choices."""
    default = opt.default
    choices = getattr(opt.range, "values", None)
    if choices:
        return next(c for c in choices if c != default)
    kinds = {opt.annotation, *typing.get_args(opt.annotation)} - {type(None)}
    if bool in kinds:
        return not default
    if int in kinds:
        return 3 if default is None else default + 1
    if float in kinds:
        return 1.5 if default is None else (default / 2 if default > 0 else 0.5)
    if Path in kinds:
        return Path("elsewhere") if default is None else Path(default).with_name(Path(default).name + "-x")
    return "x" if default is None else f"{default}-x"


def _loop_options(tmp_path: Path, step_options: dict[str, Option], set_by_loop: dict) -> tuple[DrZeroOptions, dict]:
    """DrZeroOptions with every option ``step_options`` shares with the loop (same flat name,
    or the loop's own name from ``set_by_loop``) at a value that is no default; returns them
    and the value each step option must arrive with."""
    loop = leaves(DrZeroOptions)
    missing = sorted(name for name in step_options if name not in set_by_loop and name not in loop)
    assert not missing, f"options that never reach the sub-step (add them to DrZeroOptions): {missing}"
    values: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for name in step_options:
        source = set_by_loop[name][0] if name in set_by_loop else name
        if source is None:
            continue
        values.setdefault(source, _other_value(loop[source]))
        expected[name] = values[source]
    values["out"] = tmp_path / "drzero"  # the lineage's folder
    return DrZeroOptions.from_flat(**values), expected


def _arrived(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [f"{name}: sent {value!r}, got {got.get(name, '<missing>')!r}" for name, value in expected.items()
            if got.get(name, "<missing>") != value]


def test_every_solve_option_reaches_drzeros_solve_step(tmp_path, monkeypatch):
    import zsearch_cli.train.trainer as trainer

    seen: list = []
    monkeypatch.setattr(trainer, "run_training", lambda cfg, **kw: seen.append(cfg))
    opts, expected = _loop_options(tmp_path, cli_drzero.solve.options, SOLVE_SET_BY_LOOP)
    Loop(opts, {}).solve({"checkpoint": str(tmp_path / "none" / "final"), "run_dir": str(tmp_path / "solver"),
                          "solver_init": "SOLVER0", "data": "q.parquet", "batch_size": opts.solver_batch_size,
                          "seed": 7})
    (cfg,) = seen
    assert not _arrived(expected, to_flat(cfg)), _arrived(expected, to_flat(cfg))
    assert (cfg.policy.model, cfg.train_data, cfg.seed, cfg.preset) == ("SOLVER0", "q.parquet", 7, "drzero-solver")


def test_every_propose_option_reaches_drzeros_propose_step(tmp_path, monkeypatch):
    import zsearch_cli.commands.propose as propose
    import zsearch_cli.commands.propose_train as propose_train

    trained: list = []
    monkeypatch.setattr(propose_train, "train_proposer", lambda cfg, **kw: trained.append((cfg, kw)))
    generated: list = []

    class Captured(Exception):
        pass

    def generate_questions(gen, out, config):
        generated.append(gen)
        raise Captured

    monkeypatch.setattr(propose, "generate_questions", generate_questions)
    options = cli_drzero.propose.options
    opts, expected = _loop_options(tmp_path, options, PROPOSE_SET_BY_LOOP)
    loop = Loop(opts, {})
    loop.propose({"checkpoint": str(tmp_path / "none" / "final"), "run_dir": str(tmp_path / "proposer"),
                  "proposer_init": "PROPOSER0", "solver": "SOLVER0", "seed": 5})
    with pytest.raises(Captured):
        loop.generate({"data": str(tmp_path / "q.parquet"), "proposer": "PROPOSER1", "solver": "SOLVER0",
                       "seed": 6, "label": "iter-1/generate"})
    (cfg, kw), (gen,) = trained[0], generated
    training = {**to_flat(cfg), **kw}
    for name in GENERATE_ONLY:
        assert name in options and name not in leaves(type(cfg)), name
    wrong = _arrived({k: v for k, v in expected.items() if k not in GENERATE_ONLY}, training)
    assert not wrong, wrong
    # the generate step rolls out as the proposer trained: every shared rollout option, and its own
    generating = {k: v for k, v in expected.items() if k in leaves(type(gen)) and k not in ("batch_size",)}
    assert not _arrived(generating, to_flat(gen)), _arrived(generating, to_flat(gen))
    assert (cfg.policy.model, kw["solver_model"], cfg.preset) == ("PROPOSER0", "SOLVER0", "drzero-proposer")
    assert (gen.policy.model, gen.proposer.solver_model, gen.seed) == ("PROPOSER1", "SOLVER0", 6)


def test_the_proposer_leaves_out_what_hrpo_has_no_use_for(tmp_path, monkeypatch):
    # one place says what the proposer does not take; `zsearch propose` and the loop both follow it
    import zsearch_cli.commands.propose_train as propose_train
    from zsearch_cli.commands.drzero import PROPOSER_UNUSED

    propose = cli_drzero.propose.options
    unused = [n for n, opt in leaves(DrZeroOptions).items()
              if n in PROPOSER_UNUSED or any(p in PROPOSER_UNUSED for p in opt.path)]
    assert {"group_size", "beta", "loss_agg", "rollout_is", "rollout_rs"} <= set(unused)
    assert not set(unused) & set(propose)
    # the loop's solver settings stay off the proposer: it trains with the drzero-proposer preset's
    trained: list = []
    monkeypatch.setattr(propose_train, "train_proposer", lambda cfg, **kw: trained.append(cfg))
    opts = DrZeroOptions.from_flat(out=tmp_path, group_size=3, beta=0.5, loss_agg="token-mean", rollout_is="token",
                                   rollout_rs="token", mask_truncated=True)
    Loop(opts, {}).propose({"checkpoint": str(tmp_path / "none"), "run_dir": str(tmp_path / "p"),
                            "proposer_init": "P0", "solver": "S0", "seed": 1})
    (cfg,) = trained
    assert (cfg.group_size, cfg.loss.beta, cfg.loss.loss_agg, cfg.correction.rollout_is, cfg.correction.rollout_rs) == \
        (1, 0.0, None, "none", "none")
    assert cfg.loss.mask_truncated is True  # what the proposer does use still reaches it
