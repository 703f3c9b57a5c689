"""``zsearch drzero``: Dr. Zero's self-evolution loop (§3.4, Appendix A; docs/methods.md §5.4).

Each iteration i runs four sub-steps, every one an existing stage called as a library:

1. **propose**: train the proposer with HRPO (:func:`~zsearch_cli.commands.propose_train.train_proposer`),
   starting from iteration i−1's proposer, with the *current* solver frozen as the reward;
2. **generate**: write a PROPOSED_QA set with the new proposer (``propose --generate-only``);
3. **solve**: train the solver with GRPO on that set (``zsearch solve`` = ``train`` with the
   ``drzero-solver`` preset), starting from iteration i−1's solver;
4. **eval** (optional, ``--eval-datasets``): evaluate the new solver.

Both models start from the same base model. ``OUT/lineage.json`` is rewritten atomically
after every sub-step starts, finishes or fails: which checkpoint produced which data, which
data trained which checkpoint, every seed, and the eval results. It is also the resume
point: rerunning the same command skips every sub-step recorded as done (whose outputs
still exist), and a training sub-step that was interrupted continues from its latest
checkpoint through the trainer's ``--resume``. A training run whose ``final/`` exists is
complete (the trainer writes it last, atomically), so a kill between that and the lineage
update costs nothing either.

Seeds: iteration i uses ``seed + 1000·i + {1: propose, 2: generate, 3: solve}``, so every
iteration and sub-step samples differently, and the whole loop repeats from ``--seed``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from rich.console import Console

from zsearch_cli.config.fields import Record, check_options, execution_options, narrowed, option, part, to_flat
from zsearch_cli.config.parts import (BatchOptions, CorrectionOptions, DatasetOptions, GuardOptions, LossOptions,
                                      ModelOptions, OptimConfig, ProposerOptions, RolloutOptions, RunConfig, SearchConfig,
                                      Seeded)
from zsearch_cli.config.ranges import AT_LEAST_1, POSITIVE, Range
from zsearch_cli.errors import ZsearchError, read_back
from zsearch_cli.presets import PRESETS

LINEAGE = "lineage.json"
LINEAGE_FORMAT = "zsearch.drzero.lineage/1"

PROPOSER_UNUSED = ("train_data", "group_size", "loss_agg", "beta", "correction")
"""The solver's training options the proposer has no use for, by name (or part): HRPO trains on
the questions it writes itself, one per prompt (G = 1), with its own loss aggregation and no
KL (beta = 0, the drzero-proposer preset's); and it is strictly on-policy, so there is no
ratio for a rollout correction to weight. ``zsearch propose`` leaves them out too
(``cli_drzero.PROPOSE_EXCLUDES``), so the proposer step stays ``zsearch propose``."""


_PROPOSER, _SOLVER = PRESETS["drzero-proposer"], PRESETS["drzero-solver"]


@dataclass(kw_only=True)
class DrZeroOptions(Seeded, Record):
    """What ``zsearch drzero`` runs; defaults are Dr. Zero's (Appendix A, Tables 5–6), from the
    drzero-proposer and drzero-solver presets. Every option whose flat name is a training
    option goes to both training sub-steps (the proposer less :data:`PROPOSER_UNUSED`), so the
    solve step is ``zsearch solve`` and the propose step ``zsearch propose``
    (tests/test_drzero_parity.py): the protocol is Dr. Zero's tool calls, and the model, context
    budget, learning rate and steps are each side's own options below."""

    policy: ModelOptions = part(ModelOptions)
    retrieval: SearchConfig = part(SearchConfig, index=Path("runs/index"))
    rollout: RolloutOptions = part(RolloutOptions, exclude=("protocol", "max_context_tokens"),
                                   ranges={"temperature": Range(0, lo_open=True, why="RL samples")},
                                   **{k: _PROPOSER[k] for k in ("topk", "max_turns", "max_turn_tokens", "max_obs_tokens")})
    optim: OptimConfig = part(OptimConfig, exclude=("lr",), warmup_ratio=_PROPOSER["warmup_ratio"])
    # the loop resumes its sub-steps itself (OUT/lineage.json)
    run: RunConfig = part(RunConfig, exclude=("resume",), out=Path("runs/drzero"), save_every=_PROPOSER["save_every"])
    # the solver is the loop's own, iteration by iteration
    proposer: ProposerOptions = part(ProposerOptions, exclude=("solver_model", "solver_url"))
    # one update per batch on both sides: HRPO is strictly on-policy, and `zsearch solve` leaves
    # GRPO's epochs and mini-batches to the drzero-solver preset
    batch: BatchOptions = part(BatchOptions, exclude=("ppo_epochs", "mini_batch_size"))
    loss: LossOptions = part(LossOptions)
    correction: CorrectionOptions = part(CorrectionOptions)
    collapse: GuardOptions = part(GuardOptions)

    # a rerun may add iterations: the ones done stay what they were
    iterations: int = option(3, range=AT_LEAST_1, execution=True)
    """Self-evolution iterations (Dr. Zero: 3)."""
    proposer_steps: int = option(_PROPOSER["steps"], range=AT_LEAST_1)
    """HRPO steps per iteration."""
    solver_steps: int = option(_SOLVER["steps"], range=AT_LEAST_1)
    """GRPO steps per iteration."""
    questions_per_iteration: int = option(64, range=AT_LEAST_1)
    """Proposer prompts at each generate sub-step (questions that fail the gate are dropped)."""
    samples: int = option(1, range=AT_LEAST_1)
    """Proposer samples per prompt at generation (best by format kept)."""
    batch_size: int = option(_PROPOSER["batch_size"], range=AT_LEAST_1)
    """Proposer prompts per HRPO step and per generation batch."""
    solver_batch_size: int = option(8, range=AT_LEAST_1)
    """Questions per GRPO step (capped at the generated set's size)."""
    group_size: int = option(_SOLVER["group_size"], flags=("--group-size", "-G", "--num-generations"),
                             range=Range(2, why="GRPO's group baseline"))
    """G, solver responses per question."""
    proposer_lr: float = option(_PROPOSER["lr"], range=POSITIVE)
    """Proposer learning rate."""
    solver_lr: float = option(_SOLVER["lr"], range=POSITIVE)
    """Solver learning rate."""
    proposer_context_tokens: int = option(_PROPOSER["max_context_tokens"], range=AT_LEAST_1)
    """Proposer prompt + response budget."""
    solver_context_tokens: int = option(_SOLVER["max_context_tokens"], range=AT_LEAST_1)
    """Solver prompt + response budget."""
    # the eval measures a solver, never changes one
    eval_datasets: str = option("", execution=True)
    """Evaluate each iteration's solver on these (as `eval --datasets`); empty = no eval."""
    eval_data_dir: Path = option(Path("data"), execution=True)
    """Benchmark files for --eval-datasets (FlashRAG layout)."""
    eval_limit: Optional[int] = option(None, range=AT_LEAST_1, execution=True)
    """Only the first N examples of each eval dataset [all]."""


def iteration_seeds(seed: int, iteration: int) -> dict[str, int]:
    """The seeds of iteration ``iteration`` (1-based), derived from ``--seed`` alone."""
    base = seed + 1000 * iteration
    return {"propose": base + 1, "generate": base + 2, "solve": base + 3}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


class Lineage:
    """OUT/lineage.json: the loop's manifest and resume point, written atomically."""

    def __init__(self, path: Path, opts: DrZeroOptions):
        self.path = path
        now = opts.to_dict()
        if path.is_file():
            self.data = json.loads(path.read_text())
            saved = self.data.get("options", {})
            # an option added since the lineage was written ran at its default
            # (read back: a key the lineage withheld, ***, equals the one given again)
            saved = read_back({**DrZeroOptions().to_dict(), **saved})
            may_change = execution_options(DrZeroOptions)  # option(execution=True): how the loop runs
            changed = [f"{k}={saved.get(k)!r}->{v!r}" for k, v in now.items()
                       if k not in may_change and saved.get(k) != v]
            if changed:
                raise ZsearchError(f"{path}: options differ from the recorded loop ({', '.join(changed)}); "
                                   "pass the same options or choose another --out")
            self.data["options"] = now
        else:
            self.data = {"format": LINEAGE_FORMAT, "base_model": opts.policy.model, "seed": opts.seed, "options": now,
                         "iterations": [], "current": {"proposer": opts.policy.model, "solver": opts.policy.model}}

    def save(self) -> None:
        self.data["updated"] = _now()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.path)

    def iteration(self, i: int) -> dict[str, Any]:
        """Iteration ``i``'s record (1-based), created with its seeds when new."""
        its = self.data["iterations"]
        while len(its) < i:
            its.append({"iteration": len(its) + 1, "seeds": iteration_seeds(self.data["seed"], len(its) + 1)})
        return its[i - 1]


def _outputs_exist(rec: dict[str, Any]) -> bool:
    return all(Path(rec[k]).exists() for k in ("checkpoint", "data") if rec.get(k))


class Loop:
    """Runs the iterations, recording each sub-step in the lineage before and after."""

    def __init__(self, opts: DrZeroOptions, config: dict[str, Any], console: Console | None = None):
        self.opts = opts
        self.config = config
        self.console = console or Console(stderr=True)
        self.lineage = Lineage(Path(opts.run.out) / LINEAGE, opts)
        self.ran = 0

    def substep(self, it: dict[str, Any], name: str, plan: dict[str, Any],
                work: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Skip ``name`` when recorded done with its outputs present; else record it as
        running with ``plan`` (inputs, planned outputs), run ``work``, record the result."""
        rec = it.get(name)
        if rec and rec.get("status") == "done" and _outputs_exist(rec):
            return rec
        rec = {**plan, "status": "running", "started": _now()}
        it[name] = rec
        self.lineage.save()
        self.console.print(f"[bold]drzero iteration {it['iteration']}/{self.opts.iterations}: {name}[/]",
                           soft_wrap=True)
        self.ran += 1
        try:
            rec.update(work(rec))
        except ZsearchError as err:
            rec.update(status="failed", error=str(err), finished=_now())
            self.lineage.save()
            raise ZsearchError(f"drzero iteration {it['iteration']} {name}: {err}") from None
        rec.update(status="done", finished=_now())
        self.lineage.save()
        return rec

    # ------------------------------------------------------------------ the sub-steps

    def _train_config(self, preset: str, run_dir: str, *, unused: tuple[str, ...] = (), **own: Any) -> Any:
        """A training sub-step's config: its preset, then every option of the loop that is a
        training option (the same flat name; less ``unused``), then ``own``, the side's own
        values (model, learning rate, context budget, steps, seed); ``resume`` when an
        interrupted run left checkpoints."""
        from zsearch_cli.train.checkpoint import latest_checkpoint
        from zsearch_cli.train.config import TrainConfig

        training = narrowed(TrainConfig, unused)
        loop = {k: v for k, v in to_flat(self.opts).items() if k in training}
        return TrainConfig.from_preset(preset, **{**loop, **own, "out": Path(run_dir),
                                                  "resume": latest_checkpoint(Path(run_dir)) is not None})

    def propose(self, rec: dict[str, Any]) -> dict[str, Any]:
        from zsearch_cli.commands.propose_train import train_proposer

        if not Path(rec["checkpoint"]).is_dir():  # final/ exists = that run completed
            o = self.opts
            cfg = self._train_config("drzero-proposer", rec["run_dir"], unused=PROPOSER_UNUSED, model=rec["proposer_init"],
                                     lr=o.proposer_lr, max_context_tokens=o.proposer_context_tokens,
                                     steps=o.proposer_steps, batch_size=o.batch_size, seed=rec["seed"])
            train_proposer(cfg, solver_model=rec["solver"], solver_samples=o.proposer.solver_samples,
                           hop_ratio=o.proposer.hop_ratio, solver_protocol=o.proposer.solver_protocol,
                           proposer_prompt=o.proposer.proposer_prompt, answer_reward=o.proposer.answer_reward,
                           console=self.console)
        return {}

    def generate(self, rec: dict[str, Any]) -> dict[str, Any]:
        from zsearch_cli.artifacts import read_artifact
        from zsearch_cli.schemas import PROPOSED_QA
        from zsearch_cli.commands.propose import GenerateOptions, generate_questions

        o = self.opts
        if not Path(rec["data"]).is_file():  # written atomically once complete
            gen = GenerateOptions(
                policy=replace(o.policy, model=rec["proposer"]), retrieval=o.retrieval,
                rollout=replace(o.rollout, max_context_tokens=o.proposer_context_tokens),
                proposer=replace(o.proposer, solver_model=rec["solver"]), num_questions=o.questions_per_iteration,
                samples=o.samples, seed=rec["seed"], batch_size=o.batch_size)
            generate_questions(gen, Path(rec["data"]), {**self.config, "drzero_substep": rec["label"]})
        rows = read_artifact(rec["data"], PROPOSED_QA).to_pylist()
        hops = {str(h): sum(r["hops"] == h for r in rows) for h in (1, 2, 3, 4)}
        return {"questions": len(rows), "hops": hops, "mean_k": sum(r["k"] for r in rows) / len(rows),
                "mean_difficulty": sum(r["difficulty"] for r in rows) / len(rows)}

    def solve(self, rec: dict[str, Any]) -> dict[str, Any]:
        from zsearch_cli.train.trainer import run_training

        if not Path(rec["checkpoint"]).is_dir():
            o = self.opts
            cfg = self._train_config("drzero-solver", rec["run_dir"], model=rec["solver_init"], lr=o.solver_lr,
                                     protocol=o.proposer.solver_protocol,  # the one the proposer was rewarded with
                                     max_context_tokens=o.solver_context_tokens, train_data=str(rec["data"]),
                                     steps=o.solver_steps, batch_size=rec["batch_size"], group_size=o.group_size,
                                     seed=rec["seed"])
            run_training(cfg, console=self.console)
        return {}

    def evaluate(self, rec: dict[str, Any]) -> dict[str, Any]:
        from zsearch_cli.commands.evaluate import EvalOptions, evaluate

        o = self.opts
        summaries = evaluate(EvalOptions(
            data=DatasetOptions(datasets=o.eval_datasets, data_dir=Path(o.eval_data_dir)), out=Path(rec["out"]),
            limit=o.eval_limit,
            policy=replace(o.policy, model=rec["model"]), retrieval=o.retrieval,
            # greedy, as `zsearch eval` scores
            rollout=replace(o.rollout, protocol=o.proposer.solver_protocol, max_context_tokens=o.solver_context_tokens,
                            temperature=0.0, top_p=1.0),
        ), {**self.config, "drzero_substep": rec["label"]})
        return {"results": [{k: s[k] for k in ("dataset", "n", "em", "f1", "subem")} for s in summaries]}

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        o = self.opts
        out = Path(o.run.out)
        proposer = solver = o.policy.model
        for i in range(1, o.iterations + 1):
            it = self.lineage.iteration(i)
            seeds = it["seeds"]
            d = out / f"iter-{i}"
            rec = self.substep(it, "propose", {
                "label": f"iter-{i}/propose", "proposer_init": proposer, "solver": solver, "seed": seeds["propose"],
                "steps": o.proposer_steps, "run_dir": str(d / "proposer"), "checkpoint": str(d / "proposer" / "final"),
            }, self.propose)
            proposer = rec["checkpoint"]
            rec = self.substep(it, "generate", {
                "label": f"iter-{i}/generate", "proposer": proposer, "solver": solver, "seed": seeds["generate"],
                "prompts": o.questions_per_iteration, "data": str(d / "questions.parquet"),
            }, self.generate)
            data, n_questions = rec["data"], rec["questions"]
            rec = self.substep(it, "solve", {
                "label": f"iter-{i}/solve", "solver_init": solver, "data": data, "seed": seeds["solve"],
                "steps": o.solver_steps, "batch_size": min(o.solver_batch_size, n_questions),
                "run_dir": str(d / "solver"), "checkpoint": str(d / "solver" / "final"),
            }, self.solve)
            solver = rec["checkpoint"]
            if o.eval_datasets.strip():
                self.substep(it, "eval", {
                    "label": f"iter-{i}/eval", "model": solver, "datasets": o.eval_datasets, "limit": o.eval_limit,
                    "out": str(d / "eval"),
                }, self.evaluate)
            if self.lineage.data["current"] != {"proposer": proposer, "solver": solver}:
                self.lineage.data["current"] = {"proposer": proposer, "solver": solver}
                self.lineage.save()
        if self.ran == 0:
            self.console.print(f"drzero: all {o.iterations} iteration(s) already done in {out / LINEAGE}; "
                               "nothing to run", soft_wrap=True)
        else:
            self.console.print(f"drzero: done; proposer {proposer}, solver {solver}, lineage {out / LINEAGE}",
                               soft_wrap=True)
        return self.lineage.data


def check_loop_options(opts: DrZeroOptions) -> None:
    """Every invalid value as one line, before anything heavy loads."""
    from zsearch_cli.algos.correction import check_correction
    from zsearch_cli.commands.propose import check_proposer_prompt, parse_hop_ratio

    check_options(opts)  # the declared ranges and choices: the same check as the command line's
    check_correction(opts.correction)
    parse_hop_ratio(opts.proposer.hop_ratio)
    check_proposer_prompt(opts.proposer.proposer_prompt, opts.proposer.hop_ratio)
    index = opts.retrieval.index
    if not (Path(index) / "manifest.json").is_file():
        raise ZsearchError(f"{index}: no index there (build one with `zsearch index --out {index}`)")


def run_drzero(opts: DrZeroOptions, config: dict[str, Any], console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) the loop; returns the lineage."""
    check_loop_options(opts)
    return Loop(opts, config, console).run()
