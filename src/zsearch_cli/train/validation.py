"""Validation during ``zsearch train``: greedy rollouts of the current policy on a held-out QA
file, against a **real** search engine, scored by ``zsearch eval``'s own code.

Why a real engine: with ``--search sim:…`` the training reward is earned on documents the
simulator wrote (and made noisy on purpose), so whether the policy learned to search shows
only against real retrieval. The validation backend is ``--val-search`` (default: bm25 over
``--index``); a simulator there must be asked for with ``--val-allow-sim``.

Cheap by construction: one greedy sample per question, the trainer's own generation backend
(the HF backend shares the policy's weights; vLLM is synced after every update), the training
rollout limits, and at most ``--val-limit`` questions. Each validation writes
OUT/val/step-N.examples.parquet (EVAL_EXAMPLE) and returns ``val/em``, ``val/f1``,
``val/subem`` (and ``time/val``) for the step's metrics row.

A validation file that holds several ``data_source`` values (Search-R1's merged test file)
is still validated in one pass, and ``val/em`` is the pooled mean over its questions, i.e.
``avg (weighted by n)`` (zsearch_cli/averages.py), as the start-up line says; ``val/em_plain``
is ``avg (plain)``, each source counted once. Each example's ``dataset`` is then NAME/SOURCE,
and OUT/val/step-N.summary.parquet holds one EVAL_SUMMARY row per source, the numbers a
paper's per-dataset table compares with, and the two labelled average rows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from zsearch_cli.averages import PLAIN_LABEL, WEIGHTED_LABEL, average_rows, mean
from zsearch_cli.scoring import evaluate_engine, summarize
from zsearch_cli.rollout.engine import QARow
from zsearch_cli.train.config import TrainConfig, validation_search
from zsearch_cli.train.sampler import load_rows

SCORES = ("em", "f1", "subem")


class Validator:
    """Build with :meth:`from_config` (reads the QA file, before any model loads), then
    :meth:`attach` the trainer's generation backend; :meth:`run` on the steps :meth:`due` picks."""

    def __init__(self, cfg: TrainConfig, rows: list[QARow], sources: dict[str, str] | None = None):
        self.cfg = cfg
        self.rows = rows
        self.dataset = Path(str(cfg.validation.val_data).split(",")[0].strip()).name.split(".")[0]
        self.sources = sources or {}
        """row id -> data_source, when the validation files hold several sources (else empty)."""
        self.engine: Any = None
        self.search: Any = None
        self.accelerator: Any = None
        self.batch_size = 1

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> "Validator | None":
        """None when ``--val-data`` is not set."""
        if not cfg.validation.val_data:
            return None
        rows = load_rows(cfg.validation.val_data)
        rows = rows[: cfg.validation.val_limit] if cfg.validation.val_limit is not None else rows
        return cls(cfg, rows, _sources(cfg.validation.val_data, {r.id for r in rows}))

    def attach(self, generation: Any, train_search: Any, accelerator: Any, batch_size: int) -> None:
        """Greedy engine over ``generation``; the training backend is reused when it is the
        same real engine (a large index is not loaded twice)."""
        from zsearch_cli.rollout.build import build_engine, make_search
        from zsearch_cli.search.factory import is_simulated

        cfg = self.cfg
        spec = validation_search(cfg)
        if spec == cfg.retrieval.search.strip() and not is_simulated(spec):
            self.search = train_search
        else:
            extra = {"seed": cfg.seed} if is_simulated(spec) else {}
            self.search = make_search(cfg, spec, **extra)
        self.engine = build_engine(cfg, backend=generation, search=self.search, temperature=0.0, top_p=1.0)
        self.accelerator = accelerator
        self.batch_size = max(1, batch_size)

    def due(self, step: int) -> bool:
        """After every ``--val-every`` steps, and after the last step (``step`` is 1-based)."""
        every = self.cfg.validation.val_every
        return step == self.cfg.steps or (every > 0 and step % every == 0)

    def run(self, step: int) -> dict[str, float]:
        """Validate the policy as it is after ``step``; each process takes its slice of the
        questions and the sums are added up, so every process returns the same means."""
        t0 = time.perf_counter()
        acc = self.accelerator
        rank, world = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
        self.search.progress(step - 1, self.cfg.steps)
        examples, summary = evaluate_engine(self.engine, self.rows[rank::world], self.dataset, self.cfg.policy.model,
                                            self.batch_size)
        for ex in examples:
            if ex["id"] in self.sources:
                ex["dataset"] = f"{self.dataset}/{self.sources[ex['id']]}"
        totals = [summary[k] * summary["n"] if summary else 0.0 for k in SCORES] + [float(len(examples))]
        labels = sorted(set(self.sources.values()))  # the same on every process: one reduce adds them up
        for source in labels:  # each source's EM sum and count, for the plain mean over sources
            mine = [ex["em"] for ex in examples if self.sources.get(ex["id"]) == source]
            totals += [float(sum(mine)), float(len(mine))]
        if world > 1:
            totals = acc.reduce(torch.tensor(totals, dtype=torch.float64, device=acc.device), "sum").tolist()
        self._write(step, examples, rank, world)
        n = max(totals[len(SCORES)], 1.0)
        out = {f"val/{k}": totals[i] / n for i, k in enumerate(SCORES)}  # pooled: avg (weighted by n)
        per = totals[len(SCORES) + 1:]
        if len(labels) > 1:
            out["val/em_plain"] = mean([per[2 * i] / per[2 * i + 1] for i in range(len(labels))], [1] * len(labels))
        return {**out, "time/val": time.perf_counter() - t0}

    def _write(self, step: int, examples: list[dict[str, Any]], rank: int, world: int) -> None:
        from zsearch_cli.artifacts import rows_to_table, write_artifact
        from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY

        if not examples:
            return
        suffix = f".rank{rank}" if world > 1 else ""
        path = Path(self.cfg.run.out) / "val" / f"step-{step:06d}{suffix}.examples.parquet"
        write_artifact(examples, path, EVAL_EXAMPLE, self.cfg.to_dict())
        if self.sources:  # one summary row per source: the per-dataset numbers
            by_source: dict[str, list[dict[str, Any]]] = {}
            for ex in examples:
                by_source.setdefault(ex["dataset"], []).append(ex)
            summaries = [summarize(rows_to_table(rows, EVAL_EXAMPLE, path), name, "agent", self.cfg.policy.model)
                         for name, rows in by_source.items()]
            write_artifact(summaries + average_rows(summaries),  # both labelled averages over the sources
                           path.with_name(path.name.replace(".examples.", ".summary.")), EVAL_SUMMARY, self.cfg.to_dict())


def _sources(spec: str, ids: set[str]) -> dict[str, str]:
    """row id -> data_source over the validation files, when they hold several sources; a
    line says that ``val/em`` pools them."""
    from zsearch_cli.data.qa import group_labels, load_qa, split_groups

    out: dict[str, str] = {}
    for path in [Path(p.strip()) for p in spec.split(",") if p.strip()]:
        qa = load_qa(path)
        groups = split_groups(qa, group_labels(path, qa, "data_source"))
        for label, sub in groups:
            out.update({i: label for i in sub.column("id").to_pylist() if i in ids})
        if groups:
            print(f"validation: {path} holds {len(groups)} data_source values "
                  f"({', '.join(g for g, _ in groups)}): val/em is their pooled mean, {WEIGHTED_LABEL}; "
                  f"val/em_plain is {PLAIN_LABEL}; per-source scores go to OUT/val/step-N.summary.parquet",
                  flush=True)
    return out
