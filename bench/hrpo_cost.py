"""Rollout cost of one proposer update: HRPO against GRPO-style nested sampling (Dr. Zero §3.2, App. A).

The claim (Dr. Zero Appendix A): "For GRPO, we generate 4 questions per prompt and perform 4
rollouts per question, totaling (4 + 1) × 4 = 20 rollouts per prompt. In contrast, HRPO
generates a single question per prompt with 5 solver predictions, reducing the rollout
computational cost to about one-fourth of that required by GRPO." Counted per prompt:

- GRPO (nested): m = 4 proposer samples, each answered n = 4 times by the solver:
  m + m·n = 4 + 16 = 20 rollouts (§3.2 writes "(m + 1) × n", the same 20 at m = n = 4);
- HRPO: 1 proposer sample answered n = 5 times: 1 + 5 = 6 rollouts (6/20 = 0.30).

Both modes run through the one trainer on the bundled demo corpus with a tiny model, the
frozen solver a separate copy: HRPO is ``zsearch propose`` (``--algo hrpo``, G = 1, hop
groups); GRPO is the same stage with ``--algo grpo``, G = 4 and n = 4 (groups = the 4
questions of one prompt). β = 0 in both, so no reference model is involved. A random tiny
model never writes a question, so it first gets the same short format warm-up as
tests/test_drzero.py (`zsearch sft` on played proposer trajectories). Questions that fail
the integrity gate cost no solver rollouts (as in training), so the measured solver
rollouts can fall below the nominal count; both are shown.

    python bench/hrpo_cost.py [--prompts 4] [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

TURNS = ('<think> Search the river. </think>\n<tool_call> {"name": "search", "arguments": {"query_list": '
         '["Danube"]}} </tool_call>',
         "<think> Found it. </think>\n<question> Which sea does the river of Vienna reach? </question>\n"
         "<answer> Black Sea </answer>")


SEED = 11


class Played:
    """Plays TURNS: the search turn, then (after the tool response) the question turn."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def generate(self, prompts, params, stop=()):
        from zsearch_cli.models.base import GenerationOutput

        outs = []
        for p in prompts:
            ids = self.tokenizer.encode(TURNS[int(self.tokenizer.decode(p).rstrip().endswith("</tool_response>"))],
                                        add_special_tokens=False)
            outs.append(GenerationOutput(ids, [0.0] * len(ids), "stop"))
        return outs


def setup(root: Path, args: Any) -> tuple[Path, Path, Path]:
    """(index, base tiny model, format-warmed proposer) under ``root``. The warm-up covers
    the prompts the measured updates draw (seed 11), so most proposals pass the gate and the
    solver workload is close to the nominal one."""
    from zsearch_cli.data.demo import demo_corpus
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.models.tiny import make_tiny_model
    from zsearch_cli.prompts import DRZERO_PROPOSER_TEMPLATE, DRZERO_SOLVER_TEMPLATE, DRZERO_SYSTEM_PROMPT
    from zsearch_cli.retrieval.index import build_index, load_index
    from zsearch_cli.config.parts import RolloutOptions
    from zsearch_cli.rollout.engine import RolloutEngine
    from zsearch_cli.rollout.protocols import ToolCallProtocol
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import TRAJECTORY
    from zsearch_cli.search.factory import make_search_backend
    from zsearch_cli.commands.propose import proposer_prompts
    from zsearch_cli.train.sft import SFTConfig, run_sft

    index = build_index(None, root / "index", options={"kind": "bm25"})
    corpus = "\n".join(json.loads(line)["text"] for line in demo_corpus().read_text().splitlines())
    prompts = "\n".join([DRZERO_PROPOSER_TEMPLATE, DRZERO_SOLVER_TEMPLATE, DRZERO_SYSTEM_PROMPT] * 30)
    base = make_tiny_model(root / "tiny", seed=0, vocab_size=2000, corpus_text=prompts + "\n" + corpus)
    tok = load_tokenizer(str(base))
    engine = RolloutEngine(Played(tok), ToolCallProtocol(), make_search_backend("bm25", index_dir=index),
                           RolloutOptions(max_turns=2, max_turn_tokens=48))
    rows = [p.row(tok) for step in range(args.steps + 1)
            for p in proposer_prompts(load_index(index), args.prompts, "4:3:2:1", SEED, step)]
    data = write_artifact([t.to_row() for t in engine.rollout(rows)], root / "warmup.parquet", TRAJECTORY)
    warm = run_sft(SFTConfig.from_flat(data=str(data), model=str(base), out=root / "warm", max_steps=args.warmup_steps,
                             lr=5e-3, batch_size=2, max_length=4096, eval_fraction=0.0, save_every=0,
                             warmup_ratio=0.0, device="cpu"))
    return index, base, warm


def measure(mode: str, algo: str, group: int, n: int, args: Any, index: Path, base: Path, warm: Path,
            root: Path) -> dict[str, Any]:
    """Run the proposer stage for 1 warm-up + ``args.steps`` steps; per-update means."""
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.search.factory import make_search_backend
    from zsearch_cli.commands.propose_train import ProposerData, ProposerReward, solver_engine
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    cfg = TrainConfig.from_preset("drzero-proposer", algo=algo, group_size=group, beta=0.0, model=str(warm),
                                  out=root / mode, steps=args.steps + 1, batch_size=args.prompts, max_turns=2,
                                  max_turn_tokens=48, index=index, device="cpu", save_every=0, seed=SEED)
    search = make_search_backend("bm25", index_dir=index)
    data = ProposerData(load_index(index), args.prompts, "4:3:2:1", cfg.seed, load_tokenizer(str(warm)))
    reward = ProposerReward(data, n)
    trainer = Trainer(cfg, search=search, data=data, batch_reward_fn=reward)
    reward.solver = solver_engine(str(base), cfg, search, "cpu")
    log: dict[str, list[Any]] = {"proposer": [], "solver": []}
    solve = reward.solver.rollout

    def counted(*a: Any, **kw: Any) -> list[Any]:
        out = solve(*a, **kw)
        log["solver"] += out
        return out

    reward.solver.rollout = counted
    score = reward.__call__
    reward_fn = lambda trajs, step: (log["proposer"].extend(trajs), score(trajs, step))[1]  # noqa: E731
    trainer.batch_reward_fn = reward_fn
    steps = []
    for step in range(1, args.steps + 2):
        log["proposer"].clear()
        log["solver"].clear()
        row = trainer.train_step(step)
        if step == 1:
            continue  # first-call overheads
        trajs = log["proposer"] + log["solver"]
        steps.append({"proposer": len(log["proposer"]), "solver": len(log["solver"]), "gate": row["proposer/gate_pass"],
                      "sampled": sum(t.policy_tokens for t in trajs),
                      "response": sum(t.response_tokens for t in trajs),
                      "rollout_s": row["time/rollout"], "reward_s": row["time/reward"],
                      "update_s": row["time/update"], "step_s": row["time/step"]})
    mean = {k: statistics.mean(s[k] for s in steps) for k in steps[0]}
    return {"mode": mode, "per_prompt": f"{group} + {group}x{n} = {group * (1 + n)}",
            "nominal": args.prompts * group * (1 + n), **mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="proposer prompts per update (B)")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per mode (after one warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=80, help="format warm-up (SFT) steps of the proposer")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core box)")
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        index, base, warm = setup(root, args)
        rows = [measure("HRPO", "hrpo", 1, 5, args, index, base, warm, root),
                measure("GRPO nested", "grpo", 4, 4, args, index, base, warm, root)]
    table = Table(title=f"Rollout cost per proposer update (B = {args.prompts} prompts, tiny model, CPU, "
                        f"mean of {args.steps} updates)")
    for col in ("mode", "rollouts/prompt", "nominal", "proposer", "gate", "solver", "sampled tok", "resp tok",
                "rollout s", "solver s", "update s", "total s"):
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r["mode"], r["per_prompt"], str(r["nominal"]), f"{r['proposer']:.0f}", f"{r['gate']:.1f}",
                      f"{r['solver']:.1f}", f"{r['sampled']:.0f}", f"{r['response']:.0f}", f"{r['rollout_s']:.2f}",
                      f"{r['reward_s']:.2f}", f"{r['update_s']:.2f}", f"{r['step_s']:.2f}")
    console = Console(width=150)
    console.print(table)
    console.print("nominal = rollouts per update if every question were answered; proposer/gate/solver = measured "
                  "proposer rollouts, questions passing the gate, solver rollouts (gate failures cost none); "
                  "sampled tok = policy tokens (mask 1) of all rollouts; resp tok adds the tool responses; rollout s = "
                  "proposer rollouts, solver s = the reward's solver rollouts, update s = logprobs + gradient step.")
    h, g = rows
    console.print(f"HRPO/GRPO: nominal rollouts {h['nominal'] / g['nominal']:.2f}, measured rollouts "
                  f"{(h['proposer'] + h['solver']) / (g['proposer'] + g['solver']):.2f}, sampled tokens "
                  f"{h['sampled'] / g['sampled']:.2f}, wall time {h['step_s'] / g['step_s']:.2f}")


if __name__ == "__main__":
    main()
