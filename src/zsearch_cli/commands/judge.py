"""``zsearch judge``: label each collected query-documents pair ``useful`` or ``noisy``
with an LLM judge (ZeroSearch §3.3), the labels of the simulator's fine-tuning data.

The judge is a local model (HF or vLLM, greedy, chat template), any OpenAI-compatible
endpoint, or a rule (``--judge-model rule:answer``, :mod:`zsearch_cli.commands.judge_rules`:
a gold answer in the documents, the stand-in for a large judge on a CPU box). A model sees
the question, the gold answers, the query and the documents (the prompt and its rationale
are in :mod:`zsearch_cli.prompts.judge`) and must reply ``Verdict: yes`` or ``Verdict: no``. Outputs that do not parse are kept with a null label and the reason,
and counted in the summary; they are never guessed into a label.

``judgments.parquet`` is rewritten atomically after every batch, so a re-run resumes.
``--balance`` also writes ``judgments.balanced.parquet``: every row of the minority label
and an equal-size seeded sample of the majority one, unparseable rows left out (the
authors trained on a useful/noisy-balanced set).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from zsearch_cli.config.fields import check_options
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import progress_bar
from zsearch_cli.config.commands import JudgeOptions
from zsearch_cli.commands.judge_rules import is_rule, rule_judge
from zsearch_cli.prompts.judge import (JUDGE_PROMPT_VERSION, LABELS, VERDICT_PREFILL, build_judge_prompt,
                                       parse_verdict)
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, JUDGMENT

console = Console(stderr=True)

JUDGMENTS_FILE = "judgments.parquet"
BALANCED_FILE = "judgments.balanced.parquet"

JudgeFn = Callable[[Sequence[str], Sequence[dict[str, Any]]], list[str]]
"""Prompts (user messages) and their query rows in, raw judge texts out, in order (a model
reads the prompts, a rule the rows)."""


# ----------------------------------------------------------------------------- judges


def endpoint_judge(opts: JudgeOptions) -> JudgeFn:
    """Greedy requests to an OpenAI-compatible endpoint, ``concurrency`` at a time."""
    from zsearch_cli.llm_client import LLMClient

    assert opts.judge_url is not None
    client = LLMClient(opts.judge_url, opts.judge_model, api=opts.judge_api, timeout=opts.timeout,
                       retries=opts.retries, concurrency=opts.concurrency)
    return lambda prompts, rows: client.complete(prompts, max_tokens=opts.max_new_tokens, temperature=0.0)


def local_judge(opts: JudgeOptions) -> JudgeFn:
    """Greedy generation with a local model, the prompt wrapped in its chat template (with
    ``--prefill-verdict``, the reply started with :data:`VERDICT_PREFILL`, which the recorded
    output then starts with too, so the parser reads what the judge was made to say)."""
    from zsearch_cli.models.base import SamplingParams
    from zsearch_cli.models.loading import apply_chat
    from zsearch_cli.models.factory import load_backend

    backend = load_backend(opts.judge_model, backend=opts.runtime.backend, device=opts.runtime.device)
    tokenizer = backend.tokenizer
    model = getattr(backend, "model", None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    params = SamplingParams(max_new_tokens=opts.max_new_tokens, temperature=0.0, seed=0)
    prefill = VERDICT_PREFILL if opts.prefill_verdict else ""
    prefill_ids = list(tokenizer.encode(prefill, add_special_tokens=False)) if prefill else []

    def run(prompts: Sequence[str], rows: Sequence[dict[str, Any]] = ()) -> list[str]:
        ids = [apply_chat(tokenizer, p) + prefill_ids for p in prompts]
        for p in ids:
            if limit is not None and len(p) + opts.max_new_tokens > limit:
                raise ZsearchError(f"a judge prompt is {len(p)} tokens; with --max-new-tokens {opts.max_new_tokens} "
                                   f"it exceeds {opts.judge_model}'s {limit}-token context")
        outs = backend.generate(ids, params)
        return [prefill + tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs]

    return run


def make_judge(opts: JudgeOptions) -> tuple[JudgeFn, str]:
    """The judge function and the model id recorded in each row."""
    if not opts.judge_model.strip():
        raise ZsearchError("--judge-model is required (a local model, or the endpoint's model name)")
    if opts.prefill_verdict and (opts.judge_url or is_rule(opts.judge_model)):
        raise ZsearchError("--prefill-verdict starts a local model's reply; an endpoint's chat API cannot, "
                           "and a rule judge writes no reply")
    if is_rule(opts.judge_model):
        if opts.judge_url:
            raise ZsearchError(f"--judge-model {opts.judge_model.strip()} is a rule: it needs no --judge-url")
        rule = rule_judge(opts.judge_model)
        return (lambda prompts, rows: rule(rows)), opts.judge_model.strip()
    if opts.judge_url:
        return endpoint_judge(opts), opts.judge_model
    return local_judge(opts), opts.judge_model


# ----------------------------------------------------------------------------- rows and labels


def judgment_row(query_row: dict[str, Any], output: str, judge_model: str) -> dict[str, Any]:
    """A query row plus the judge's verdict. An unparseable output gets label None."""
    verdict, error = parse_verdict(output)
    return {
        **{k: query_row[k] for k in COLLECTED_QUERY.schema.names},
        "label": LABELS[verdict] if verdict is not None else None,
        "parse_ok": verdict is not None,
        "parse_error": error,
        "judge_output": output,
        "judge_model": judge_model,
    }


def label_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """``{"useful", "noisy", "unparseable"}`` counts."""
    counts = {"useful": 0, "noisy": 0, "unparseable": 0}
    for r in rows:
        counts[r["label"] if r["label"] is not None else "unparseable"] += 1
    return counts


def balance(rows: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Equal numbers of useful and noisy rows: the minority label whole, the majority
    downsampled with ``random.Random(seed)``; row order kept; unparseable rows dropped."""
    useful = [i for i, r in enumerate(rows) if r["label"] == "useful"]
    noisy = [i for i, r in enumerate(rows) if r["label"] == "noisy"]
    n = min(len(useful), len(noisy))
    rng = random.Random(seed)
    keep = set(rng.sample(useful, n)) | set(rng.sample(noisy, n))
    return [r for i, r in enumerate(rows) if i in keep]


# ----------------------------------------------------------------------------- the stage


def _load_previous(path: Path, judge_model: str, prefill: bool = False) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    before = read_metadata(path).get("config", {})
    if bool(before.get("prefill_verdict", False)) != prefill:
        raise ZsearchError(f"{path}: was judged {'with' if not prefill else 'without'} --prefill-verdict, this run "
                           f"{'uses' if prefill else 'does not use'} it; use another --out, or the same setting to resume")
    if before.get("judge_model") not in (None, judge_model):
        raise ZsearchError(f"{path}: was judged by {before['judge_model']!r}, this run uses {judge_model!r}; "
                           "use another --out, or the same judge to resume")
    if before.get("judge_prompt_version") not in (None, JUDGE_PROMPT_VERSION):
        raise ZsearchError(f"{path}: was judged with prompt {before['judge_prompt_version']!r}, this zsearch has "
                           f"{JUDGE_PROMPT_VERSION!r}; use another --out")
    return read_artifact(path, JUDGMENT).to_pylist()


def judge(opts: JudgeOptions, config: dict[str, Any]) -> dict[str, Any]:
    """Judge (or resume judging) every query row; returns label counts (and balanced counts)."""
    check_options(opts)  # the declared ranges and choices: the same check as the command line's
    queries = read_artifact(opts.queries, COLLECTED_QUERY)  # validate before loading a model
    if opts.limit is not None:
        queries = queries.slice(0, opts.limit)
    config = {**config, "judge_prompt_version": JUDGE_PROMPT_VERSION}
    out_path = opts.out / JUDGMENTS_FILE
    rows = _load_previous(out_path, opts.judge_model, opts.prefill_verdict)
    done = {r["id"] for r in rows}
    todo = [q for q in queries.to_pylist() if q["id"] not in done]
    if done:
        console.print(f"[dim]{len(done)} query rows already judged, {len(todo)} to go[/]")
    if todo:
        judge_fn, model_id = make_judge(opts)
        with progress_bar(TextColumn("judge"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as bar:
            task = bar.add_task("judge", total=len(todo))
            for start in range(0, len(todo), opts.batch_size):
                batch = todo[start : start + opts.batch_size]
                prompts = [build_judge_prompt(q["question"], q["golden_answers"], q["query"], q["documents"])
                           for q in batch]
                outputs = judge_fn(prompts, batch)
                rows += [judgment_row(q, text, model_id) for q, text in zip(batch, outputs, strict=True)]
                write_artifact(rows, out_path, JUDGMENT, config)  # after every batch: resumable
                bar.advance(task, len(batch))
    result: dict[str, Any] = {"counts": label_counts(rows)}
    print_counts(result["counts"], f"zsearch judge → {out_path}")
    if opts.balance:
        balanced = balance(rows, opts.seed)
        write_artifact(balanced, opts.out / BALANCED_FILE, JUDGMENT, {**config, "balanced": True})
        result["balanced"] = label_counts(balanced)
        print_counts(result["balanced"], f"balanced → {opts.out / BALANCED_FILE}")
        if not balanced:
            console.print("[yellow]warning:[/] one label has no rows, so the balanced set is empty")
    return result


def print_counts(counts: dict[str, int], title: str) -> None:
    """The label balance as a table: count and share of useful, noisy, unparseable."""
    total = sum(counts.values())
    table = Table(title=title)
    table.add_column("label")
    table.add_column("rows", justify="right")
    table.add_column("share", justify="right")
    for label in ("useful", "noisy", "unparseable"):
        share = counts[label] / total if total else 0.0
        table.add_row(label, str(counts[label]), f"{share:.1%}")
    table.add_row("total", str(total), "100.0%" if total else "-", style="bold")
    Console().print(table)
    if counts["unparseable"]:
        console.print(f"[yellow]warning:[/] {counts['unparseable']} judge outputs did not parse "
                      "(label null; see parse_error and judge_output)")
