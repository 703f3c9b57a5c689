"""Dr. Zero's proposer (§3.2–3.4; docs/methods.md §5): seed passages, hop draws, proposer
rollouts, and the difficulty reward measured by solver rollouts.

A proposer prompt starts from one corpus passage (truncated to 256 tokens) and asks for an
n-hop question answerable by searching from it; hop counts 1–4 are drawn in the ratio
``4:3:2:1`` from a seeded RNG. The current solver answers each proposed question
``n = 5`` times; with k EM-correct answers the reward is
``r = I(0 < k < n)·(n − k)/(n − 1) + r_f`` (``rewards.proposer_reward``), where the format
reward r_f and its integrity gate are ``rewards.proposer_format_reward``.

This module is the generation and reward side, shared by ``zsearch propose
--generate-only`` and by HRPO training of the proposer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from zsearch_cli.config.fields import check_options
from zsearch_cli.errors import ZsearchError
from zsearch_cli.config.commands import GenerateOptions
from zsearch_cli.prompts import format_source_document, render_proposer_prompt
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.rewards import em, extract_question_answer, proposer_format_reward, proposer_reward
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory

HOPS = (1, 2, 3, 4)
SOURCE_TOKENS = 256


def parse_hop_ratio(spec: str) -> np.ndarray:
    """``'4:3:2:1'`` -> probabilities for hop counts 1..4."""
    try:
        weights = np.array([float(x) for x in spec.split(":")], dtype=np.float64)
    except ValueError:
        raise ZsearchError(f"--hop-ratio {spec!r}: expected four numbers like 4:3:2:1") from None
    if weights.shape != (len(HOPS),) or (weights < 0).any() or weights.sum() <= 0:
        raise ZsearchError(f"--hop-ratio {spec!r}: expected four non-negative numbers like 4:3:2:1")
    return weights / weights.sum()


def draw_hops(n: int, ratio: str, seed: int) -> list[int]:
    """``n`` hop counts in ``ratio`` from a generator seeded by ``seed`` alone (Dr. Zero's code
    draws them unseeded, so its runs cannot be repeated)."""
    rng = np.random.default_rng([seed, 0x40B5])
    return [int(h) for h in rng.choice(HOPS, size=n, p=parse_hop_ratio(ratio))]


def sample_seed_rows(n_docs: int, n: int, seed: int, step: int = 0) -> list[int]:
    """``n`` distinct corpus rows for one step, seeded by (seed, step)."""
    if n_docs <= 0:
        raise ZsearchError("the corpus is empty: no seed passages to propose from")
    rng = np.random.default_rng([seed, step, 0x5EED])
    return [int(r) for r in rng.choice(n_docs, size=n, replace=n > n_docs)]


def truncate_tokens(text: str, tokenizer: Any, max_tokens: int = SOURCE_TOKENS) -> str:
    """The first ``max_tokens`` tokens of ``text`` (whole text when shorter)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


@dataclass(frozen=True)
class ProposerPrompt:
    id: str
    hops: int
    source: Passage
    style: str = "figure5"  # --proposer-prompt

    def row(self, tokenizer: Any, max_tokens: int = SOURCE_TOKENS) -> QARow:
        """The engine row: the proposer prompt (Figure 5, or the short one) over the truncated
        source document. The row's question is a label only (the search backend receives it
        as context)."""
        document = truncate_tokens(format_source_document(self.source.title, self.source.text), tokenizer, max_tokens)
        return QARow(self.id, f"[{self.hops}-hop proposal from {self.source.id}]", [],
                     prompt=render_proposer_prompt(self.hops, document, self.style))


def check_proposer_prompt(style: str, ratio: str) -> None:
    """One line when ``--proposer-prompt short`` would be asked for more than one hop: its
    worked example is a 1-hop question, and it says nothing of searching."""
    if style == "short" and parse_hop_ratio(ratio)[1:].sum() > 0:
        raise ZsearchError(f"--proposer-prompt short writes 1-hop questions only; pass --hop-ratio 1:0:0:0, "
                           f"not {ratio!r}")


def proposer_prompts(index: Any, n: int, ratio: str, seed: int, step: int = 0,
                     style: str = "figure5") -> list[ProposerPrompt]:
    """``n`` seeded (hop count, source passage) prompts for one step."""
    check_proposer_prompt(style, ratio)
    rows = sample_seed_rows(len(index), n, seed, step)
    hops = draw_hops(n, ratio, seed + 7919 * step)
    return [ProposerPrompt(f"s{step}-p{i}-{index.get(r).id}", h, index.get(r), style)
            for i, (r, h) in enumerate(zip(rows, hops))]


ANSWER_REWARDS = ("extractable", "grounded")
"""``--answer-reward``: the format reward's answer part, the paper's or Dr. Zero's code's."""


def evidence(traj: Trajectory, prompt: ProposerPrompt) -> str:
    """What the proposer saw: its source passage and the tool responses the engine inserted
    (the response text less the proposer's own turns, so its own ``<answer>`` is no evidence)."""
    rest = traj.response_text
    for turn in traj.policy_texts:
        rest = rest.replace(turn, "\n", 1)
    return f"{prompt.source.title}\n{prompt.source.text}\n{rest}"


def format_reward(traj: Trajectory, prompt: ProposerPrompt, answer_reward: str = "extractable") -> dict[str, Any]:
    """:func:`~zsearch_cli.rewards.proposer_format_reward` of one proposal, its answer part
    grounded in :func:`evidence` with ``answer_reward='grounded'``."""
    if answer_reward not in ANSWER_REWARDS:
        raise ZsearchError(f"unknown --answer-reward {answer_reward!r}: use one of {', '.join(ANSWER_REWARDS)}")
    grounded = evidence(traj, prompt) if answer_reward == "grounded" else None
    return proposer_format_reward(traj.policy_texts, prompt.hops, grounded)


def _solver_row(question: str, answer: str, key: str) -> QARow:
    qid = hashlib.blake2b(f"{key}\x00{question}".encode(), digest_size=6).hexdigest()
    return QARow(f"q-{qid}", question, [answer])


def score_proposals(
    proposals: Sequence[Trajectory],
    prompts: Sequence[ProposerPrompt],
    solver: RolloutEngine,
    n_solver: int = 5,
    step: int = 0,
    answer_reward: str = "extractable",
) -> list[dict[str, Any]]:
    """Reward each proposer trajectory (aligned with ``prompts``).

    Questions failing the integrity gate get reward 0 without costing solver rollouts;
    the rest are answered ``n_solver`` times by the solver in one batched rollout."""
    scored: list[dict[str, Any]] = []
    to_solve: list[tuple[int, QARow]] = []
    for i, (traj, prompt) in enumerate(zip(proposals, prompts)):
        turns = traj.policy_texts  # the engine's observation spans left out, not a text search
        question, answer = extract_question_answer(turns)
        fmt = format_reward(traj, prompt, answer_reward)
        scored.append({"question": question, "answer": answer, "fmt": fmt, "k": 0, "solver_answers": [],
                       "reward": 0.0, "hops": prompt.hops, "source_id": prompt.source.id})
        if fmt["integrity"]:
            to_solve.append((i, _solver_row(question, answer, traj.id)))
    if to_solve:
        trajs = solver.rollout([row for _, row in to_solve], group_size=n_solver, step=step)
        for j, (i, row) in enumerate(to_solve):
            group = trajs[j * n_solver : (j + 1) * n_solver]
            preds = [t.prediction for t in group]
            k = sum(int(p is not None and em(p, row.golden_answers) == 1.0) for p in preds)
            scored[i].update(k=k, solver_answers=[p or "" for p in preds])
    for s in scored:
        s["reward"] = proposer_reward(s["k"], n_solver, s["fmt"])
    return scored


def qa_rows(scored: Sequence[dict[str, Any]], prompts: Sequence[ProposerPrompt], n_solver: int) -> list[dict[str, Any]]:
    """PROPOSED_QA rows: a QA file for `solve`, plus every reward component."""
    rows = []
    for s, p in zip(scored, prompts):
        if not s["fmt"]["integrity"]:
            continue
        fmt = s["fmt"]
        rows.append({
            "id": p.id, "question": s["question"], "golden_answers": [s["answer"]],
            "metadata": json.dumps({"hops": s["hops"], "source_id": s["source_id"]}),
            "hops": s["hops"], "source_id": s["source_id"], "proposer_answer": s["answer"],
            "solver_answers": s["solver_answers"], "k": s["k"], "n": n_solver,
            "difficulty": s["reward"] - fmt["total"], "fmt_think": fmt["think"], "fmt_tool": fmt["tool"],
            "fmt_question": fmt["question"], "fmt_answer": fmt["answer"], "format_total": fmt["total"],
            "reward": s["reward"],
        })
    return rows


def best_of(trajs: Sequence[Trajectory], prompts: Sequence[ProposerPrompt], m: int,
            answer_reward: str = "extractable") -> list[Trajectory]:
    """For each prompt, the sample (of ``m``, row-major) with the highest format score that
    passes the integrity gate, else the first sample; as Dr. Zero's generation code does."""
    best = []
    for i, prompt in enumerate(prompts):
        group = trajs[i * m : (i + 1) * m]
        formats = [format_reward(t, prompt, answer_reward) for t in group]
        order = sorted(range(m), key=lambda j: (not formats[j]["integrity"], -formats[j]["total"], j))
        best.append(group[order[0]])
    return best


# ----------------------------------------------------------------------------- generate-only


def solver_backend(solver_model: str, solver_url: str | None, *, backend: str, device: str,
                   dtype: str = "auto") -> Any:
    """The solver's generation backend: an OpenAI-compatible server at ``solver_url``
    (``solver_model`` then only names its tokenizer), else its own in-process model copy."""
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.models.factory import load_backend

    if solver_url:
        from zsearch_cli.models.remote import RemoteBackend

        return RemoteBackend(solver_url, load_tokenizer(solver_model))
    return load_backend(solver_model, backend=backend, device=device, dtype=dtype)


def make_engines(opts: Any) -> tuple[RolloutEngine, RolloutEngine, Any]:
    """(proposer engine, solver engine, index) sharing one search backend; the solver
    shares the proposer's weights when it is the same model."""
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.rollout.build import build_engine

    index = load_index(opts.retrieval.index)
    proposer = build_engine(opts, protocol="tool_call")  # Figure 5's format, whatever the solver speaks
    if opts.proposer.solver_url or opts.proposer.solver_model not in (None, opts.policy.model):
        solver = solver_backend(opts.proposer.solver_model or opts.policy.model, opts.proposer.solver_url, backend=opts.policy.backend,
                                device=opts.policy.device)
    else:
        solver = proposer.backend  # the same weights: share the loaded model
    return (proposer, build_engine(opts, backend=solver, search=proposer.search, protocol=opts.proposer.solver_protocol,
                                   seed=opts.seed + 1), index)


def generate_questions(opts: GenerateOptions, out: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Propose ``num_questions`` questions (best of ``samples``), score them with the solver,
    and write the PROPOSED_QA Parquet at ``out``."""
    from rich.console import Console

    from zsearch_cli.progress import progress_bar
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import PROPOSED_QA

    check_options(opts)  # the declared ranges and choices: the same check as the command line's
    check_proposer_prompt(opts.proposer.proposer_prompt, opts.proposer.hop_ratio)  # before any model loads
    proposer, solver, index = make_engines(opts)
    prompts = proposer_prompts(index, opts.num_questions, opts.proposer.hop_ratio, opts.seed,
                               style=opts.proposer.proposer_prompt)
    rows: list[dict[str, Any]] = []
    with progress_bar(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("propose", total=len(prompts))
        for start in range(0, len(prompts), opts.batch_size):
            batch = prompts[start : start + opts.batch_size]
            trajs = proposer.rollout([p.row(proposer.tokenizer) for p in batch], group_size=opts.samples)
            reward = opts.proposer.answer_reward
            scored = score_proposals(best_of(trajs, batch, opts.samples, reward), batch, solver,
                                     opts.proposer.solver_samples, answer_reward=reward)
            rows += qa_rows(scored, batch, opts.proposer.solver_samples)
            bar.advance(task, len(batch))
    if not rows:
        raise ZsearchError(f"none of the {len(prompts)} proposals passed the format gate (a question and an "
                           "answer not contained in it); train the proposer first or raise --samples")
    write_artifact(rows, out, PROPOSED_QA, config)
    Console(stderr=True).print(f"wrote {len(rows)} of {len(prompts)} proposed questions to {out}")
    return rows
