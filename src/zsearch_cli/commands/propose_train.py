"""``zsearch propose`` training mode: HRPO on the Dr. Zero proposer (§3.2; docs/methods.md §4.7).

Not a second trainer: the one RL loop (:class:`~zsearch_cli.train.trainer.Trainer`) runs
``--algo hrpo`` with two stage-specific parts plugged in:

- :class:`ProposerData` replaces the QA file. Each step draws B fresh (hop count, seed
  passage) prompts from ``proposer_prompts(index, B, hop_ratio, seed, step)``, a pure
  function of (seed, step), so the checkpointed state is just the step counter and a
  resumed run sees exactly the prompts the uninterrupted one would have.
- :class:`ProposerReward` is the trainer's batch reward: every question that passes the
  integrity gate is answered n times by the **frozen** solver in one batched rollout
  (:func:`~zsearch_cli.commands.propose.score_proposals`), giving
  r = I(0<k<n)(n−k)/(n−1) + r_f; it returns each trajectory's hop count as its group key
  (what HRPO groups the advantages by) and the proposer's columns for the saved rollouts.

Everything else — one question per prompt (G = 1), one on-policy update per batch with no
ratio clipping and β = 0 (``algos/hrpo.py``), loss-masked tool responses (the engine),
checkpoints and ``--resume``, metrics, LoRA, accelerate — is the trainer's.

The solver is a separate frozen model loaded from ``--solver-model`` (default: the
proposer's starting weights), or an OpenAI-compatible server (``--solver-url``, e.g.
``vllm serve`` on its own GPU; :class:`~zsearch_cli.models.remote.RemoteBackend`). It must not be the training policy: with the HF backend the
trainer generates with the very policy object it updates, so sharing it would make the
reward move with every proposer update.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.rewards import difficulty_reward
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.search.base import SearchBackend
from zsearch_cli.train.config import TrainConfig
from zsearch_cli.train.step_samples import BatchRewards
from zsearch_cli.commands.propose import (
    HOPS,
    SOURCE_TOKENS,
    ProposerPrompt,
    check_proposer_prompt,
    parse_hop_ratio,
    proposer_prompts,
    score_proposals,
    solver_backend,
)

RUN_FILE = "proposer.json"
"""OUT/proposer.json: the proposer-run options the trainer's config does not hold (solver,
n, hop ratio); a ``--resume`` with different values is refused, as the trainer does for its own."""


class ProposerData:
    """The trainer's data source for proposer training: B seeded proposer prompts per step."""

    def __init__(self, index: Any, batch_size: int, hop_ratio: str, seed: int, tokenizer: Any,
                 source_tokens: int = SOURCE_TOKENS, style: str = "figure5"):
        parse_hop_ratio(hop_ratio)  # a bad ratio fails before any model loads
        check_proposer_prompt(style, hop_ratio)
        self.style = style
        self.index = index
        self.batch_size = batch_size
        self.hop_ratio = hop_ratio
        self.seed = seed
        self.tokenizer = tokenizer
        self.source_tokens = source_tokens
        self.step = 0
        self._prompts: dict[str, ProposerPrompt] = {}

    def next_batch(self) -> list[QARow]:
        """The next step's B prompts (Figure 5 over a truncated seed passage); moves the step."""
        prompts = proposer_prompts(self.index, self.batch_size, self.hop_ratio, self.seed, self.step, self.style)
        self.step += 1
        self._prompts = {p.id: p for p in prompts}
        return [p.row(self.tokenizer, self.source_tokens) for p in prompts]

    def prompt(self, row_id: str) -> ProposerPrompt:
        """The prompt behind a trajectory of the latest batch (its hop count and source)."""
        return self._prompts[row_id]

    def state(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def proposer_metrics(scored: list[dict[str, Any]], n: int) -> dict[str, float | None]:
    """One step's proposer log (``proposer/…``): mean difficulty and format reward over all
    proposals, mean solver k over the questions that passed the gate, how many passed,
    hop-count counts."""
    passed = [s for s in scored if s["fmt"]["integrity"]]
    total = max(len(scored), 1)
    out: dict[str, float | None] = {
        "proposer/difficulty": sum(difficulty_reward(s["k"], n) for s in passed) / total,
        "proposer/format_reward": sum(float(s["fmt"]["total"]) for s in scored) / total,
        "proposer/solver_k": sum(s["k"] for s in passed) / len(passed) if passed else None,
        "proposer/gate_pass": float(len(passed)),
    }
    out.update({f"proposer/hops_{h}": float(sum(s["hops"] == h for s in scored)) for h in HOPS})
    return out


class ProposerReward:
    """Batch reward for HRPO: the frozen solver's difficulty + the format reward.

    ``solver`` may be bound after construction (it needs the trainer's device)."""

    def __init__(self, data: ProposerData, n_solver: int = 5, solver: RolloutEngine | None = None,
                 answer_reward: str = "extractable"):
        if n_solver < 2:
            raise ZsearchError(f"--solver-samples must be >= 2 (the difficulty reward needs n >= 2), got {n_solver}")
        self.data = data
        self.n_solver = n_solver
        self.solver = solver
        self.answer_reward = answer_reward

    def __call__(self, trajs: list[Trajectory], step: int) -> BatchRewards:
        if self.solver is None:
            raise RuntimeError("ProposerReward: no solver bound")
        prompts = [self.data.prompt(t.row_id) for t in trajs]
        scored = score_proposals(trajs, prompts, self.solver, self.n_solver, step=step, answer_reward=self.answer_reward)
        columns = [{"hops": int(s["hops"]), "solver_k": int(s["k"]), "gate_pass": bool(s["fmt"]["integrity"]),
                    "difficulty": difficulty_reward(s["k"], self.n_solver) if s["fmt"]["integrity"] else 0.0,
                    "format_reward": float(s["fmt"]["total"]), "proposed_question": s["question"],
                    "proposed_answer": s["answer"], "solver_answers": list(s["solver_answers"])} for s in scored]
        return BatchRewards(rewards=[float(s["reward"]) for s in scored], group_keys=[int(s["hops"]) for s in scored],
                            metrics=proposer_metrics(scored, self.n_solver), columns=columns)


def solver_engine(solver_model: str, cfg: TrainConfig, search: SearchBackend, device: str, solver_url: str | None = None,
                  protocol: str = "tool_call") -> RolloutEngine:
    """The frozen solver: its own model copy (or a server), its protocol (Dr. Zero's tool calls and
    Figure 6 prompt by default), the run's turn limits, and a sampling seed apart from the proposer's."""
    from zsearch_cli.rollout.build import build_engine

    backend = solver_backend(solver_model, solver_url, backend=cfg.policy.backend, device=device, dtype=cfg.policy.dtype)
    return build_engine(cfg, backend=backend, search=search, protocol=protocol, seed=cfg.seed + 1)


RUN_DEFAULTS = {"solver_protocol": "tool_call", "proposer_prompt": "figure5", "answer_reward": "extractable"}
"""What a proposer.json written before these options existed ran with."""


def _check_run_file(out: Path, options: dict[str, Any], resume: bool) -> None:
    path = out / RUN_FILE
    if not (resume and path.is_file()):
        return
    saved = {**RUN_DEFAULTS, **json.loads(path.read_text())}
    changed = [f"{k}={saved.get(k)!r}->{v!r}" for k, v in options.items() if saved.get(k) != v]
    if changed:
        raise ZsearchError(f"--resume: options differ from the proposer run in {out} ({', '.join(changed)}); "
                           "pass the same options or choose another --out")


def _write_run_file(out: Path, options: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(options, indent=2) + "\n")
    os.replace(tmp, out / RUN_FILE)


def train_proposer(cfg: TrainConfig, *, solver_model: str | None = None, solver_url: str | None = None,
                   solver_samples: int = 5, hop_ratio: str = "4:3:2:1", solver_protocol: str = "tool_call",
                   proposer_prompt: str = "figure5", answer_reward: str = "extractable", console: Any = None) -> Path:
    """Train the proposer with HRPO for ``cfg.steps`` steps; returns OUT/final.

    ``cfg`` is a :class:`~zsearch_cli.train.config.TrainConfig` with ``algo='hrpo'`` and the
    tool-call protocol (``TrainConfig.from_preset('drzero-proposer', ...)``); its
    ``batch_size`` is the number of proposer prompts per step. With ``solver_url`` the solver
    answers from that OpenAI-compatible server (``solver_model`` names its tokenizer)."""
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.search.factory import make_search_backend
    from zsearch_cli.train.trainer import Trainer

    if cfg.algo != "hrpo" or cfg.rollout.protocol != "tool_call":
        raise ZsearchError(f"proposer training runs --algo hrpo with the tool_call protocol, got "
                           f"--algo {cfg.algo} --protocol {cfg.rollout.protocol}")
    proposer_run = {"solver_model": solver_model or cfg.policy.model, "solver_url": solver_url or None,
             "solver_samples": solver_samples, "hop_ratio": hop_ratio, "solver_protocol": solver_protocol,
             "proposer_prompt": proposer_prompt, "answer_reward": answer_reward}
    _check_run_file(Path(cfg.run.out), proposer_run, cfg.run.resume)
    index_dir = cfg.retrieval.index or Path("runs/index")
    data = ProposerData(load_index(index_dir), cfg.batch_size, hop_ratio, cfg.seed, load_tokenizer(cfg.policy.model),
                        style=proposer_prompt)
    reward = ProposerReward(data, solver_samples, answer_reward=answer_reward)
    search = make_search_backend(cfg.retrieval.search, index_dir=index_dir)
    trainer = Trainer(cfg, search=search, data=data, batch_reward_fn=reward, console=console)
    reward.solver = solver_engine(proposer_run["solver_model"], cfg, search, str(trainer.accelerator.device),
                                  solver_url=proposer_run["solver_url"], protocol=solver_protocol)
    if trainer.accelerator.is_main_process:
        _write_run_file(Path(cfg.run.out), proposer_run)
    return trainer.train()
