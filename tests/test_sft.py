"""`zsearch sft`: labels and loss cover completion (mask-1) tokens only, prompt truncation,
trajectory input with --only-correct, a memorization run through the CLI, an exact resume,
LoRA with an eval split. Tiny random model, CPU, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.loading import load_model, load_tokenizer
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import SFT_EXAMPLE, TRAJECTORY
from zsearch_cli.train.sft import sft_loss, token_nll
from zsearch_cli.train.sft_data import (IGNORE, DataStats, StepOrder, collate, detect_kind, fit, load_sft_items,
                                        pair_ids, split_eval)

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these models are tiny, and on a shared 2-core box a second
    OpenMP thread mostly spins (orders of magnitude slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def _pairs(tmp_path: Path, n: int = 4, name: str = "pairs.parquet") -> Path:
    rows = [{"id": f"e{i}", "prompt": f"Question {i}: who wrote the novel?", "completion": f"The answer is {i}."}
            for i in range(n)]
    return write_artifact(rows, tmp_path / name, SFT_EXAMPLE)


def _trajectory(i: int, prompt_ids, response_ids, loss_mask, prediction, golds) -> dict:
    return {"id": f"r{i}#0", "row_id": f"r{i}", "sample_index": 0, "group_id": f"g{i}", "question": "Q?",
            "golden_answers": golds, "prompt_ids": prompt_ids, "response_ids": response_ids, "loss_mask": loss_mask,
            "logprobs": [0.0] * len(response_ids), "turns": "[]", "response_text": "", "prediction": prediction,
            "finish_reason": "answer", "num_turns": 1, "num_searches": 0, "num_invalid": 0,
            "prompt_tokens": len(prompt_ids), "response_tokens": len(response_ids), "policy_tokens": sum(loss_mask)}


# ----------------------------------------------------------------------------- labels and loss


@pytest.mark.parametrize("chat", [True, False])
def test_labels_cover_only_the_completion_and_eos(tok, chat):
    prompt, completion = pair_ids(tok, "Who wrote Hamlet?", " Shakespeare wrote it.", chat)
    assert completion[-1] == tok.eos_token_id
    assert completion[:-1] == tok.encode(" Shakespeare wrote it.", add_special_tokens=False)
    if chat:
        assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    else:
        assert prompt == list(tok.encode("Who wrote Hamlet?"))
    item = fit(prompt, completion, completion, 512, DataStats())
    short = fit([5, 6], [7, 8, 0], [7, 8, 0], 512, DataStats())
    batch = collate([item, short], pad_id=tok.pad_token_id)
    labels, ids = batch["labels"], batch["input_ids"]
    assert (labels[0, : len(prompt)] == IGNORE).all()
    assert labels[0, len(prompt):].tolist() == completion
    assert labels[1].tolist() == [IGNORE, IGNORE, 7, 8, 0] + [IGNORE] * (ids.shape[1] - 5)  # padding ignored
    assert batch["attention_mask"][1].sum() == 5 and (ids[1, 5:] == tok.pad_token_id).all()


def test_loss_is_the_mean_nll_over_completion_tokens_only():
    torch.manual_seed(0)
    a, b = [7, 8, 9], [11, 12, 13, 14, 2]
    items = [fit([3, 4, 5, 6], a, a, 64, DataStats()), fit([10], b, b, 64, DataStats())]
    batch = collate(items, pad_id=1)
    labels = batch["labels"]
    logits = torch.randn(2, labels.shape[1], 20, requires_grad=True)
    loss = sft_loss(logits, labels)
    # Independently: position t-1 predicts the completion token at t.
    logp = torch.log_softmax(logits.detach().double(), -1)
    terms = [-logp[0, t - 1, tgt] for t, tgt in zip(range(4, 7), a)]
    terms += [-logp[1, t - 1, tgt] for t, tgt in zip(range(1, 6), b)]
    assert torch.allclose(loss.double(), torch.stack(terms).mean(), atol=1e-6)
    nll, n = token_nll(logits, labels)
    assert int(n) == 8  # token-level mean over all 8 completion tokens of the batch, not a mean of means
    # Logits at positions that predict prompt or padding tokens get no gradient, and changing
    # them changes nothing.
    loss.backward()
    predicts_target = torch.zeros_like(labels, dtype=torch.bool)
    predicts_target[:, :-1] = labels[:, 1:] != IGNORE
    assert (logits.grad[~predicts_target] == 0).all() and (logits.grad[predicts_target] != 0).any()
    perturbed = logits.detach().clone()
    perturbed[~predicts_target] += 100 * torch.randn_like(perturbed[~predicts_target])
    assert torch.equal(sft_loss(perturbed, labels), loss.detach())


def test_prompt_is_cut_from_the_left_and_completions_never(tok):
    stats = DataStats()
    item = fit(list(range(10, 20)), [1, 2, 3], [1, 2, 3], 6, stats)
    assert item.input_ids == [17, 18, 19, 1, 2, 3] and item.labels == [IGNORE] * 3 + [1, 2, 3]
    assert fit([1, 2], [3, 4, 5, 6, 7], [3, 4, 5, 6, 7], 4, stats) is None
    assert (stats.prompt_truncated, stats.too_long) == (1, 1)


def test_trajectories_mask_zero_tokens_get_no_loss_and_only_correct_filters(tmp_path, tok):
    rows = [
        _trajectory(0, [5, 6, 7], [20, 21, 22, 23, 24], [1, 1, 0, 0, 1], "Paris", ["paris", "Paris, France"]),
        _trajectory(1, [5, 6], [30, 31, 32], [1, 0, 1], "Lyon", ["Paris"]),
        _trajectory(2, [5], [40, 41], [0, 0], None, ["x"]),  # nothing sampled: nothing to learn
    ]
    path = write_artifact(rows, tmp_path / "trajectories.parquet", TRAJECTORY)
    assert detect_kind(path) == "trajectories"
    items, stats = load_sft_items(path, tok, chat_template=True, max_length=64)
    assert (stats.kept, stats.no_targets) == (2, 1)
    assert items[0].input_ids == [5, 6, 7, 20, 21, 22, 23, 24]
    assert items[0].labels == [IGNORE] * 3 + [20, 21, IGNORE, IGNORE, 24]
    assert items[1].labels == [IGNORE, IGNORE, 30, IGNORE, 32]
    correct, stats = load_sft_items(path, tok, chat_template=True, max_length=64, only_correct=True)
    assert [it.input_ids[3:] for it in correct] == [[20, 21, 22, 23, 24]] and stats.incorrect == 2
    with pytest.raises(ZsearchError, match="only-correct"):
        load_sft_items(_pairs(tmp_path), tok, chat_template=True, max_length=64, only_correct=True)


def test_bad_input_and_order_helpers(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ZsearchError, match="prompt \\+ completion"):
        detect_kind(tmp_path / "x.jsonl")
    (tmp_path / "p.jsonl").write_text('{"prompt": "q", "completion": "a"}\n')
    assert detect_kind(tmp_path / "p.jsonl") == "pairs"
    train, held = split_eval(40, 0.05, seed=3)
    assert len(held) == 2 and sorted(train + held) == list(range(40)) and split_eval(40, 0.05, 3)[1] == held
    order = StepOrder(5, 3, seed=0)
    stream = [i for s in range(5) for i in order.indices(s)]
    assert all(sorted(stream[e * 5:(e + 1) * 5]) == list(range(5)) for e in range(3))  # each epoch once


# ----------------------------------------------------------------------------- runs through the CLI


def _sft(data: Path, model: Path, out: Path, *extra: str):
    args = ["sft", str(data), "--model", str(model), "--out", str(out), "--device", "cpu", "--lr-schedule",
            "constant", "--warmup-ratio", "0", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_cli_memorizes_a_tiny_set_and_writes_a_loadable_model(tmp_path, tiny_model_dir):
    data = _pairs(tmp_path)
    out = tmp_path / "run"
    _sft(data, tiny_model_dir, out, "--max-steps", "30", "--lr", "1e-3", "--batch-size", "4", "--eval-data", str(data),
         "--eval-every", "10", "--save-every", "0")
    rows = _metrics(out)
    losses = [r["loss"] for r in rows]
    assert len(losses) == 30 and losses[-1] < 0.2 * losses[0], losses
    evals = [(r["step"], r["eval_loss"]) for r in rows if r["eval_loss"] is not None]
    assert [s for s, _ in evals] == [10, 20, 30] and evals[-1][1] < evals[0][1]  # --eval-every 10, from step 1
    final = out / "final"
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    assert json.loads((final / "config.json").read_text())["use_cache"] is True
    model, tok = load_model(str(final), device="cpu")
    prompt, completion = pair_ids(tok, "Question 2: who wrote the novel?", "The answer is 2.", True)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        loss = sft_loss(model(input_ids=ids).logits, torch.tensor([[IGNORE] * len(prompt) + completion]))
    assert float(loss) < 0.5


def test_resume_continues_the_step_count_and_is_bit_identical(tmp_path, tiny_model_dir):
    data = _pairs(tmp_path, n=6)
    args = ("--max-steps", "6", "--lr", "1e-3", "--batch-size", "2", "--eval-fraction", "0", "--save-every", "3",
            "--lr-schedule", "cosine")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _sft(data, tiny_model_dir, straight, *args)
    _sft(data, tiny_model_dir, resumed, *args)
    # Simulate a run killed after its step-3 checkpoint: drop what came later.
    shutil.rmtree(resumed / "final")
    shutil.rmtree(resumed / "checkpoints" / "step-6")
    lines = (resumed / "metrics.jsonl").read_text().splitlines()
    (resumed / "metrics.jsonl").write_text("\n".join(lines[:4]) + "\n")  # a line past the checkpoint
    refused = runner.invoke(app, ["sft", str(data), "--model", str(tiny_model_dir), "--out", str(resumed),
                                  "--device", "cpu", *args])
    assert refused.exit_code == 2 and "--resume" in refused.output
    result = _sft(data, tiny_model_dir, resumed, *args, "--resume")
    assert "resuming from" in result.output and "step 3/6" in result.output
    assert [r["step"] for r in _metrics(resumed)] == list(range(1, 7))  # counted from 1, as the console
    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in _metrics(resumed)] == [r["loss"] for r in _metrics(straight)]


def test_lora_with_eval_split_writes_an_adapter_and_merged_weights(tmp_path, tiny_model_dir):
    data = _pairs(tmp_path, n=8)
    out = tmp_path / "lora"
    _sft(data, tiny_model_dir, out, "--max-steps", "4", "--lr", "1e-3", "--batch-size", "2", "--lora-r", "4",
         "--eval-fraction", "0.25", "--eval-every", "2", "--merge-lora", "--no-chat-template", "--save-every", "0")
    rows = _metrics(out)
    assert [r["eval_loss"] is not None for r in rows] == [False, True, False, True]
    assert (out / "final" / "adapter_config.json").is_file() and not (out / "final" / "config.json").exists()
    assert (out / "final" / "merged" / "model.safetensors").is_file()
    model, _ = load_model(str(out / "final"), device="cpu")
    assert not any("lora" in n for n, _ in model.named_parameters())
