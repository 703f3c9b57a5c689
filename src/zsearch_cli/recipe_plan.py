"""What ``stages/search-r1.sh --dry-run`` prints besides its commands: the disk the index
takes and the memory each process needs, from the user's files, before anything runs.

    python -m zsearch_cli.recipe_plan --corpus wiki-18.jsonl --faiss e5_Flat.index \\
        --model Qwen/Qwen2.5-3B --lora-r 0 --algo ppo --processes 8

Every figure says where it comes from, and each is an estimate of the large parts only
(activations are bounded by ``--micro-batch-tokens``, not counted here):

- passages: the faiss file's vector count when given, else the corpus size over
  the mean line length of its first 2,000 lines;
- ``corpus.arrow``: the corpus's uncompressed size (a ``.gz`` file is measured by streaming it);
- BM25: 0.54 KiB per passage, measured (542 MB at 1M passages, README "Performance: BM25 at
  wiki-18 scale"; ~11 GiB at wiki-18's 21M);
- the adopted faiss file: its size, memory-mapped: page cache on a CPU, half of it in fp16 on a
  GPU (docs/commands/index.md);
- training, per process under DDP (each holds a whole copy): the policy's weights and gradients
  in bf16 (2 + 2 bytes per parameter) and AdamW's two moments, which torch keeps in the
  weights' dtype (4 bytes); with LoRA only the weights (the adapter is small); the frozen
  reference 2 bytes per parameter when β > 0 and no LoRA (under LoRA the reference is the base
  with the adapter off); PPO's critic is another model of the same size with its optimizer; the
  colocated vLLM engine takes ``--gpu-memory-utilization`` (0.5) of the GPU, which
  ``--vllm-sleep`` hands back during the update. The parameter count is read from the model's
  ``config.json`` when the folder is local, else taken from a table of the models papers use.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

GIB = 1024**3
BM25_BYTES_PER_PASSAGE = 542e6 / 1e6
"""zsearch's BM25 index on disk per passage, measured at 1M passages (README's BM25 table)."""
KNOWN_PARAMS = {
    "Qwen/Qwen2.5-3B": 3.09e9, "Qwen/Qwen2.5-3B-Instruct": 3.09e9, "Qwen/Qwen2.5-7B": 7.62e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.62e9, "Qwen/Qwen2.5-14B": 14.8e9, "Qwen/Qwen2.5-14B-Instruct": 14.8e9,
    "smollm2": 0.135e9, "smollm2-warm": 0.135e9,
}
"""Parameters of the models the Search-R1 papers train (the model cards' figures)."""


def _gib(n: float) -> str:
    """A size in GiB, or MiB below one GiB (a small corpus is not '0.0 GiB')."""
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / 1024**2:,.1f} MiB"


def corpus_bytes(corpus: Path) -> int:
    """The corpus's uncompressed size (a ``.gz`` file streamed once)."""
    if corpus.suffix != ".gz":
        return corpus.stat().st_size
    total = 0
    with gzip.open(corpus, "rb") as fh:
        while chunk := fh.read(1 << 24):
            total += len(chunk)
    return total


def estimate_passages(corpus: Path, size: int, sample: int = 2000) -> int:
    """Passages in the corpus: its size over the mean line length of the first ``sample`` lines."""
    opener = gzip.open if corpus.suffix == ".gz" else open
    lengths = []
    with opener(corpus, "rb") as fh:
        for line in fh:
            lengths.append(len(line))
            if len(lengths) >= sample:
                break
    return round(size / (sum(lengths) / len(lengths))) if lengths else 0


def faiss_count(path: Path) -> int:
    """The vector count of a faiss Flat file, memory-mapped (its vectors are not read)."""
    from zsearch_cli.retrieval.faiss_file import open_flat

    return int(open_flat(path).ntotal)


def model_params(model: str) -> float | None:
    """The parameter count from a local folder's ``config.json``, else :data:`KNOWN_PARAMS`."""
    config = Path(model) / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        h, layers, vocab = c.get("hidden_size"), c.get("num_hidden_layers"), c.get("vocab_size")
        inter = c.get("intermediate_size") or 4 * (h or 0)
        if h and layers and vocab:
            # embeddings (tied or not) + per layer: q and o (2 h^2), k and v at the key-value
            # heads' width (grouped-query attention: Qwen2.5-3B's 2 of 16 heads), the gated
            # MLP (3 h i); biases and norms are under 0.1% at any real size and left out
            heads = c.get("num_attention_heads") or 1
            kv_width = h * (c.get("num_key_value_heads") or heads) // heads
            tied = c.get("tie_word_embeddings", True)
            return float(vocab * h * (1 if tied else 2) + layers * (2 * h * h + 2 * h * kv_width + 3 * h * inter))
    return KNOWN_PARAMS.get(model)


def plan(corpus: Path | None, faiss: Path | None, model: str, lora_r: int, algo: str, processes: int) -> list[str]:
    """The lines the dry run prints."""
    lines = []
    if corpus is not None:
        size = corpus_bytes(corpus)
        if faiss is not None:
            n, how = faiss_count(faiss), f"the vector count of {faiss.name}"
        else:
            n, how = estimate_passages(corpus, size), "corpus size / mean line length of its first 2,000 lines"
        bm25 = n * BM25_BYTES_PER_PASSAGE
        lines.append(f"passages: {n:,} ({how})")
        disk = size + bm25
        lines.append(f"disk (index folder): corpus.arrow {_gib(size)} + BM25 {_gib(bm25)} = {_gib(disk)}"
                     + (f"; {faiss.name} stays where it is ({_gib(faiss.stat().st_size)}, not copied)" if faiss else ""))
        serve = f"serve: BM25 and corpus memory-mapped, {_gib(disk)} of page cache to be fast"
        if faiss is not None:
            fs = faiss.stat().st_size
            serve += f"; the E5 vectors {_gib(fs)} of page cache on CPU, or {_gib(fs / 2)} of GPU memory in fp16"
        lines.append(serve)
    params = model_params(model)
    if params is None:
        lines.append(f"train: {model}: parameter count unknown (not a local folder, not in the table): no estimate")
        return lines
    policy = params * (2 if lora_r else 8)
    parts = [f"policy {_gib(policy)} ({'bf16 weights, LoRA' if lora_r else 'bf16 weights + grads + AdamW moments'})"]
    if not lora_r:
        parts.append(f"reference {_gib(params * 2)}")
    if algo == "ppo":
        parts.append(f"critic {_gib(params * (2 if lora_r else 8))}")
    total = policy + (0 if lora_r else params * 2) + (params * (2 if lora_r else 8) if algo == "ppo" else 0)
    lines.append(f"train, per process ({processes} under DDP, each a whole copy; {params / 1e9:.2f}B parameters): "
                 f"{' + '.join(parts)} = {_gib(total)}, plus activations (bounded by --micro-batch-tokens) and "
                 "the colocated vLLM's --gpu-memory-utilization (0.5 of the GPU; --vllm-sleep frees it during the update)")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--faiss", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--lora-r", type=int, default=0)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args(argv)
    for line in plan(args.corpus, args.faiss, args.model, args.lora_r, args.algo, args.processes):
        print(f"  {line}")


if __name__ == "__main__":
    main()
