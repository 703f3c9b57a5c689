"""Trainer pieces: the loss mask through the real model, config errors, presets, the lr
schedule, and DSPO's filter loop."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.rollout.engine import QARow
from zsearch_cli.train.config import TrainConfig, algo_config, check_config, parse_algo_args

from helpers import make_trajectory

# ----------------------------------------------------------------------------- loss mask


def _trajectory(tok: Any) -> SimpleNamespace:
    """prompt | sampled | observation (mask 0) | sampled, as the engine builds them."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc("Question: who wrote the novel?")
    turn1 = enc("<think> search it </think><search> novel author </search>")
    obs = enc("\n\n<information>Doc 1(Title: \"Jane Austen\") Jane Austen wrote it.</information>\n\n")
    turn2 = enc("<answer> Jane Austen </answer>")
    response = turn1 + obs + turn2
    return SimpleNamespace(prompt_ids=prompt, response_ids=response,
                           loss_mask=[1] * len(turn1) + [0] * len(obs) + [1] * len(turn2))


@pytest.mark.parametrize("algo", ["reinforce", "grpo", "dspo", "ppo"])
def test_masked_tokens_get_exactly_zero_gradient(algo, tiny_model_dir):
    """Gradients reach the logits only at positions that predict a policy (mask-1) token:
    the retrieved tokens and the padding contribute exactly nothing to any objective."""
    from zsearch_cli.algos import ALGOS
    from zsearch_cli.models.loading import load_model
    from zsearch_cli.train.logprobs import collate, policy_forward

    model, tok = load_model(str(tiny_model_dir), device="cpu", trainable=True)
    short = _trajectory(tok)
    short.response_ids = short.response_ids[:-3]  # shorter response, longer prompt: padding in the batch
    short.loss_mask = short.loss_mask[:-3]
    short.prompt_ids = tok.encode("Please answer this. ", add_special_tokens=False) + short.prompt_ids
    trajs = [_trajectory(tok), short]
    captured: list[torch.Tensor] = []

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured.append(output)

    model.lm_head.register_forward_hook(keep)
    batch = collate(trajs, tok.pad_token_id, "cpu")
    logp, entropy = policy_forward(model, batch, temperature=1.0, entropy=True)
    spec = ALGOS[algo]
    cfg = spec.config_cls()
    # Token ratios != 1 inside the 0.2 clip range; the sequence ratio's range (3e-4) needs s = 1.
    old = logp.detach() - (0.0 if spec.sequence_level else 0.05)
    ref = logp.detach() + 0.1
    if spec.needs_critic:
        adv = torch.randn(batch.mask.shape)
    else:
        adv = torch.tensor([1.0, -0.5])
    loss, _ = spec.policy_loss(logp, old, adv, batch.mask, cfg, ref_logp=ref, entropy=entropy)
    loss.backward()
    grad = captured[0].grad  # [B, L - keep_from, V]: position keep_from + q predicts token keep_from + q + 1
    assert grad.shape[1] == batch.input_ids.shape[1] - batch.keep_from
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids) - batch.keep_from
        for j, m in enumerate(t.loss_mask):
            g = grad[i, p - 1 + j].abs().sum().item()
            assert (g > 0) if m else (g == 0.0), f"{algo} row {i} response token {j} (mask {m}): |grad| {g}"
        beyond = grad[i, p - 1 + len(t.loss_mask):]
        assert beyond.abs().sum().item() == 0.0  # padding and the last real position
        assert grad[i, : max(p - 1, 0)].abs().sum().item() == 0.0  # positions inside the prompt


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize("overrides, message", [
    ({"algo": "nope"}, "unknown --algo 'nope': use one of reinforce, ppo, grpo"),
    ({"algo": "grpo", "group_size": 1}, "--algo grpo needs --group-size >= 2 (a group baseline needs G >= 2)"),
    ({"algo": "dspo", "group_size": 1}, "--algo dspo needs --group-size >= 2"),
    ({"algo": "ppo", "critic_model": "none"}, "--algo ppo needs a critic"),
    ({"algo": "ppo", "critic_lr": 0.0}, "--critic-lr must be > 0, got 0.0"),
    ({"algo": "grpo", "critic_model": "x"}, "--critic-model is only used by ppo"),
    ({"reward": "bleu"}, "unknown --reward 'bleu'"),
    ({"lr_schedule": "linear"}, "unknown --lr-schedule 'linear'"),
    ({"algo_args": {"gamma": 0.9}}, "--algo-arg gamma: grpo has no such option"),
    ({"algo": "dspo", "max_gen_batches": 0}, "--max-gen-batches must be >= 1"),
    ({"report_to": "mlflow"}, "unknown --report-to 'mlflow'"),
    ({"algo": "dspo", "rollout_overlap": 1}, "--rollout-overlap with --algo dspo: DSPO's dynamic filter"),
])
def test_bad_configs_are_one_line_errors(overrides, message):
    with pytest.raises(ZsearchError) as err:
        check_config(TrainConfig.from_flat(**overrides))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_algo_config_takes_paper_defaults_and_overrides():
    assert TrainConfig.from_flat(algo="grpo").optim.lr == 1e-6  # lr and G are the trainer's, not the loss's
    assert (TrainConfig.from_flat(algo="ppo").group_size, TrainConfig.from_flat(algo="grpo").group_size) == (1, 5)
    assert not {"lr", "group_size"} & {f.name for f in dataclasses.fields(algo_config(TrainConfig()))}
    c = algo_config(TrainConfig.from_flat(algo="dspo", batch_size=16, reward="subem", clip_eps=0.01, max_gen_batches=4))
    assert (c.target_groups, c.reward, c.clip_eps_low, c.clip_eps_high, c.max_gen_batches) == (16, "subem", 0.01, 0.01, 4)
    c = algo_config(TrainConfig.from_flat(algo="reinforce", algo_args=parse_algo_args(["baseline=rloo", "clip-eps-high=0.28"])))
    assert (c.baseline, c.clip_eps_high, c.clip_eps_low) == ("rloo", 0.28, 0.2)


def test_presets_fill_only_what_the_user_did_not_set():
    from zsearch_cli.presets import apply_preset

    cfg = TrainConfig.from_preset("search-r1")
    acfg = algo_config(cfg)
    assert (cfg.algo, cfg.reward, cfg.rollout.topk, cfg.rollout.max_turns, cfg.steps) == ("ppo", "em", 3, 4, 500)
    assert (cfg.optim.lr, cfg.critic_lr, acfg.beta, acfg.clip_eps_low, cfg.group_size) == (1e-6, 1e-5, 0.001, 0.2, 1)
    assert TrainConfig.from_preset("search-r1", algo="grpo").group_size == 5  # the GRPO option
    z = TrainConfig.from_preset("zerosearch", lr=5e-6)
    assert (z.algo, z.reward, z.group_size, z.rollout.topk, z.rollout.max_turns, z.steps, z.optim.lr) == ("reinforce", "f1", 5, 5, 5, 200, 5e-6)
    d = TrainConfig.from_preset("drzero-solver")
    assert (d.algo, d.group_size, d.rollout.protocol, d.rollout.max_turns, d.reward) == ("grpo", 5, "tool_call", 5, "em")
    assert TrainConfig.from_preset("dspo").reward == "subem"
    merged = apply_preset("dspo", {"reward": "em", "topk": 5}, explicit={"topk"})
    assert merged == {"algo": "dspo", "reward": "subem", "topk": 5, "search": "bm25", "protocol": "tags"}
    with pytest.raises(ZsearchError, match="unknown --preset 'r1': use one of search-r1, zerosearch, dspo"):
        TrainConfig.from_preset("r1")


# ----------------------------------------------------------------------------- lr schedule


def test_lr_schedule_values():
    from zsearch_cli.train.optim import lr_factor, make_optimizer, warmup_steps

    assert warmup_steps(100, 0.03) == 3
    assert [lr_factor(s, 10, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = [lr_factor(s, 10, 2, "cosine") for s in range(10)]
    assert cos[:2] == [0.5, 1.0] and cos[2] == 1.0 and cos[-1] == pytest.approx(0.0, abs=1e-12)
    assert cos[2 + 7 // 2] == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert all(a >= b for a, b in zip(cos[2:], cos[3:]))
    assert lr_factor(9, 10, 0, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    opt, sched = make_optimizer([torch.nn.Parameter(torch.zeros(2))], 1e-3, 0.0, 5, 0.4, "cosine", 0.0)
    lrs = []
    for _ in range(5):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4, 0.0])


# ----------------------------------------------------------------------------- DSPO filter loop


class FakeEngine:
    """Answers each row with the words in ``answers[row_id]`` (one per sample) — a stand-in
    for the rollout engine whose rewards the test controls."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.steps: list[int] = []

    def rollout(self, rows, group_size=1, step=0, on_row_done=None):
        self.steps.append(step)
        out = []
        for r in rows:
            for g in range(group_size):
                word = self.answers[r.id][g % len(self.answers[r.id])]
                out.append(make_trajectory(f"{r.id}#{g}", group_id=f"{step}:{r.id}", golden_answers=r.golden_answers,
                                           response_text=f"<answer> {word} </answer>",
                                           turns=[{"text": f"<answer> {word} </answer>"}], prediction=word,
                                           policy_tokens=7, response_tokens=9))
        return out


def _data(n: int, batch: int):
    from zsearch_cli.train.sampler import PromptSampler

    return PromptSampler([QARow(f"q{i}", f"question {i}?", ["yes"]) for i in range(n)], batch, seed=0)


def _collect(engine, data, shard=(0, 1), all_counts=None, **cfg):
    from zsearch_cli.train.step_samples import sample_step
    from zsearch_cli.train.config import get_spec

    tc = TrainConfig.from_flat(algo="dspo", group_size=2, batch_size=data.batch_size, reward="subem", **cfg)
    return sample_step(engine, data, get_spec("dspo"), algo_config(tc), step=3, group_size=tc.group_size,
                   metric="subem", protocol="tags",
                   shard=shard, all_counts=all_counts)


def test_dspo_filter_stops_at_max_gen_batches_and_says_so():
    from zsearch_cli.train.metrics import step_metrics

    engine = FakeEngine({f"q{i}": ["yes"] for i in range(12)})  # every group all-correct: nothing is mixed
    got = _collect(engine, _data(12, 2), max_gen_batches=3)
    assert got.gen_batches == 3 and engine.steps == [6, 7, 8]  # (step 3 − 1) × budget 3 + batch index
    assert got.kept_groups == 0 and got.train == [] and got.tokens_wasted == 3 * 2 * 2 * 7
    assert "kept 0/2 mixed groups after 3/3 generation batches" in got.notes[0]
    assert "no update this step" in got.notes[0]
    row = step_metrics(3, got, None, {})
    assert (row["filter/kept_frac"], row["filter/gen_batches"], row["rollout/reward_mean"], row["actor/samples"]) == (
        0.0, 3.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="kl are not METRICS columns"):
        step_metrics(3, got, {"kl": 0.1}, {})  # a flat or misspelt name is refused, not dropped
    assert len({s.trajectory.group_id for s in got.samples}) == 6  # unique per prompt and generation batch


def test_dspo_filter_collects_until_b_mixed_groups():
    answers = {f"q{i}": (["yes", "no"] if i % 2 else ["no"]) for i in range(12)}  # odd rows are mixed
    data = _data(12, 4)
    got = _collect(FakeEngine(answers), data, max_gen_batches=10)
    kept = {s.group_key for s in got.train}
    assert got.kept_groups == 4 == len(kept) and got.gen_batches >= 2 and not got.notes
    assert all(s.kept == (s.group_key in kept) for s in got.samples)
    assert got.kept_groups / got.total_groups == pytest.approx(4 / (4 * got.gen_batches))
    assert data.state() == {"epoch": 0, "position": 4 * got.gen_batches}


def test_dspo_filter_agrees_across_processes():
    # Process 0 of 2, batch 8: its share is 4 mixed groups of its 4 rows per batch. Every
    # one of its rows is mixed, so alone it would stop after one batch with 4 groups. The
    # other process reports 1 kept group after the first batch and 3 after the second: all
    # processes go on until *every* one has its share or the budget is spent (here 2
    # batches), then each trains on the smallest share, 3 groups, so all run the same
    # number of backward passes and draw the same number of batches.
    answers = {f"q{i}": ["yes", "no"] for i in range(16)}
    others = iter([1, 3])
    seen: list[int] = []

    def all_counts(n: int) -> list[int]:
        seen.append(n)
        return [n, next(others)]

    data = _data(16, 8)
    got = _collect(FakeEngine(answers), data, shard=(0, 2), all_counts=all_counts, max_gen_batches=2)
    assert seen == [4, 8] and got.gen_batches == 2  # it had 4 after batch 1, yet sampled again
    assert got.kept_groups == 3 == len({s.group_key for s in got.train})
    assert "kept 3/4 mixed groups after 2/2 generation batches" in got.notes[0]
    assert data.state() == {"epoch": 0, "position": 16}  # both batches of 8 drawn, as on the other process


@pytest.mark.parametrize("algo", ["reinforce", "ppo", "grpo", "gspo", "dspo", "dspo-nofilter", "dspo-token", "hrpo"])
def test_every_statistic_a_loss_returns_has_a_metrics_column(algo):
    """optimize() logs each loss statistic as actor/NAME (critic/NAME for the value loss) and
    step_metrics refuses a name METRICS lacks: a new statistic must be declared, not dropped."""
    from zsearch_cli.algos import ALGOS
    from zsearch_cli.schemas import METRIC_COLUMNS

    spec = ALGOS[algo]
    cfg = spec.config_cls()
    logp = torch.randn(2, 5) * 0.1 - 1.0
    mask = torch.ones(2, 5, dtype=torch.bool)
    adv = torch.randn(2, 5) if spec.needs_critic else torch.tensor([1.0, -1.0])
    _, stats = spec.policy_loss(logp, logp - 0.01, adv, mask, cfg, ref_logp=logp + 0.01, entropy=torch.rand(2, 5))
    names = [f"actor/{k}" for k in stats]
    if spec.value_loss is not None:
        _, vstats = spec.value_loss(torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5), mask, cfg)
        names += [f"critic/{k}" for k in vstats]
    assert "actor/loss" in names and set(names) <= set(METRIC_COLUMNS), sorted(set(names) - set(METRIC_COLUMNS))


def test_a_micro_batch_is_an_index_slice_of_the_steps_padded_batch():
    """update.py pads the step once; each micro-batch's forward must still see exactly the
    tensors its samples would get padded alone (same widths, same keep_from), or the
    numerics of an update would change with the other samples of its step."""
    from zsearch_cli.train.step_samples import Sample
    from zsearch_cli.train.logprobs import collate
    from zsearch_cli.train.update import step_batch

    lengths = [(3, 5), (6, 2), (2, 7), (4, 4)]  # (prompt, response): the longest differ per subset
    samples = []
    for i, (p, r) in enumerate(lengths):
        traj = make_trajectory(f"q{i}#0", prompt_ids=list(range(10, 10 + p)), response_ids=list(range(50, 50 + r)),
                               loss_mask=[1, 0] * (r // 2) + [1] * (r % 2), logprobs=[-0.5] * r)
        samples.append(Sample(traj, step=1, gen_batch=0, group_key=traj.group_id, reward=float(i)))
    batch = step_batch(samples, pad_id=0)
    assert batch.tokens.input_ids.shape == (4, 9) and batch.sampler_logp.shape == (4, 7)  # [N, L], [N, T]
    for idx in ([0], [1], [0, 1], [1, 3], [3, 2, 0]):
        alone = collate([samples[i].trajectory for i in idx], 0, "cpu")
        sliced = batch.forward_batch(idx, "cpu")
        for name in ("input_ids", "attention_mask", "resp_pos", "targets", "mask"):
            assert torch.equal(getattr(sliced, name), getattr(alone, name)), (idx, name)
        assert sliced.keep_from == alone.keep_from
        assert batch.rows(batch.sampler_logp, idx).shape == alone.mask.shape


def test_metrics_average_over_processes_by_name_and_skip_missing_values():
    from zsearch_cli.train.metrics import average_over_processes

    # Process 0 kept no samples this step, so its entropy is None; process 1 has no
    # 'filter/kept_frac' key at all. Per-key all-reduces would have run 3 collectives on
    # one process and 2 on the other (a hang) or paired different keys (a wrong mean).
    rows = [
        {"step": 3, "rollout/reward_mean": 0.25, "actor/entropy": None, "filter/kept_frac": 0.5, "actor/samples": 4},
        {"step": 3, "actor/samples": 6, "rollout/reward_mean": 0.75, "actor/entropy": 1.5},
    ]
    out = average_over_processes(rows)
    assert out["step"] == 3
    assert out["rollout/reward_mean"] == 0.5           # (0.25 + 0.75) / 2
    assert out["actor/entropy"] == 1.5                 # only process 1 has a value
    assert out["filter/kept_frac"] == 0.5              # only process 0 has the key
    assert out["actor/samples"] == 4                   # never a float: the first process's, as before
    assert average_over_processes([{"step": 1, "x": None}, {"step": 1, "x": None}])["x"] is None
