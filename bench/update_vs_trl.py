"""Time one GRPO *update* (old-logp forward where there is one, loss, backward, optimizer step;
no generation, no reward) on the same fixed batch for three trainers:

- ``before``: zsearch with a separate no-grad π_old forward (``fused_old_logp`` patched to False);
- ``after``:  zsearch as shipped, π_old = the update's own forward, detached (one epoch, one
  mini-batch: ``train/update.py:fused_old_logp``);
- ``trl``:    TRL's ``GRPOTrainer`` (``num_iterations=1``, so its old logprobs are the same
  forward detached), run in its own venv.

    .venv/bin/python bench/update_vs_trl.py                      # tiny (full) and smollm2 (LoRA r=16)
    .venv/bin/python bench/update_vs_trl.py --configs tiny --beta 0.001 --reps 9

The batch: B prompts × G samples of hand-made token ids (no rollout), each response a policy
turn, a masked observation block (a search result: loss mask 0) and a second policy turn, of
unequal lengths; rewards vary within each group. zsearch gets them as ``Sample``s through
``step_batch → rollout_tensors → advantages → optimize`` (what ``Trainer.train_step`` runs)
plus the lr scheduler step. TRL gets them as ``_generate_and_score_completions`` returns them
(left-padded prompts, right-padded completions, ``tool_mask`` = the observation mask, group-
normalized advantages, no ``old_per_token_logps``), split into ``per_device_train_batch_size``
micro-batches, each through ``trainer.training_step`` (its ``compute_loss`` and backward), then
what ``Trainer._run_epoch`` does at a sync step: clip, ``optimizer.step``, scheduler, zero_grad.
With β > 0 TRL's timed step also runs the reference forward that ``_generate_and_score_completions``
runs (zsearch's runs inside ``rollout_tensors``).

Same settings on both sides: fp32, CPU, the same thread count, AdamW (torch, not fused), lr 1e-6,
grad clip 1.0, ε = 0.2, temperature 1, no gradient checkpointing (TRL's default is on; off here as
in zsearch), LoRA r=16 α=16 on q/k/v/o for smollm2. The loss: zsearch ``--algo grpo`` (its default
``seq-mean-token-mean``) against TRL ``loss_type="grpo"`` (the same: each sequence's token mean,
then the mean over sequences).

Protocol: every variant runs in its own worker process (its peak RSS is its own), all three kept
alive and stepped in turn (round-robin, rotating the order each round) so load drift on a shared
machine hits them alike; warm-up until two consecutive steps agree within 10% (at most
``--max-warmup``), then the median of ``--reps`` timed steps. The ratios are those of the medians, and in brackets
the median of the per-round ratios (two steps of one round ran back to back).

TRL lives in its own venv (it need not match zsearch's transformers):

    python3.11 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 && .venv-trl/bin/pip install trl peft

Without it (``--trl-python`` missing or failing) the TRL column is left empty.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    # name: model, lora_r, B, G, micro-batch, prompt length, (turn 1, observation, turn 2) lengths, reps
    "tiny": dict(model="tiny", lora_r=0, B=4, G=4, micro=8, prompt=96, turns=(48, 32, 48), reps=15),
    "smollm2-lora": dict(model="smollm2", lora_r=16, B=2, G=4, micro=4, prompt=64, turns=(32, 24, 32), reps=7),
}
VARIANTS = ("before", "after", "trl")


# ------------------------------------------------------------------ the batch


def make_batch(c: dict, vocab: int, seed: int = 0) -> list[dict]:
    """B×G samples: prompt ids (lengths prompt-8..prompt), response = turn 1 + observation +
    turn 2 (each up to 1/3 shorter than its budget), mask 1/0/1, reward varying inside a group."""
    import random

    rng = random.Random(seed)
    lo = min(64, vocab // 4)  # clear of the special ids
    ids = lambda n: [rng.randrange(lo, vocab) for _ in range(n)]  # noqa: E731
    out = []
    for p in range(c["B"]):
        prompt = ids(c["prompt"] - (7 * p) % 9)
        for g in range(c["G"]):
            a, o, b = (t - (3 * p + 5 * g + k) % (t // 3 + 1) for k, t in enumerate(c["turns"]))
            out.append({"prompt": prompt, "response": ids(a + o + b), "mask": [1] * a + [0] * o + [1] * b,
                        "group": f"0:q{p}", "row": f"q{p}", "sample": g, "reward": float((p + g) % 2) + 0.1 * p})
    return out


def median_of(times: list[float]) -> float:
    return statistics.median(times)


# ------------------------------------------------------------------ workers


def as_samples(batch: list[dict]) -> list:
    """The batch's dicts as the ``Sample`` records a rollout gives the update (fresh each call)."""
    from zsearch_cli.rollout.trajectory import Trajectory
    from zsearch_cli.train.step_samples import Sample

    out = []
    for s in batch:
        resp, mask = s["response"], s["mask"]
        traj = Trajectory(id=f"{s['row']}#{s['sample']}", row_id=s["row"], sample_index=s["sample"],
                          group_id=s["group"], question=s["row"], golden_answers=[], prompt_ids=s["prompt"],
                          response_ids=resp, loss_mask=mask, logprobs=[0.0] * len(resp),
                          policy_version=[0 if k else -1 for k in mask], turns=[], response_text="",
                          prediction=None, finish_reason="answer", num_turns=2, num_searches=1, num_invalid=0,
                          prompt_tokens=len(s["prompt"]), response_tokens=len(resp), policy_tokens=sum(mask))
        out.append(Sample(traj, step=0, gen_batch=0, group_key=s["group"], reward=s["reward"]))
    return out


def _zsearch_worker(spec: dict):
    """(step function, setup seconds) for ``before``/``after``."""
    import torch
    from accelerate import Accelerator

    import zsearch_cli.train.update as update
    from zsearch_cli.train.config import TrainConfig, algo_config, get_spec, resolve_config
    from zsearch_cli.train.optim import make_optimizer
    from zsearch_cli.train.policy import load_policy, load_reference
    from zsearch_cli.train.update import (StepModels, advantages, optimize, rollout_tensors, sample_advantages,
                                          step_batch)

    if spec["variant"] == "before":
        update.fused_old_logp = lambda *a: False  # the separate no-grad π_old forward
    t0 = time.perf_counter()
    c = spec["config"]
    cfg = resolve_config(TrainConfig.from_flat(algo="grpo", model=spec["model_dir"], batch_size=c["B"], group_size=c["G"],
                                     lr=1e-6, beta=spec["beta"], micro_batch_size=c["micro"], seed=0,
                                     temperature=1.0, lora_r=c["lora_r"], lora_alpha=16, steps=1000))
    gspec, acfg = get_spec(cfg.algo), algo_config(cfg)
    torch.manual_seed(0)
    policy, tokenizer = load_policy(cfg, "cpu", "float32")
    reference = load_reference(cfg, policy, "cpu", "float32", gspec.needs_reference(acfg))
    optimizer, scheduler = make_optimizer(policy.parameters(), cfg.optim.lr, cfg.optim.weight_decay, cfg.steps, 0.0,
                                          "constant", 0.0)
    acc = Accelerator(cpu=True)
    policy, optimizer = acc.prepare(policy, optimizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    m = StepModels(policy, reference, None, optimizer, None, acc, int(pad_id), acc.device)

    def samples() -> list:
        return as_samples(spec["samples"])

    done = [0]

    def step() -> tuple[float, dict]:
        train = samples()  # fresh records each step, as a rollout would give (not timed)
        t = time.perf_counter()
        policy.train()
        batch = rollout_tensors(m, step_batch(train, m.pad_id), cfg, version=done[0])
        batch = advantages(gspec, acfg, batch, acc)
        for sample, a in zip(train, sample_advantages(batch)):
            sample.advantage = a
        stats = optimize(m, gspec, acfg, cfg, batch, done[0])
        scheduler.step()
        dt = time.perf_counter() - t
        done[0] += 1
        return dt, {"loss": stats.get("actor/loss"), "fused": bool(batch.fused),
                    "mismatch": batch.logp_mismatch}

    return step, time.perf_counter() - t0


def _trl_worker(spec: dict):
    """(step function, setup seconds) for TRL's GRPOTrainer."""
    import logging
    import warnings

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import use_adapter

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    c = spec["config"]
    n = c["B"] * c["G"]
    ga = n // c["micro"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    peft_config = None
    if c["lora_r"]:
        from peft import LoraConfig

        peft_config = LoraConfig(r=c["lora_r"], lora_alpha=16, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    samples = spec["samples"]
    t_max = max(len(s["response"]) for s in samples)
    args = GRPOConfig(
        output_dir=spec["out"], per_device_train_batch_size=c["micro"], gradient_accumulation_steps=ga,
        num_generations=c["G"], num_iterations=1, beta=spec["beta"], loss_type="grpo", epsilon=0.2,
        temperature=1.0, max_completion_length=t_max, learning_rate=1e-6, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
        gradient_checkpointing=spec.get("gradient_checkpointing", False),
        bf16=False, fp16=False, use_cpu=True, report_to="none", logging_steps=1, seed=0, max_steps=1000,
        disable_dropout=True, log_completions=False)
    dataset = Dataset.from_dict({"prompt": [tokenizer.decode(s["prompt"]) for s in samples[:: c["G"]]]})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config)
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    wrapped, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = wrapped
    trainer.current_gradient_accumulation_steps = ga
    trainer._prepare_inputs = lambda inputs: inputs  # the inputs below are already "generated and scored"

    # The generation batch, as _generate_and_score_completions returns it.
    p_max = max(len(s["prompt"]) for s in samples)
    prompt_ids = torch.full((n, p_max), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_max), dtype=torch.long)
    completion_ids = torch.full((n, t_max), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, t_max), dtype=torch.long)
    tool_mask = torch.zeros((n, t_max), dtype=torch.long)
    for i, s in enumerate(samples):
        p, r = len(s["prompt"]), len(s["response"])
        prompt_ids[i, p_max - p:] = torch.tensor(s["prompt"])  # left-padded
        prompt_mask[i, p_max - p:] = 1
        completion_ids[i, :r] = torch.tensor(s["response"])
        completion_mask[i, :r] = 1
        tool_mask[i, :r] = torch.tensor(s["mask"])
    rewards = torch.tensor([s["reward"] for s in samples]).view(-1, c["G"])
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    whole = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "advantages": adv, "tool_mask": tool_mask,
             "num_items_in_batch": (completion_mask * tool_mask).sum()}

    def split(d: dict) -> list[dict]:
        return [{k: (v[j: j + c["micro"]] if torch.is_tensor(v) and v.dim() else v) for k, v in d.items()}
                for j in range(0, n, c["micro"])]

    def step() -> tuple[float, dict]:
        t = time.perf_counter()
        inputs = dict(whole)
        if spec["beta"] != 0.0:  # the reference forward of _generate_and_score_completions
            ids = torch.cat([prompt_ids, completion_ids], dim=1)
            att = torch.cat([prompt_mask, completion_mask], dim=1)
            with torch.no_grad():
                if trainer.ref_model is not None:
                    ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, att, t_max,
                                                                           batch_size=c["micro"])
                else:
                    with use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=None):
                        ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, t_max,
                                                                               batch_size=c["micro"])
            inputs["ref_per_token_logps"] = ref
        micros = split(inputs)
        losses = []
        for j, mb in enumerate(micros):  # Trainer._run_epoch's inner loop
            last = j == len(micros) - 1
            trainer.accelerator.gradient_state._set_sync_gradients(last)
            ctx = trainer.accelerator.no_sync(model=wrapped) if not last else _null()
            with ctx:
                losses.append(float(trainer.training_step(wrapped, mb, whole["num_items_in_batch"])))
        trainer._clip_grad_norm(wrapped)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        wrapped.zero_grad()
        dt = time.perf_counter() - t
        return dt, {"loss": sum(losses)}

    return step, time.perf_counter() - t0, trl.__version__


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def worker(spec: dict) -> None:
    """A worker: set up, say ``@@READY``, then one step per ``step`` line (``@@STEP``) until ``quit``."""
    import torch

    torch.set_num_threads(spec["threads"])
    extra = {}
    if spec["variant"] == "trl":
        step, setup, version = _trl_worker(spec)
        extra["trl"] = version
    else:
        step, setup = _zsearch_worker(spec)
    import transformers

    extra["transformers"] = transformers.__version__
    print("@@READY " + json.dumps({"setup": setup, **extra}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        dt, info = step()
        print("@@STEP " + json.dumps({"time": dt, **info}), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("@@DONE " + json.dumps({"peak_mb": rss}), flush=True)


# ------------------------------------------------------------------ the driver


class Worker:
    def __init__(self, python: str, spec: dict, log: Path):
        env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "MKL_NUM_THREADS": str(spec["threads"]),
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
               "PYTHONPATH": str(ROOT / "src") if spec["variant"] != "trl" else ""}
        self.log = log
        self.name = spec["variant"]
        self.proc = subprocess.Popen([python, __file__, "--worker", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=env)
        self.times: list[float] = []
        self.first: dict | None = None
        self.ready = self._read("@@READY")

    def _read(self, tag: str) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
        tail = self.log.read_text()[-3000:]
        raise RuntimeError(f"worker {self.name} ended (rc={self.proc.wait()}):\n{tail}")

    def step(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        r = self._read("@@STEP")
        if self.first is None:
            self.first = r
        self.times.append(r["time"])
        return r["time"]

    def close(self) -> dict:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            out = self._read("@@DONE")
        finally:
            self.proc.wait(timeout=60)
        return out


def _agree(times: list[float], tol: float = 0.10) -> bool:
    return len(times) >= 2 and abs(times[-1] - times[-2]) <= tol * min(times[-1], times[-2])


def run_config(name: str, c: dict, model_dir: str, beta: float, args: argparse.Namespace, root: Path) -> dict:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    samples = make_batch(c, vocab)
    reps = args.reps or c["reps"]
    workers: dict[str, Worker] = {}
    pythons = {"before": sys.executable, "after": sys.executable, "trl": args.trl_python}
    notes = []
    for v in VARIANTS:
        if v == "trl" and not (args.trl_python and Path(args.trl_python).exists()):
            notes.append(f"trl: no interpreter at {args.trl_python}")
            continue
        spec = {"variant": v, "config": c, "model_dir": model_dir, "beta": beta, "threads": args.threads,
                "samples": samples, "out": str(root / f"trl-{name}")}
        try:
            workers[v] = Worker(pythons[v], spec, root / f"{name}-b{beta}-{v}.log")
        except RuntimeError as err:
            notes.append(f"{v}: failed to start: {err}")
            print(f"{name} {v}: {err}", file=sys.stderr)
    order = [v for v in VARIANTS if v in workers]

    def round_(names: list[str], k: int) -> None:
        for v in names[k % len(names):] + names[: k % len(names)]:  # rotate who goes first
            try:
                workers[v].step()
            except RuntimeError as err:
                notes.append(f"{v}: {err}")
                print(f"{name} {v}: {err}", file=sys.stderr)
                workers.pop(v)

    warm = {v: 0 for v in order}
    for k in range(args.max_warmup):
        todo = [v for v in order if v in workers and not _agree(workers[v].times)]
        if not todo:
            break
        round_(todo, k)
        for v in todo:
            warm[v] = k + 1
    for v in order:
        if v in workers:
            workers[v].times = []
    for k in range(reps):
        round_([v for v in order if v in workers], k)
    result = {"name": name, "beta": beta, "samples": len(samples), "notes": notes,
              "prompt_tokens": sum(len(s["prompt"]) for s in samples),
              "response_tokens": sum(len(s["response"]) for s in samples),
              "policy_tokens": sum(sum(s["mask"]) for s in samples)}
    for v, w in workers.items():
        done = w.close()
        result[v] = {"median": median_of(w.times), "times": w.times, "warmup": warm[v], "peak_mb": done["peak_mb"],
                     "first": w.first, **w.ready}
    return result


def model_dirs(names: set[str], root: Path) -> dict[str, str]:
    out = {}
    if "tiny" in names:
        from zsearch_cli.models.tiny import make_tiny_model

        out["tiny"] = str(make_tiny_model(root / "tiny", seed=0))
    if "smollm2" in names:
        from zsearch_cli.models.loading import resolve_model_path

        out["smollm2"] = str(resolve_model_path("smollm2"))  # the dequantized HF folder in zsearch's cache
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--beta", default="0", help="comma list of β (0 = no reference; 0.001 = Search-R1's)")
    ap.add_argument("--reps", type=int, default=0, help="timed steps per variant [per config: tiny 15, smollm2 7]")
    ap.add_argument("--max-warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per worker [1: on a shared 2-core machine, 2 threads let a busy core stall "
                         "every op's thread barrier, and the tiny model's step swings 30x]")
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return

    names = args.configs.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="zsearch-bench-trl-") as tmp:
        root = Path(tmp)
        dirs = model_dirs({CONFIGS[n]["model"] for n in names}, root)
        for name in names:
            for beta in (float(b) for b in args.beta.split(",")):
                t, load = time.perf_counter(), os.getloadavg()[0]
                r = run_config(name, CONFIGS[name], dirs[CONFIGS[name]["model"]], beta, args, root)
                r["wall"], r["load"] = time.perf_counter() - t, (load, os.getloadavg()[0])
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    report(results, args)


def report(results: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    def sec(r: dict, v: str) -> str:
        return f"{r[v]['median']:.3f}" if v in r else "-"

    def ratio(r: dict, a: str, b: str) -> str:
        """median(a)/median(b), then in brackets the median of the per-round ratios a_k/b_k (the two
        steps of a round ran back to back, so this one is less exposed to the machine's load drift)."""
        if a not in r or b not in r:
            return "-"
        pairs = [x / y for x, y in zip(r[a]["times"], r[b]["times"])]
        return f"{r[a]['median'] / r[b]['median']:.2f} ({statistics.median(pairs):.2f})"

    table = Table(title=f"one GRPO update, s/step (median; CPU fp32, {args.threads} threads); "
                        "ratios: of the medians (median of per-round ratios)")
    for col in ("config", "β", "samples", "resp tok", "zsearch before", "zsearch after", "TRL", "after/before",
                "after/TRL", "before/TRL", "peak MB b/a/TRL"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in results:
        peaks = "/".join(f"{r[v]['peak_mb']:.0f}" if v in r else "-" for v in VARIANTS)
        table.add_row(r["name"], f"{r['beta']:g}", str(r["samples"]), str(r["response_tokens"]), sec(r, "before"),
                      sec(r, "after"), sec(r, "trl"), ratio(r, "after", "before"), ratio(r, "after", "trl"),
                      ratio(r, "before", "trl"), peaks)
    Console(width=160).print(table)
    for r in results:
        first = {v: r[v]["first"].get("loss") for v in ("before", "after") if v in r}
        versions = {v: r[v].get("transformers") for v in VARIANTS if v in r}
        trl_v = r.get("trl", {}).get("trl")
        print(f"{r['name']} β={r['beta']:g}: warm-up steps {[r[v]['warmup'] for v in VARIANTS if v in r]}, "
              f"first-step actor/loss before/after {first}, transformers {versions}, trl {trl_v}, "
              f"{r['wall']:.0f} s, load average {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
              + (f"; notes: {r['notes']}" if r["notes"] else ""))


if __name__ == "__main__":
    main()
