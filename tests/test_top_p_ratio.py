"""Issue 24.2: an unbiased ratio under top-p. The sampler's logprobs are renormalised over the
nucleus (vLLM's ``processed_logprobs``, the HF backend's); the trainer replays the same nucleus
on its own logits, so behaviour and target are one distribution. Before, every token's ratio
carried a factor of (nucleus mass) under ``--rollout-overlap`` (π_old = the sampler's), and the
mismatch guard was skipped whenever top_p < 1."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS
from zsearch_cli.train.logprobs import token_logprobs

runner = CliRunner()


def test_token_logprobs_renormalise_over_the_nucleus_by_hand():
    # p = (0.5, 0.3, 0.2) at T = 1, top_p = 0.7. Mass ranked above each token: 0, 0.5, 0.8, so
    # the nucleus is {0, 1} (0.8 >= 0.7 drops token 2), renormalised by 0.8: 0.625 and 0.375.
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]] * 3]))  # [1, 3, 3]
    targets = torch.tensor([[0, 1, 2]])
    got = token_logprobs(logits, targets, 1.0, top_p=0.7)[0]
    assert got[0].item() == pytest.approx(math.log(0.625), abs=1e-6)
    assert got[1].item() == pytest.approx(math.log(0.375), abs=1e-6)
    # token 2 lies outside the nucleus: the sampler could not have drawn it, except across a
    # rounding gap at the boundary; it is kept in the support (never -inf): log(0.2/1.0).
    assert got[2].item() == pytest.approx(math.log(0.2), abs=1e-6)
    # top_p = 1 is the full vocabulary, as before
    full = token_logprobs(logits, targets, 1.0)[0]
    assert torch.allclose(full, torch.log(torch.tensor([0.5, 0.3, 0.2])), atol=1e-6)
    # temperature first, then the nucleus: at T = 2 the probabilities flatten to
    # sqrt(p)/sum(sqrt(p)) = (0.4201, 0.3254, 0.2545); the mass above token 2 is 0.7455 >= 0.7,
    # so the nucleus is again {0, 1}: token 0 gets 0.4201/0.7455.
    sq = torch.tensor([0.5, 0.3, 0.2]).sqrt()
    q = sq / sq.sum()
    assert token_logprobs(logits, targets, 2.0, top_p=0.7)[0, 0].item() == pytest.approx(
        math.log(q[0] / (q[0] + q[1])), abs=1e-6)


def test_gradient_flows_only_through_the_nucleus():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]])).requires_grad_(True)
    token_logprobs(logits, torch.tensor([[0]]), 1.0, top_p=0.7).sum().backward()
    # d/dz_j log softmax_S(z)_0 = 1[j=0] - q_j on the support S = {0, 1}, 0 outside it
    assert torch.allclose(logits.grad[0, 0], torch.tensor([1 - 0.625, -0.375, 0.0]), atol=1e-6)


def test_trainer_scores_hf_samples_as_the_sampler_did(tiny_model_and_tokenizer):
    # Real samples from the tiny model at top_p 0.9: the trainer's replayed nucleus gives the
    # sampler's own logprobs; the full-vocabulary logprob differs by log(nucleus mass).
    from zsearch_cli.models.base import SamplingParams
    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.train.logprobs import collate, policy_forward

    from helpers import make_trajectory

    model, tok = tiny_model_and_tokenizer
    backend = HFBackend(model, tok, device="cpu")
    prompts = [[5, 17, 33, 8], [9, 40, 12]]
    outs = backend.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=3))
    trajs = [make_trajectory(f"q{i}#0", prompt_ids=p, response_ids=o.token_ids, loss_mask=[1] * len(o.token_ids))
             for i, (p, o) in enumerate(zip(prompts, outs))]
    batch = collate(trajs, 0, "cpu")
    with torch.no_grad():
        nucleus, _ = policy_forward(model, batch, 1.0, top_p=0.9)
        full, _ = policy_forward(model, batch, 1.0)
    for i, o in enumerate(outs):
        n = len(o.token_ids)
        sampler = torch.tensor(o.logprobs)
        assert torch.allclose(nucleus[i, :n], sampler, atol=1e-5)
        assert (sampler - full[i, :n]).min() > 0.01  # the old trainer's bias: -log(mass) > 0 per token


def _train(out: Path, model: Path, index: Path, *extra: str) -> list[dict]:
    args = ["train", "--algo", "grpo", "--model", str(model), "--index", str(index), "--steps", "2",
            "--batch-size", "2", "-G", "2", "--max-turn-tokens", "12", "--max-turns", "1", "--device", "cpu",
            "--out", str(out), "--lr", "1e-3", "--top-p", "0.9", "--save-every", "0", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return read_artifact(out / "metrics.parquet", METRICS).to_pylist()


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_first_update_ratio_is_one_under_top_p(tmp_path, tiny_model_dir, demo_index, overlap):
    # Step 1's tokens were all sampled by the weights that take the first update, and its
    # statistics are taken before the optimizer step: every ratio is 1 up to rounding. With
    # overlap (pi_old = the sampler's) the old code gave ratio_mean = the mean nucleus mass,
    # about 0.9 here; without overlap the mismatch between sampler and trainer was log(mass)
    # per token (~0.1 nats), which the guard skipped at top_p < 1.
    metrics = _train(tmp_path / "run", tiny_model_dir, demo_index, "--rollout-overlap", overlap)
    first = metrics[0]
    assert first["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert first["actor/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert all(m["rollout/logp_mismatch"] is None or m["rollout/logp_mismatch"] < 1e-4 for m in metrics)
