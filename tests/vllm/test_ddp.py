"""`zsearch train --backend vllm` under DDP: 2 real processes (`accelerate launch`, gloo),
each with a real vLLM engine (CPU build) of its own.

What would be wrong, and what catches it:

- The engines share a device: vLLM's default in-process executor gives its worker local
  rank 0 in every process, so on N GPUs every engine would sit on ``cuda:0``. Each process
  records its engine worker's local rank; they must be 0 and 1.
- An engine is not synced, or synced with another process's weights: each process records
  its engine's greedy ids and the HF policy's on fixed prompts after the last update; they
  must be equal, and the two processes' policies must hold the same weights (DDP).
- The engines did not each serve their own share: the saved rollouts of the two processes
  hold different prompts, and every step's rollout logprobs match the training forward
  (``logp_mismatch``) under the tolerance, with non-zero gradients (a length reward: the
  random tiny model never writes an answer tag, so an EM reward would give all-zero
  gradients and prove nothing).
- The run ends with a traceback (the engine's process groups outliving ``end_training``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.models.base import LOGP_TOLERANCE
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS, ROLLOUT

TOL = LOGP_TOLERANCE["float32"]
PROMPTS = ("Who wrote the novel?", "The river flows")


def _worker(argv: list[str]) -> None:
    """One launched process: the `zsearch` CLI with a length reward and a record of its engine."""
    import torch

    import zsearch_cli.train.step_samples as collect
    import zsearch_cli.train.trainer as trainer
    from zsearch_cli.cli import app as cli_app

    out = Path(argv[argv.index("--out") + 1])
    rank = int(os.environ["RANK"])
    if rank == 1 and os.environ.get("ZSEARCH_TEST_STALE_RANK1"):  # only this process's engine is off
        trainer.Trainer._probe_mismatch = lambda self, policy: 0.5
    collect.trajectory_reward = lambda prediction, turns, *a, **k: len("".join(turns)) / 1000
    close = trainer.Trainer.close

    def record_then_close(self: Any) -> None:
        from zsearch_cli.models.base import SamplingParams
        from zsearch_cli.models.hf import HFBackend

        policy = self.accelerator.unwrap_model(self.policy)
        prompts = [self.tokenizer.encode(t) for t in PROMPTS]
        greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
        llm = self.generation.llm
        record = {
            "executor": llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend,
            "local_rank": llm.collective_rpc(lambda worker: worker.local_rank)[0],
            "engine": [o.token_ids for o in self.generation.generate(prompts, greedy)],
            "policy": [o.token_ids for o in HFBackend(policy, self.tokenizer).generate(prompts, greedy)],
            "weights": float(sum(p.double().sum() for p in policy.parameters())),
        }
        (out / f"engine.rank{rank}.json").write_text(json.dumps(record))
        close(self)

    trainer.Trainer.close = record_then_close
    torch.set_num_threads(1)
    sys.argv = ["zsearch", *argv]
    cli_app()


def _launch(tmp_path: Path, model: Path, out: Path, steps: int, **env: str) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` 2 processes of ``zsearch train --backend vllm`` (this file's ``_worker``)."""
    index = tmp_path / "index"
    if not index.exists():
        result = CliRunner().invoke(app, ["index", "--out", str(index), "--kind", "bm25"])
        assert result.exit_code == 0, result.output
    out.mkdir()
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", __file__]
    args = ["train", "--algo", "grpo", "-G", "2", "--batch-size", "4", "--model", str(model),
            "--index", str(index), "--out", str(out), "--steps", str(steps), "--save-every", "0",
            "--max-turns", "2", "--max-turn-tokens", "16", "--lr", "1e-3", "--device", "cpu",
            "--backend", "vllm", "--save-rollouts"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env}
    return subprocess.run([*launch, *args], env=full_env, capture_output=True, text=True, timeout=300)


def test_ddp_runs_one_synced_engine_per_process(tmp_path, vllm_tiny_dir):
    out, steps = tmp_path / "run", 3
    proc = _launch(tmp_path, vllm_tiny_dir, out, steps)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "Traceback" not in proc.stderr and "Invalid process group" not in proc.stderr, proc.stderr[-3000:]

    records = [json.loads((out / f"engine.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["executor"] for r in records] == ["external_launcher"] * 2
    assert [r["local_rank"] for r in records] == [0, 1]  # one device each, not both on device 0
    for r in records:
        assert r["engine"] == r["policy"]  # each engine holds the trained policy
    assert records[0]["weights"] == records[1]["weights"]  # DDP: one policy on both processes

    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert len(metrics) == steps
    print("logp_mismatch", [m["rollout/logp_mismatch"] for m in metrics],
          "sync_mismatch", [m["rollout/sync_mismatch"] for m in metrics])
    for m in metrics:
        assert m["actor/grad_norm"] > 0
        assert 0 < m["rollout/logp_mismatch"] < TOL and 0 <= m["rollout/sync_mismatch"] < TOL

    first = sorted((out / "rollouts").glob("*.rank0.parquet"))[0]
    prompts = [{tuple(row["prompt_ids"]) for row in read_artifact(first.with_name(first.name.replace("rank0", f"rank{r}")),
                                                                 ROLLOUT).to_pylist()} for r in (0, 1)]
    assert prompts[0] and prompts[1] and not prompts[0] & prompts[1]  # each engine served its own share



def test_one_stale_engine_stops_every_process(tmp_path, vllm_tiny_dir):
    # Only process 1's engine disagrees with its policy. The probe guard takes the worst value
    # of all processes, so both stop with the one-line error; a per-process guard would stop
    # process 1 alone and leave process 0 waiting in its next collective.
    proc = _launch(tmp_path, vllm_tiny_dir, tmp_path / "stale", 1, ZSEARCH_TEST_STALE_RANK1="1")
    assert proc.returncode != 0
    assert proc.stderr.count("the vLLM weight sync failed") == 2, proc.stderr[-3000:]


if __name__ == "__main__":
    _worker(sys.argv[1:])
