"""``zsearch eval``: EM / F1 / subEM of a model (or of a predictions file) per dataset.

Methods, the baselines the papers report:
- ``direct``: answer from the model's own knowledge, no retrieval;
- ``cot``: reason in ``<think>`` first, then answer, no retrieval;
- ``rag``: retrieve top-k for the question once, put the passages in the prompt, answer;
- ``agent``: the multi-turn search engine loop (the default).

No example is ever dropped (Search-R1's ``drop_last`` loses the tail of the test set),
and a re-run skips the examples already scored, so an interrupted eval resumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zsearch_cli.data.demo import demo_qa
from zsearch_cli.data.qa import BENCHMARK_SPLITS, find_dataset_file, load_qa, resolve_datasets
from zsearch_cli.errors import ZsearchError
from zsearch_cli.rewards import score_answer
from zsearch_cli.schemas import (
    EVAL_EXAMPLE,
    EVAL_SUMMARY,
    PREDICTIONS,
    file_kind,
    read_artifact,
    read_parquet,
    rows_to_table,
    validate,
    write_artifact,
)

console = Console(stderr=True)
METHODS = ("direct", "cot", "rag", "agent")

# Single-turn baselines. They end in the same <answer> tag so one extractor scores all.
DIRECT_PROMPT = (
    "Answer the given question directly, inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)
COT_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. "
    "After reasoning, provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)
RAG_PROMPT = (
    "Answer the given question using the documents below. You may reason inside <think> and "
    "</think> first, then provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>.\n\nDocuments:\n{documents}\n\nQuestion: {question}"
)


@dataclass
class EvalOptions:
    """What ``zsearch eval`` runs; the CLI fills it from flags/YAML."""

    datasets: str = "demo"
    """'demo' (the bundled test split), 'all' (the seven benchmarks), a comma list, or QA file paths."""
    data_dir: Path = Path("data")
    """Where benchmark files live, FlashRAG layout: DATA_DIR/nq/test.jsonl."""
    download: bool = False
    """Fetch missing benchmark files from the FlashRAG hub dataset (needs network access)."""
    out: Path = Path("runs/eval")
    """Output directory: DATASET/METHOD.examples.parquet, DATASET/METHOD.summary.parquet, em.png."""
    model: str = "smollm2"
    """HF id, local path, checkpoint directory, or the 'smollm2' alias."""
    method: str = "agent"
    search: str = "bm25"
    """bm25 | dense | hybrid | http://host:port | serpapi."""
    index: Path | None = None
    """Index directory for in-process search (default: runs/index)."""
    protocol: str = "tags"
    topk: int = 3
    max_turns: int = 4
    max_turn_tokens: int = 500
    max_obs_tokens: int = 500
    max_context_tokens: int = 4096
    batch_size: int = 16
    limit: int | None = None
    """Evaluate only the first N examples of each dataset."""
    temperature: float = 0.0
    """Greedy by default."""
    seed: int = 0
    backend: str = "auto"
    """hf, vllm or auto (vLLM when installed with CUDA)."""
    device: str = "auto"


def dataset_files(spec: str, data_dir: Path, download: bool = False) -> list[tuple[str, Path]]:
    """(name, file) pairs for ``--datasets``."""
    out: list[tuple[str, Path]] = []
    for name in (["demo"] if spec.strip() == "demo" else resolve_datasets(spec)):
        if name == "demo":
            out.append(("demo", demo_qa("test")))
        elif Path(name).suffix in (".jsonl", ".parquet", ".gz") or Path(name).is_file():
            out.append((Path(name).name.split(".")[0], Path(name)))
        elif name in BENCHMARK_SPLITS:
            out.append((name, find_dataset_file(name, BENCHMARK_SPLITS[name], data_dir, download)))
        else:
            known = ", ".join(["demo", "all", *BENCHMARK_SPLITS])
            raise ZsearchError(f"unknown dataset {name!r}: use one of {known}, or a QA file path")
    return out


def _example_rows(dataset: str, method: str, trajs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in trajs:
        scores = score_answer(t["prediction"], t["golden_answers"])
        rows.append({
            "dataset": dataset, "method": method, "id": t["row_id"], "question": t["question"],
            "golden_answers": t["golden_answers"], "prediction": t["prediction"],
            "em": scores["em"], "f1": scores["f1"], "subem": scores["subem"],
            "searches": t["num_searches"], "turns": t["num_turns"], "tokens": t["response_tokens"],
            "finish_reason": t["finish_reason"], "trajectory": t["response_text"], "turn_log": t["turns"],
        })
    return rows


def summarize(examples: pa.Table, dataset: str, method: str, model: str) -> dict[str, Any]:
    d = examples.to_pydict()
    n = len(d["id"])
    mean = lambda xs: float(sum(xs) / n) if n else 0.0  # noqa: E731
    return {
        "dataset": dataset, "method": method, "model": model, "n": n,
        "em": mean(d["em"]), "f1": mean(d["f1"]), "subem": mean(d["subem"]),
        "answered": mean([p is not None for p in d["prediction"]]),
        "avg_searches": mean(d["searches"]), "avg_turns": mean(d["turns"]), "avg_tokens": mean(d["tokens"]),
    }


def evaluate_engine(engine: Any, rows: Sequence[Any], dataset: str, model: str, batch_size: int,
                    method: str = "agent") -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Score ``rows`` (QARows) with a ready engine, one sample each, as ``zsearch eval`` does:
    the EVAL_EXAMPLE rows and their EVAL_SUMMARY row (None without rows). For a model that is
    already in memory: validation during ``zsearch train`` runs the policy being trained."""
    examples: list[dict[str, Any]] = []
    for start in range(0, len(rows), batch_size):
        examples += _example_rows(dataset, method, engine.rollout(rows[start : start + batch_size], group_size=1))
    if not examples:
        return examples, None
    return examples, summarize(rows_to_table(examples, EVAL_EXAMPLE, Path(dataset)), dataset, method, model)


def _build_engine(opts: EvalOptions):
    from zsearch_cli.models.loading import load_backend
    from zsearch_cli.rollout.engine import RolloutConfig, RolloutEngine
    from zsearch_cli.rollout.protocols import PROTOCOLS
    from zsearch_cli.search.factory import make_search_backend

    if opts.protocol not in PROTOCOLS:
        raise ZsearchError(f"unknown --protocol {opts.protocol!r}: use one of {', '.join(PROTOCOLS)}")
    needs_search = opts.method in ("agent", "rag")
    search = make_search_backend(opts.search, index_dir=opts.index or Path("runs/index")) if needs_search else None
    backend = load_backend(opts.model, backend=opts.backend, device=opts.device)
    cfg = RolloutConfig(
        max_turns=opts.max_turns if opts.method == "agent" else 0,
        max_turn_tokens=opts.max_turn_tokens, max_obs_tokens=opts.max_obs_tokens,
        max_context_tokens=opts.max_context_tokens, topk=opts.topk,
        temperature=opts.temperature, seed=opts.seed,
    )
    return RolloutEngine(backend, PROTOCOLS[opts.protocol](), search, cfg), search


def _single_turn_prompts(method: str, rows, search, topk: int) -> None:
    """Fill ``row.prompt`` for direct / cot / rag; rag retrieves once per question, batched."""
    from zsearch_cli.search.base import SearchRequest

    if method == "direct":
        for r in rows:
            r.prompt = DIRECT_PROMPT.format(question=r.question)
    elif method == "cot":
        for r in rows:
            r.prompt = COT_PROMPT.format(question=r.question)
    elif method == "rag":
        reqs = [SearchRequest(r.question, r.id, r.question, tuple(r.golden_answers)) for r in rows]
        for r, res in zip(rows, search.search(reqs, topk)):
            docs = "\n".join(f"Doc {i + 1}(Title: {p.title}) {p.text}" for i, p in enumerate(res.passages))
            r.prompt = RAG_PROMPT.format(documents=docs, question=r.question)


def evaluate(opts: EvalOptions, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every dataset, resuming from earlier partial outputs; returns the summaries."""
    from zsearch_cli.rollout.engine import QARow

    if opts.method not in METHODS:
        raise ZsearchError(f"unknown --method {opts.method!r}: use one of {', '.join(METHODS)}")
    files = dataset_files(opts.datasets, opts.data_dir, opts.download)
    qa_tables = [(name, load_qa(path)) for name, path in files]  # validate everything before loading a model
    engine, search = _build_engine(opts)
    summaries = []
    for name, qa in qa_tables:
        if opts.limit is not None:
            qa = qa.slice(0, opts.limit)
        out_examples = opts.out / name / f"{opts.method}.examples.parquet"
        done_rows: list[dict[str, Any]] = []
        if out_examples.exists():
            done_rows = read_artifact(out_examples, EVAL_EXAMPLE).to_pylist()
        done = {r["id"] for r in done_rows}
        todo = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa.to_pylist() if r["id"] not in done]
        if done:
            console.print(f"[dim]{name}: {len(done)} examples already scored, {len(todo)} to go[/]")
        with Progress(TextColumn(f"eval {name} ({opts.method})"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(name, total=len(todo))
            for start in range(0, len(todo), opts.batch_size):
                batch = todo[start : start + opts.batch_size]
                _single_turn_prompts(opts.method, batch, search, opts.topk)
                trajs = engine.rollout(batch, group_size=1, on_row_done=lambda n: bar.advance(task, n))
                done_rows += _example_rows(name, opts.method, trajs)
                write_artifact(done_rows, out_examples, EVAL_EXAMPLE, config)  # after every batch: resumable
        examples = rows_to_table(done_rows, EVAL_EXAMPLE, out_examples) if done_rows else None
        if examples is None:
            continue
        summary = summarize(examples, name, opts.method, opts.model)
        write_artifact([summary], opts.out / name / f"{opts.method}.summary.parquet", EVAL_SUMMARY, config)
        summaries.append(summary)
    print_summaries(summaries)
    plot_em(opts.out)
    return summaries


# ----------------------------------------------------------------------------- predictions files


def score_predictions(path: Path, qa_path: Path | None, out: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Score another system's predictions: FILE has id + prediction (+ golden_answers),
    or golds come from a QA file joined by id."""
    if file_kind(path) == "parquet":
        preds = validate(read_parquet(path), PREDICTIONS, path)
    else:
        preds = read_artifact(path, PREDICTIONS)
    golds: dict[str, list[str]] = {}
    if qa_path is not None:
        qa = load_qa(qa_path)
        golds = dict(zip(qa.column("id").to_pylist(), qa.column("golden_answers").to_pylist()))
        questions = dict(zip(qa.column("id").to_pylist(), qa.column("question").to_pylist()))
    rows = []
    for i, r in enumerate(preds.to_pylist()):
        gold = r["golden_answers"] if r["golden_answers"] is not None else golds.get(r["id"])
        if gold is None:
            where = f"not in {qa_path}" if qa_path else "and no --qa file was given to join golds from"
            raise ZsearchError(f"{path}: row {i}: id {r['id']!r} has no golden_answers ({where})")
        s = score_answer(r["prediction"], gold)
        rows.append({"dataset": path.stem, "method": "predictions", "id": r["id"],
                     "question": questions.get(r["id"], "") if qa_path else "", "golden_answers": gold,
                     "prediction": r["prediction"], "em": s["em"], "f1": s["f1"], "subem": s["subem"],
                     "searches": 0, "turns": 0, "tokens": 0, "finish_reason": "", "trajectory": "", "turn_log": "[]"})
    examples = rows_to_table(rows, EVAL_EXAMPLE, path)
    write_artifact(examples, out / path.stem / "predictions.examples.parquet", EVAL_EXAMPLE, config)
    summary = summarize(examples, path.stem, "predictions", "-")
    write_artifact([summary], out / path.stem / "predictions.summary.parquet", EVAL_SUMMARY, config)
    print_summaries([summary])
    return summary


# ----------------------------------------------------------------------------- reporting


def print_summaries(summaries: Sequence[dict[str, Any]]) -> None:
    if not summaries:
        return
    table = Table(title="zsearch eval")
    for col in ("dataset", "method", "n", "EM", "F1", "subEM", "answered", "searches", "turns"):
        table.add_column(col, justify="left" if col in ("dataset", "method") else "right")
    for s in summaries:
        table.add_row(s["dataset"], s["method"], str(s["n"]), f"{s['em']:.3f}", f"{s['f1']:.3f}",
                      f"{s['subem']:.3f}", f"{s['answered']:.2f}", f"{s['avg_searches']:.2f}", f"{s['avg_turns']:.2f}")
    Console().print(table)


def plot_em(out: Path) -> Path | None:
    """A bar chart of EM per dataset, one bar per method, from every summary under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [read_artifact(p, EVAL_SUMMARY).to_pylist()[0] for p in sorted(out.glob("*/*.summary.parquet"))]
    if not rows:
        return None
    datasets = sorted({r["dataset"] for r in rows})
    methods = sorted({r["method"] for r in rows})
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(datasets) * len(methods)), 3.5))
    for j, m in enumerate(methods):
        em = {r["dataset"]: r["em"] for r in rows if r["method"] == m}
        xs = [i + j * width for i in range(len(datasets))]
        ax.bar(xs, [em.get(d, 0.0) for d in datasets], width=width, label=m)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("EM")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    path = out / "em.png"
    tmp = out / ".em.png.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
