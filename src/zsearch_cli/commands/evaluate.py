"""``zsearch eval``: EM / F1 / subEM of a model (or of a predictions file) per dataset.

Methods, the baselines the papers report:
- ``direct``: answer from the model's own knowledge, no retrieval;
- ``cot``: reason in ``<think>`` first, then answer, no retrieval;
- ``rag``: retrieve top-k for the question once, put the passages in the prompt, answer;
- ``agent``: the multi-turn search engine loop (the default).

No example is ever dropped (Search-R1's ``drop_last`` loses the tail of the test set),
and a re-run skips the examples already scored, so an interrupted eval resumes.

Datasets are keyed by :func:`zsearch_cli.data.qa.dataset_key` (``nq/test`` for a FlashRAG
file under ``--data-dir``, else the file's path), written under OUT/KEY/ (:func:`dataset_dir`
keeps every write inside ``--out``); two inputs with one key are an error. A file whose
``--group-by`` column (default ``data_source``) holds several values, as Search-R1's merged
test file with its seven benchmarks, is scored as one dataset per value, KEY/VALUE: a single
EM over seven benchmarks is not any number a paper reports. ``--pooled`` adds the whole
file as KEY/pooled, labelled as such. Rows already in
OUT are reused only when every option that changes a result and the protocol
(:mod:`zsearch_cli.protocol`: model weights, corpus, retriever, prompt, metric, QA file) equal
the saved ones; otherwise the run is refused in one line naming what differs.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zsearch_cli.scoring import dataset_dir
from zsearch_cli.config.fields import to_flat
from zsearch_cli.data.demo import demo_qa
from zsearch_cli.data.qa import (
    BENCHMARK_SPLITS,
    NO_GROUPING,
    dataset_key,
    find_dataset_file,
    group_labels,
    load_qa,
    resolve_datasets,
    split_groups,
)
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import ProgressLines, Stopped, active_stop, heartbeat
from zsearch_cli.config.commands import EvalOptions
from zsearch_cli.prompts.baselines import COT_PROMPT, DIRECT_PROMPT, RAG_PROMPT
from zsearch_cli.protocol import METRIC_VERSION, RESUME_FIELDS, Protocol, build_protocol, differing, file_fingerprint
from zsearch_cli.rewards import score_answer
from zsearch_cli.scoring import example_rows, summarize
from zsearch_cli.schemas import (
    EVAL_EXAMPLE,
    EVAL_SUMMARY,
    PREDICTIONS,
    file_kind,
    read_artifact,
    read_metadata,
    read_parquet,
    rows_to_table,
    validate,
    write_artifact,
)

# A log file or pipe gets rich's default 80 columns, which squeezes the 10-column table
# into one letter per line; a terminal keeps its own width.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
METHODS = ("direct", "cot", "rag", "agent")

EVAL_RESUME_MAY_CHANGE = {"datasets", "data_dir", "download", "out", "limit", "batch_size", "device", "backend",
                          "predictions", "qa", "rollout_mode", "search_concurrency", "group_by", "pooled", "probe"}
"""Options that may differ between an eval and the run whose rows it reuses: which rows are
asked for, where files are, and how the same computation is batched or placed. Everything
else (and the protocol: weights, corpus, prompt, metric, QA file) must be equal."""


@dataclass(frozen=True)
class DatasetInput:
    key: str
    """Unique and readable: ``nq/test``, ``demo``, or the file's path (see data/qa.py dataset_key)."""
    split: str | None
    path: Path


POOLED = "pooled"
"""The key suffix of a split file scored whole (``--pooled``)."""


def split_by_group(qa_tables: Sequence[tuple[DatasetInput, Any]], group_by: str,
                   pooled: bool) -> tuple[list[tuple[DatasetInput, Any]], list[str]]:
    """Each file whose ``group_by`` column holds several values becomes one input per value
    (key KEY/VALUE, rows in file order), plus KEY/pooled with ``pooled``; returns the inputs
    and the lines to print about them. With ``group_by`` none, a file that holds several
    ``data_source`` values stays whole, and a line says so."""
    out: list[tuple[DatasetInput, Any]] = []
    notes: list[str] = []
    for d, qa in qa_tables:
        column = group_by if group_by != NO_GROUPING else "data_source"
        groups = split_groups(qa, group_labels(d.path, qa, column))
        if not groups:
            out.append((d, qa))
        elif group_by == NO_GROUPING:
            out.append((d, qa))
            notes.append(f"{d.key}: holds {len(groups)} data_source values ({', '.join(g for g, _ in groups)}), "
                         "scored as ONE pooled number (--group-by none)")
        else:
            out += [(DatasetInput(f"{d.key}/{label}", d.split, d.path), sub) for label, sub in groups]
            if pooled:
                out.append((DatasetInput(f"{d.key}/{POOLED}", d.split, d.path), qa))
            notes.append(f"{d.key}: {len(groups)} datasets by {group_by} "
                         f"({', '.join(f'{g} {t.num_rows}' for g, t in groups)}), each scored on its own"
                         + (f"; {d.key}/{POOLED} pools them" if pooled else ""))
    seen: set[str] = set()
    for d, _ in out:
        if d.key in seen:
            raise ZsearchError(f"--datasets: two inputs map to dataset key {d.key!r} (a {group_by} value equals "
                               "another input's key); pass that file alone, or use another --group-by")
        seen.add(d.key)
    return out, notes


def dataset_files(spec: str, data_dir: Path, download: bool = False) -> list[DatasetInput]:
    """The QA files ``--datasets`` names, with their keys; two inputs with one key are an error."""
    out: list[DatasetInput] = []
    for name in (["demo"] if spec.strip() == "demo" else resolve_datasets(spec)):
        if name == "demo":
            out.append(DatasetInput("demo", "test", demo_qa("test")))
        elif name in BENCHMARK_SPLITS and not Path(name).is_file():
            path = find_dataset_file(name, BENCHMARK_SPLITS[name], data_dir, download)
            key, split = dataset_key(path, data_dir)
            out.append(DatasetInput(key, split or BENCHMARK_SPLITS[name], path))
        elif name.lower().endswith((".jsonl", ".parquet", ".gz", ".json")) or Path(name).is_file():
            out.append(DatasetInput(*dataset_key(Path(name), data_dir), Path(name)))
        else:
            known = ", ".join(["demo", "all", *BENCHMARK_SPLITS])
            raise ZsearchError(f"unknown dataset {name!r}: use one of {known}, or a QA file path")
    seen: dict[str, Path] = {}
    for d in out:
        if d.key in seen:
            raise ZsearchError(f"--datasets: {seen[d.key]} and {d.path} both map to dataset key {d.key!r}; "
                               "pass each dataset once (or give one of them as a path outside --data-dir)")
        seen[d.key] = d.path
    return out


def _build_engine(opts: EvalOptions):
    from zsearch_cli.rollout.build import MAKE, build_engine

    engine = build_engine(opts, search=MAKE if opts.method in ("agent", "rag") else None,
                          max_turns=opts.rollout.max_turns if opts.method == "agent" else 0)
    return engine, engine.search


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


def _method_template(method: str) -> str | None:
    return {"direct": DIRECT_PROMPT, "cot": COT_PROMPT, "rag": RAG_PROMPT}.get(method)


def eval_protocol(opts: EvalOptions, d: DatasetInput, qa_rows: int) -> Protocol:
    return build_protocol(to_flat(opts), dataset=d.key, dataset_fingerprint=file_fingerprint(d.path),
                          split=d.split, limit=opts.limit, full_set=opts.limit is None or opts.limit >= qa_rows,
                          method=opts.method, template=_method_template(opts.method))


def check_reusable(path: Path, config: dict[str, Any], protocol: Protocol) -> None:
    """Refuse, in one line naming the differences, to reuse rows ``path`` holds from a run
    whose result-changing options or protocol differ (the rule ``train --resume`` follows)."""
    meta = read_metadata(path)
    if "protocol" not in meta:
        raise ZsearchError(f"{path}: holds rows of an eval whose protocol was not recorded (an older zsearch); "
                           "choose another --out, or delete that file to score again")
    now = protocol.as_dict()
    changed = differing(meta.get("config", {}), config, EVAL_RESUME_MAY_CHANGE)
    # options already compared above (model, topk, seed, ...) are not listed twice
    changed += differing(meta["protocol"], {k: now[k] for k in RESUME_FIELDS}, set(config))
    if changed:
        raise ZsearchError(f"{path}: holds rows of another eval ({', '.join(changed)}); rows are reused only "
                           "when every option that changes a result is equal: choose another --out, or delete "
                           "that file to score again")


def evaluate(opts: EvalOptions, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every dataset (under each ``--probe``: audit/probe_eval.py), resuming from earlier
    partial outputs of the same protocol; returns the summaries (each with its protocol columns)."""
    from zsearch_cli.audit.probe_eval import ProbePlan
    from zsearch_cli.rollout.engine import QARow

    if opts.method not in METHODS:
        raise ZsearchError(f"unknown --method {opts.method!r}: use one of {', '.join(METHODS)}")
    plan = ProbePlan(opts)
    files = dataset_files(opts.data.datasets, opts.data.data_dir, opts.data.download)
    # validate everything before loading a model
    qa_tables, notes = split_by_group([(d, load_qa(d.path)) for d in files], opts.data.group_by, opts.pooled)
    for line in notes:
        console.print(line, markup=False, highlight=False)
    protocols = {d.key: eval_protocol(opts, d, qa.num_rows) for d, qa in qa_tables}
    qa_tables = [(d, qa.slice(0, opts.limit) if opts.limit is not None else qa) for d, qa in qa_tables]
    for d, qa in qa_tables:  # the matching audit, and each probe's rows of an earlier run
        for existing, protocol in plan.prepare(opts.out, d.key, protocols[d.key], qa.column("id").to_pylist()):
            check_reusable(existing, config, protocol)
    with heartbeat("eval", f"loading {opts.policy.model}"):
        engine, search = _build_engine(opts)
    summaries = []
    stop = active_stop()  # zsearch eval: SIGTERM / SIGINT raise Stopped at once; written rows stay
    for probe, k, (d, qa) in [(p, k, dq) for p in plan.probes for k, dq in enumerate(qa_tables, 1)]:
        name, protocol, method = d.key, plan.protocol(probe, protocols[d.key]), plan.label(probe)
        engine.search = plan.backend(probe, search, name)
        record = plan.protocol_record(name, protocol)
        out_examples = dataset_dir(opts.out, name) / f"{method}.examples.parquet"
        done_rows: list[dict[str, Any]] = []
        if out_examples.exists():
            done_rows = read_artifact(out_examples, EVAL_EXAMPLE).to_pylist()
        done = {r["id"] for r in done_rows}
        todo = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa.to_pylist() if r["id"] not in done]
        if done:
            console.print(f"[dim]{name}: {len(done)} examples already scored, {len(todo)} to go[/]")
        wanted = set(qa.column("id").to_pylist())

        def scored() -> list[dict[str, Any]]:
            return [r for r in done_rows if r["id"] in wanted]

        label = f"eval {name} ({method}" + (f", dataset {k}/{len(qa_tables)})" if len(qa_tables) > 1 else ")")
        written = len(scored())
        lines = ProgressLines(label, qa.num_rows, "questions", done=written)  # plain lines in a log file
        try:
            with Progress(TextColumn(f"eval {name} ({method})"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=True) as bar, lines:

                def row_done(n: int) -> None:
                    bar.advance(task, n)
                    lines.advance(n)

                task = bar.add_task(name, total=len(todo))
                for start in range(0, len(todo), opts.batch_size):
                    batch = todo[start : start + opts.batch_size]
                    _single_turn_prompts(opts.method, batch, engine.search, opts.rollout.topk)
                    trajs = engine.rollout(batch, group_size=1, on_row_done=row_done)
                    done_rows += example_rows(name, method, trajs)
                    rows_now = scored()
                    # after every batch: resumable (a signal waits for the file to be whole, then
                    # stops with these rows written)
                    with stop.deferred() if stop is not None else nullcontext():
                        write_artifact(done_rows, out_examples, EVAL_EXAMPLE, config, record)
                        written = len(rows_now)
                    lines.advance(0, em=sum(r["em"] for r in rows_now) / max(written, 1))
        except Stopped as err:
            raise Stopped(err.signum, f"eval: stopped by {err.name} after {written}/{qa.num_rows} questions "
                                      f"of {name}; rerun the same command to resume") from None
        # The summary is of exactly the rows asked for now (an earlier, larger --limit may
        # have scored more), in the QA file's order.
        by_id = {r["id"]: r for r in done_rows}
        rows = [by_id[i] for i in qa.column("id").to_pylist()]
        if not rows:
            continue
        examples = rows_to_table(rows, EVAL_EXAMPLE, out_examples)
        summary = {**summarize(examples, name, method, opts.policy.model), **protocol.as_dict(),
                   **plan.ceiling_columns(name)}
        write_artifact([summary], out_examples.with_name(f"{method}.summary.parquet"), EVAL_SUMMARY, config, record)
        summaries.append(summary)
        plan.add(probe, name, summary, rows)
    print_summaries(summaries, [protocols[s["dataset"]] for s in summaries])
    plan.report(opts.out, config)
    plot_em(opts.out)
    return summaries


# ----------------------------------------------------------------------------- predictions files


def predictions_protocol(path: Path, key: str, qa_path: Path | None) -> Protocol:
    """What is known about another system's predictions: the metric and the dataset; the
    rest (model, retriever, decoding) is not, and is recorded as unknown (null)."""
    return Protocol(model="-", model_revision=None, adapter=None, corpus_fingerprint=None, corpus_size=None,
                    retriever="unknown", bm25_k1=None, bm25_b=None, bm25_analyzer=None, encoder=None, topk=None,
                    max_turns=None, max_turn_tokens=None, max_obs_tokens=None, prompt="unknown",
                    metric_version=METRIC_VERSION, decoding="unknown", temperature=None, top_p=None, seed=None,
                    dataset=key, dataset_fingerprint=file_fingerprint(path, *([qa_path] if qa_path else [])),
                    split=None, limit=None, full_set=True)


def score_predictions(path: Path, qa_path: Path | None, out: Path, config: dict[str, Any],
                      group_by: str = "data_source", pooled: bool = False) -> list[dict[str, Any]]:
    """Score another system's predictions: FILE has id + prediction (+ golden_answers),
    or golds come from a QA file joined by id. With a QA file, every question it holds
    counts: one without a prediction scores 0 and is counted as ``missing``. Split by
    ``group_by`` as :func:`evaluate` splits a file (the QA file's labels when given, else the
    predictions file's own column); returns one summary per dataset."""
    if file_kind(path) == "parquet":
        preds = validate(read_parquet(path), PREDICTIONS, path)
    else:
        preds = read_artifact(path, PREDICTIONS)
    key = dataset_key(path, None)[0]
    golds: dict[str, list[str]] = {}
    questions: dict[str, str] = {}
    labels: dict[str, str | None] = {}
    if qa_path is not None:
        qa = load_qa(qa_path)
        ids = qa.column("id").to_pylist()
        golds = dict(zip(ids, qa.column("golden_answers").to_pylist()))
        questions = dict(zip(ids, qa.column("question").to_pylist()))
        labels = dict(zip(ids, group_labels(qa_path, qa, group_by)))
    elif group_by != NO_GROUPING:
        raw = read_parquet(path) if file_kind(path) == "parquet" else None
        if raw is not None and group_by in raw.column_names:
            labels = dict(zip(preds.column("id").to_pylist(), [None if v in (None, "") else str(v)
                                                               for v in raw.column(group_by).to_pylist()]))
        elif raw is None:
            from zsearch_cli.schemas import iter_jsonl

            labels = {str(o.get("id")): (None if o.get(group_by) in (None, "") else str(o.get(group_by)))
                      for _, o in iter_jsonl(path)}

    def row(id_: str, prediction: str | None, gold: list[str]) -> dict[str, Any]:
        s = score_answer(prediction, gold)
        return {"dataset": key, "method": "predictions", "id": id_, "question": questions.get(id_, ""),
                "golden_answers": gold, "prediction": prediction, "em": s["em"], "f1": s["f1"], "subem": s["subem"],
                "searches": 0, "turns": 0, "tokens": 0, "finish_reason": "", "trajectory": "", "turn_log": "[]"}

    rows = []
    for i, r in enumerate(preds.to_pylist()):
        gold = r["golden_answers"] if r["golden_answers"] is not None else golds.get(r["id"])
        if gold is None:
            where = f"not in {qa_path}" if qa_path else "and no --qa file was given to join golds from"
            raise ZsearchError(f"{path}: row {i}: id {r['id']!r} has no golden_answers ({where})")
        rows.append(row(r["id"], r["prediction"], gold))
    predicted = set(preds.column("id").to_pylist())
    rows += [row(id_, None, gold) for id_, gold in golds.items() if id_ not in predicted]
    table = rows_to_table(rows, EVAL_EXAMPLE, path)
    groups = split_groups(table, [labels.get(r["id"]) for r in rows])
    parts = [(f"{key}/{label}", sub) for label, sub in groups] or [(key, table)]
    if groups and pooled:
        parts.append((f"{key}/{POOLED}", table))
    if groups:
        console.print(f"{key}: {len(groups)} datasets by {group_by} ({', '.join(g for g, _ in groups)}), each scored "
                      "on its own", markup=False, highlight=False)
    summaries, protocols = [], []
    for name, examples in parts:
        missing = sum(1 for id_ in examples.column("id").to_pylist() if id_ not in predicted)
        examples = examples.set_column(0, "dataset", pa.array([name] * examples.num_rows, pa.string()))
        protocol = predictions_protocol(path, name, qa_path)
        folder = dataset_dir(out, name)
        write_artifact(examples, folder / "predictions.examples.parquet", EVAL_EXAMPLE, config, protocol.as_dict())
        summary = {**summarize(examples, name, "predictions", "-", missing=missing), **protocol.as_dict()}
        write_artifact([summary], folder / "predictions.summary.parquet", EVAL_SUMMARY, config, protocol.as_dict())
        summaries.append(summary)
        protocols.append(protocol)
    print_summaries(summaries, protocols)
    return summaries


# ----------------------------------------------------------------------------- reporting


def print_summaries(summaries: Sequence[dict[str, Any]], protocols: Sequence[Protocol] = ()) -> None:
    """The table, then one protocol line per distinct protocol (a subset is marked in n)."""
    if not summaries:
        return
    table = Table(title="zsearch eval")
    audited = any(s.get("audit_answerable") is not None for s in summaries)  # `zsearch audit`: the ceiling
    for col in ("dataset", "method", "n", "missing", "EM", *(("ceiling", f"R@{summaries[0].get('topk')}") if audited
                                                             else ()), "F1", "subEM",
                "answered", "searches", "turns"):
        # fold, never cut with an ellipsis: a dataset key must stay readable in a narrow terminal
        table.add_column(col, justify="left" if col in ("dataset", "method") else "right", overflow="fold")
    for s in summaries:
        n = f"{s['n']}" + ("" if s.get("full_set", True) else f" (--limit {s.get('limit')})")
        ceiling = [f"{v:.3f}" if v is not None else "-" for v in (s.get("audit_answerable"), s.get("audit_recall"))]
        table.add_row(s["dataset"], s["method"], n, str(s.get("missing", 0)), f"{s['em']:.3f}",
                      *(ceiling if audited else ()), f"{s['f1']:.3f}",
                      f"{s['subem']:.3f}", f"{s['answered']:.2f}", f"{s['avg_searches']:.2f}", f"{s['avg_turns']:.2f}")
    stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)  # a log: 140, not 80, columns
    stdout.print(table)
    lines = []
    for p in protocols:
        if p.decoding == "unknown":
            line = (f"protocol: predictions scored with metric {p.metric_version}; model, retriever and decoding "
                    "unknown (another system's output)")
        else:
            line = p.one_line()
        if line not in lines:
            lines.append(line)
    for line in lines:
        stdout.print(line, markup=False, highlight=False)


def plot_em(out: Path) -> Path | None:
    """A bar chart of EM per dataset, one bar per method, from every summary under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [read_artifact(p, EVAL_SUMMARY).to_pylist()[0] for p in sorted(out.rglob("*.summary.parquet"))]
    if not rows:
        return None
    datasets = sorted({r["dataset"] for r in rows})
    methods = sorted({r["method"] for r in rows})
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(datasets) * len(methods)), 3.5))
    for j, m in enumerate(methods):
        em = {r["dataset"]: r["em"] for r in rows if r["method"] == m}
        xs = [i + j * width for i in range(len(datasets))]
        color = f"C{j % 10}"
        # The edge draws a zero-height bar as a line at 0: an all-zero result shows its bars.
        bars = ax.bar(xs, [em.get(d, 0.0) for d in datasets], width=width, label=m, color=color,
                      edgecolor=color, linewidth=2)
        ax.bar_label(bars, labels=[f"{em[d]:.3f}" if d in em else "" for d in datasets], fontsize=8, padding=2)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("EM")
    ax.set_ylim(0, 1.1)  # room for the value labels above a bar at 1.0
    ax.legend()
    fig.tight_layout()
    path = out / "em.png"
    tmp = out / ".em.png.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
