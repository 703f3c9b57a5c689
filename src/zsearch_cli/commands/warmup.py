"""Format warm-up data: gold "teacher" trajectories over a QA file, for ``zsearch sft``.

Why: the papers start RL from models that already follow the action format (Qwen2.5
instruct/base at 3B+). A small model such as the bundled SmolLM2-135M answers in prose,
never writes ``<answer>``, so every reward is 0, every DSPO group is uniform and RL has
nothing to learn from. A short SFT on trajectories in the right format fixes that.

Each trajectory is played through the real :class:`~zsearch_cli.rollout.engine.RolloutEngine`
by :class:`TeacherBackend`, so prompts, observations (real search results from the chosen
backend, cut to the same budget) and the loss mask are exactly what a rollout produces:

1. ``<think> …plan… </think>`` and a search for the question itself;
2. after the results, ``<think> …</think>`` and ``<answer> GOLD </answer>``, GOLD being the
   row's first golden answer.

The data teaches the format, not the task: the answer is given whether or not the results
contain it. Keep the warm-up short (tens of steps) and let RL do the rest.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.config.commands import WarmupOptions
from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory

SEARCH_THOUGHT = "<think> I need to look this up. </think>\n"
ANSWER_THOUGHT = "<think> The search results answer the question. </think>\n"


class TeacherBackend:
    """Plays the two teacher turns for each known prompt: a search for the question, then
    the gold answer. A prompt is recognized by its token-id prefix (the row's encoded
    prompt), never by decoding text."""

    def __init__(self, tokenizer: Any, protocol: Any, prompts: dict[tuple[int, ...], QARow]):
        self.tokenizer = tokenizer
        self.protocol = protocol
        self.prompts = prompts
        self.turns_played: dict[str, int] = {}

    def _row(self, ids: Sequence[int]) -> QARow:
        for prompt, row in self.prompts.items():
            if tuple(ids[: len(prompt)]) == prompt:
                return row
        raise ZsearchError("teacher: a prompt it was not built for")  # an engine bug, not user input

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 stop: Sequence[str] = ()) -> list[GenerationOutput]:
        outs = []
        for ids in prompts:
            row = self._row(ids)
            turn = self.turns_played.get(row.id, 0)
            self.turns_played[row.id] = turn + 1
            if turn == 0:
                text = SEARCH_THOUGHT + self.protocol.render_search([row.question.strip()])
            else:
                text = f"{ANSWER_THOUGHT}<answer> {row.golden_answers[0]} </answer>"
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            stopped = next((s for s in stop if text.endswith(s)), None)
            outs.append(GenerationOutput(token_ids, [0.0] * len(token_ids), "stop" if stopped else "eos",
                                         stop_string=stopped))
        return outs


def teacher_trajectories(rows: Sequence[QARow], tokenizer: Any, protocol: Any, search: Any,
                         config: RolloutOptions) -> list[Trajectory]:
    """One teacher trajectory per row (see the module docstring); rows without a gold
    answer are an error."""
    for row in rows:
        if not row.golden_answers or not str(row.golden_answers[0]).strip():
            raise ZsearchError(f"row {row.id!r}: no golden answer to teach")
    teacher = TeacherBackend(tokenizer, protocol, {})
    engine = RolloutEngine(teacher, protocol, search, replace(config, max_turns=1))  # search, then answer
    teacher.prompts = {tuple(engine.encode_prompt(row)): row for row in rows}
    return engine.rollout(list(rows))


def build_warmup_data(opts: WarmupOptions, config: dict[str, Any]) -> Path:
    """Write the teacher trajectories of ``opts.qa`` to ``opts.out``; returns the path."""
    from rich.console import Console

    from zsearch_cli.data.qa import load_qa
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.rollout.protocols import get_protocol
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import TRAJECTORY
    from zsearch_cli.rollout.build import make_search

    protocol = get_protocol(opts.rollout.protocol)
    table = load_qa(opts.qa)
    rows = [QARow(r["id"], r["question"], list(r["golden_answers"])) for r in table.to_pylist()[: opts.limit]]
    if not rows:
        raise ZsearchError(f"{opts.qa}: no questions")
    trajs = teacher_trajectories(rows, load_tokenizer(opts.policy.model), protocol, make_search(opts), opts.rollout)
    answered = sum(t.prediction is not None for t in trajs)
    out = Path(opts.out)
    write_artifact([t.to_row() for t in trajs], out, TRAJECTORY, config)
    Console(stderr=True).print(f"wrote {len(trajs)} teacher trajectories ({answered} end in an answer) to {out}; "
                               f"next: zsearch sft {out} --model {opts.policy.model}")
    return out
