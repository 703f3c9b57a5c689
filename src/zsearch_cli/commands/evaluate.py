"""``zsearch eval``: EM / F1 / subEM of a model per dataset (a predictions file is scored by
``eval_predictions.py``; the table and the plot are ``eval_report.py``'s).

Methods, the baselines the papers report:
- ``direct``: answer from the model's own knowledge, no retrieval;
- ``cot``: reason in ``<think>`` first, then answer, no retrieval;
- ``rag``: retrieve top-k for the question once, put the passages in the prompt, answer;
- ``agent``: the multi-turn search engine loop (the default).

No example is ever dropped (Search-R1's ``drop_last`` loses the tail of the test set),
and a re-run skips the examples already scored, so an interrupted eval resumes.

The datasets ``--datasets`` names are resolved by ``data/datasets.py`` (keys, ``--group-by``
splits, ``--pooled``); each is written under OUT/KEY/ (:func:`dataset_dir` keeps every write
inside ``--out``). KEY/pooled is built from the rows of the datasets it pools, so no question
is rolled out twice and a resumed eval rebuilds it from rows already written. Rows already in
OUT are reused only when every option that changes a result and the protocol
(:mod:`zsearch_cli.protocol`: model weights, corpus, retriever, prompt, metric, QA file)
equal the saved ones; the options that may differ are those marked
``execution`` on their fields (which rows, where, how batched). Otherwise the run is refused
in one line naming what differs.

Over two or more datasets, each method also gets both averages, labelled (``avg (plain)``,
``avg (weighted by n)``; :mod:`zsearch_cli.averages`), printed under the table and written to
OUT/METHOD.averages.summary.parquet.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from zsearch_cli.averages import average_rows, write_averages
from zsearch_cli.commands.eval_report import console, plot_em, print_summaries
from zsearch_cli.config.commands import EvalOptions
from zsearch_cli.config.fields import check_options, execution_options, to_flat
from zsearch_cli.data.datasets import DatasetInput, dataset_files, split_by_group
from zsearch_cli.data.qa import load_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import ProgressLines, Stopped, active_stop, heartbeat, progress_bar
from zsearch_cli.prompts.baselines import COT_PROMPT, DIRECT_PROMPT, RAG_PROMPT
from zsearch_cli.protocol import RESUME_FIELDS, Protocol, build_protocol, differing, file_fingerprint
from zsearch_cli.artifacts import read_artifact, read_metadata, rows_to_table, write_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY
from zsearch_cli.scoring import dataset_dir, example_rows, summarize


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
    changed = differing(meta.get("config", {}), config, execution_options(EvalOptions))
    # options already compared above (model, topk, seed, ...) are not listed twice
    changed += differing(meta["protocol"], {k: now[k] for k in RESUME_FIELDS}, set(config))
    if changed:
        raise ZsearchError(f"{path}: holds rows of another eval ({', '.join(changed)}); rows are reused only "
                           "when every option that changes a result is equal: choose another --out, or delete "
                           "that file to score again")


def pooled_rows(key: str, file_qa: Any, members: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """KEY/pooled's rows: its members' rows (each question of the file once, as its own
    dataset scored it), relabelled ``key``, in the file's order. Their means are the whole
    file's, and no question is rolled out a second time (issue 36.11)."""
    order = {id_: i for i, id_ in enumerate(file_qa.column("id").to_pylist())}
    return sorted(({**row, "dataset": key} for rows in members for row in rows), key=lambda row: order[row["id"]])


def _roll_out(opts: EvalOptions, config: dict[str, Any], engine_for: Callable[[], Any], name: str, method: str,
              label: str, qa: Any, out_examples: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Score every question of ``qa`` not yet in ``out_examples`` (written after every batch,
    so a stopped eval resumes); returns the rows of ``qa``, in its order. ``engine_for()``
    is called only when a question is left: a finished eval run again loads no model."""
    from zsearch_cli.rollout.engine import QARow

    stop = active_stop()  # zsearch eval: SIGTERM / SIGINT raise Stopped at once; written rows stay
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

    written = len(scored())
    engine = engine_for() if todo else None
    lines = ProgressLines(label, qa.num_rows, "questions", done=written)  # plain lines in a log file
    try:
        with progress_bar(TextColumn(f"eval {name} ({method})"), BarColumn(), MofNCompleteColumn(),
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
    # Exactly the rows asked for now (an earlier, larger --limit may have scored more), in
    # the QA file's order.
    by_id = {r["id"]: r for r in done_rows}
    return [by_id[i] for i in qa.column("id").to_pylist()]


def evaluate(opts: EvalOptions, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every dataset (under each ``--probe``: audit/probe_eval.py), resuming from earlier
    partial outputs of the same protocol; returns the summaries (each with its protocol columns).
    KEY/pooled is built from the rows of the datasets it pools, after them."""
    from zsearch_cli.audit.probe_eval import ProbePlan

    check_options(opts)  # the declared ranges and choices (--method ...): the command line's check
    plan = ProbePlan(opts)
    files = dataset_files(opts.data.datasets, opts.data.data_dir, opts.data.download)
    # validate everything before loading a model
    qa_tables, notes = split_by_group([(d, load_qa(d.path)) for d in files], opts.data.group_by, opts.pooled)
    for line in notes:
        console.print(line, markup=False, highlight=False)
    protocols = {d.key: eval_protocol(opts, d, qa.num_rows) for d, qa in qa_tables}
    for d, _ in qa_tables:  # --limit applies per pooled dataset: the pool is whole when each of them is
        if d.pools:
            protocols[d.key] = dataclasses.replace(protocols[d.key],
                                                   full_set=all(protocols[k].full_set for k in d.pools))
    # a pooled input keeps the whole file: only its order is read
    qa_tables = [(d, qa.slice(0, opts.limit) if opts.limit is not None and not d.pools else qa)
                 for d, qa in qa_tables]
    for d, qa in qa_tables:  # the matching audit, and each probe's rows of an earlier run
        if d.pools:  # nothing rolled out to reuse (its rows are rebuilt), and the audit is per dataset
            continue
        for existing, protocol in plan.prepare(opts.out, d.key, protocols[d.key], qa.column("id").to_pylist()):
            check_reusable(existing, config, protocol)
    from zsearch_cli.models.loading import check_model_early

    check_model_early(opts.policy.model)  # the files, after the cheap checks, before the loading line (issue 36.7)
    @functools.cache
    def loaded() -> tuple[Any, Any]:  # (engine, search), built on the first question left to score
        with heartbeat("eval", f"loading {opts.policy.model}"):
            return _build_engine(opts)

    def engine_for(probe: str, name: str) -> Any:
        engine, search = loaded()
        engine.search = plan.backend(probe, search, name)
        return engine

    summaries = []
    rolled_out = [d.key for d, _ in qa_tables if not d.pools]
    rows_of: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (probe, key): for the pooled inputs after them
    for probe, (d, qa) in [(p, dq) for p in plan.probes for dq in qa_tables]:
        name, protocol, method = d.key, plan.protocol(probe, protocols[d.key]), plan.label(probe)
        record = plan.protocol_record(name, protocol)
        out_examples = dataset_dir(opts.out, name) / f"{method}.examples.parquet"
        if d.pools:
            rows = pooled_rows(name, qa, [rows_of[(probe, key)] for key in d.pools])
            if rows:
                write_artifact(rows, out_examples, EVAL_EXAMPLE, config, record)
        else:
            k = rolled_out.index(name) + 1
            label = f"eval {name} ({method}" + (f", dataset {k}/{len(rolled_out)})" if len(rolled_out) > 1 else ")")
            rows = _roll_out(opts, config, functools.partial(engine_for, probe, name), name, method, label, qa,
                             out_examples, record)
        rows_of[(probe, name)] = rows
        if not rows:
            continue
        examples = rows_to_table(rows, EVAL_EXAMPLE, out_examples)
        summary = {**summarize(examples, name, method, opts.policy.model), **protocol.as_dict(),
                   **plan.ceiling_columns(name)}
        write_artifact([summary], out_examples.with_name(f"{method}.summary.parquet"), EVAL_SUMMARY, config, record)
        summaries.append(summary)
        plan.add(probe, name, summary, rows)
    # both averages, labelled, per method: a KEY/pooled row would count its questions twice
    averages = average_rows(summaries, leave_out={d.key for d, _ in qa_tables if d.pools})
    write_averages(opts.out, averages, config)
    print_summaries(summaries, [protocols[s["dataset"]] for s in summaries], averages)
    plan.report(opts.out, config)
    plot_em(opts.out)
    return summaries
