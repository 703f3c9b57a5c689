"""Issue 37.4: `stages/search-r1.sh` from the files a Search-R1 user has (wiki-18 corpus,
`e5_Flat.index`, the train and the merged test Parquet), here small synthetic ones built the
way Search-R1 builds them (tests/test_adopt_faiss.py: its `index_builder.py`, MiniLM standing in
for E5, no prefix), and the tiny model.

- `--dry-run` prints every command, the disk and the memory, and runs nothing;
- the whole recipe end to end: adopt + BM25, serve on 127.0.0.1, train (1 step), evaluate the
  seven sets of the merged test file, each on its own, then both averages.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import TORCH_THREADS
from test_adopt_faiss import search_r1_build, write_wiki18
from zsearch_cli.recipe_plan import BM25_BYTES_PER_PASSAGE, GIB, KNOWN_PARAMS, model_params, plan
from zsearch_cli.retrieval.dense import resolve_encoder

ROOT = Path(__file__).resolve().parents[1]
SEVEN = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("search_r1")
    demo = [json.loads(line) for line in (ROOT / "src/zsearch_cli/data/demo/corpus.jsonl").read_text().splitlines()]
    rows = [{"id": str(i), "contents": f'"{r["title"]}"\n{r["text"]}'} for i, r in enumerate(demo[:120])]
    qa = [json.loads(line) for line in (ROOT / "src/zsearch_cli/data/demo/test.jsonl").read_text().splitlines()]

    def row(i: int, source: str, split: str) -> dict:
        q = qa[i]
        return {"id": f"{split}_{i}", "question": q["question"], "golden_answers": q["golden_answers"],
                "data_source": source, "prompt": [{"role": "user", "content": q["question"]}],
                "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": q["golden_answers"]}},
                "extra_info": {"split": split, "index": i}}

    return {
        "corpus": write_wiki18(d / "wiki-18.jsonl", rows),
        "faiss": search_r1_build([r["contents"] for r in rows], resolve_encoder("minilm"), d / "e5_Flat.index",
                                 prefix=""),
        "train": _parquet(d / "train.parquet", [row(i, ("nq", "hotpotqa")[i % 2], "train") for i in range(8)]),
        # as qa_search_test_merge.py writes it: per-source ids repeat across the seven sets
        "test": _parquet(d / "test.parquet", [{**row(8 + i, SEVEN[i // 2], "test"), "id": f"test_{i % 2}"}
                                              for i in range(14)]),
    }


def _recipe(files: dict[str, Path], out: Path, model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out), "CORPUS": str(files["corpus"]), "FAISS": str(files["faiss"]),
           "ENCODER": "minilm", "TRAIN": str(files["train"]), "TEST": str(files["test"]), "MODEL": str(model),
           "ALGO": "grpo", "STEPS": "1", "BATCH": "2", "TURN_TOKENS": "8", "LORA_R": "0", "DEVICE": "cpu",
           "PORT": str(_free_port()), "SAVE_EVERY": "1", "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "stages/search-r1.sh"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_plan_arithmetic():
    # 1M passages: BM25 542 MB (README's measured 1M row); corpus 2 GiB -> 2 GiB + 0.505 GiB.
    # A 3.09B model, full fine-tuning, PPO: policy 8 B/param = 24.72e9 B = 23.0 GiB, reference
    # 2 B/param = 5.8 GiB, critic 8 B/param = 23.0 GiB: 51.8 GiB per process.
    assert BM25_BYTES_PER_PASSAGE * 1e6 == pytest.approx(542e6)
    lines = plan(None, None, "Qwen/Qwen2.5-3B", 0, "ppo", 8)
    assert "policy 23.0 GiB" in lines[-1] and "reference 5.8 GiB" in lines[-1] and "critic 23.0 GiB" in lines[-1]
    assert "= 51.8 GiB" in lines[-1] and "3.09B parameters" in lines[-1] and "8 under DDP" in lines[-1]
    # LoRA, GRPO: the bf16 weights only (2 B/param), no reference copy, no critic
    assert "= 5.8 GiB" in plan(None, None, "Qwen/Qwen2.5-3B", 16, "grpo", 1)[-1]
    assert "unknown" in plan(None, None, "someone/unknown-model", 0, "ppo", 1)[-1]
    assert round(3.09e9 * 8 / GIB, 1) == 23.0


def test_model_params_from_a_local_config(tiny_model_and_tokenizer, tiny_model_dir, tmp_path):
    # Against the real model, not the formula again: the tiny Qwen2 (h 64, 2 layers, 4 heads of
    # which 2 key-value, vocab 640, tied) has 115,264 parameters, of which biases (q, k, v:
    # 128 per layer) and norms (2 x 64 per layer + 64) are 576; the estimate leaves those out.
    # Counting k and v at the full width (4 h^2) would give 122,880, 6.6% over, and fail.
    model, _ = tiny_model_and_tokenizer
    real = sum(p.numel() for p in model.parameters())
    assert model_params(str(tiny_model_dir)) == pytest.approx(real, rel=0.01)
    # Qwen2.5-3B's config.json: the model card says 3.09B; the full-width count says 3.35B
    qwen3b = tmp_path / "qwen2.5-3b"
    qwen3b.mkdir()
    (qwen3b / "config.json").write_text(json.dumps({
        "hidden_size": 2048, "num_hidden_layers": 36, "vocab_size": 151936, "intermediate_size": 11008,
        "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True}))
    assert model_params(str(qwen3b)) == pytest.approx(KNOWN_PARAMS["Qwen/Qwen2.5-3B"], rel=0.01)


def test_dry_run_prints_every_command_and_the_plan_and_runs_nothing(files, tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    done = _recipe(files, out, tiny_model_dir, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "passages: 120 (the vector count of e5_Flat.index)" in text
    assert "e5_Flat.index stays where it is" in text and "train, per process" in text
    for command in ("zsearch index", "--adopt-faiss", "zsearch serve", " train --preset search-r1",
                    "zsearch eval", "zsearch plot"):
        assert command in text, command
    assert not out.exists()  # nothing ran


def test_the_recipe_end_to_end(files, tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    done = _recipe(files, out, tiny_model_dir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    manifest = json.loads((out / "index" / "manifest.json").read_text())
    assert manifest["dense"]["adopted"]["path"] == str(files["faiss"].resolve())
    assert (out / "train" / "final").is_dir()
    text = done.stdout + done.stderr
    summaries = sorted(p.parent.name for p in (out / "eval").rglob("agent.summary.parquet"))
    assert summaries == sorted(SEVEN)  # each of the seven sets scored on its own
    for source in SEVEN:
        assert f"test.parquet/{source}" in text, source
    assert "avg (plain)" in text and "avg (weighted by n)" in text
    assert "serving index" in text  # the recipe served the index; train and eval searched over HTTP
    assert "protocol: model" in text and "http://127.0.0.1:" in text
