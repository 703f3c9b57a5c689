"""Does the simulator's prompt word switch what it writes? (ZeroSearch §3.3, Table 2.)

The paper's claim: after its fine-tune, the simulation LLM writes useful or noisy documents on
demand, "by adjusting a few words in the prompt". Measured here on held-out queries, each
simulated twice through the same :class:`~zsearch_cli.search.simulated.SimulatedSearch` path a
training rollout takes, once with the word forced to ``useful`` and once to ``noisy``:

- **U**: the share of the documents written under the useful prompt that hold a gold answer;
- **N**: the same under the noisy prompt;
- **U − N**: the switch (Table 10: "the useful outputs consistently contain the correct
  answer, while the noisy outputs fail to do so").

The documents are the ``topk`` the policy would see, padding included: a simulator that writes
nothing parseable hands the policy placeholders, and those hold no answer. Containment is the
project's one test (:mod:`zsearch_cli.audit.answers`). The per-query share (any document holds
an answer) is reported beside it.

The held-out queries are the ones an agent sent in a real-search eval of held-out questions
(its first query per question; the question itself where it did not search), so they are the
queries a policy writes, on questions the simulator was never fine-tuned on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from zsearch_cli.audit.answers import text_holds_any
from zsearch_cli.errors import ZsearchError
from zsearch_cli.search.base import SearchRequest
from zsearch_cli.search.sim_text import PLACEHOLDER_DOC

QUALITIES = ("useful", "noisy")
CHUNK = 16
"""Queries per simulator call: one progress line each, and a bounded batch on CPU."""


def first_query(turn_log: str | None) -> str | None:
    """The first query a search turn of an eval example's JSON turn log ran, if any."""
    for turn in json.loads(turn_log or "[]"):
        if turn.get("doc_ids") and turn.get("queries"):
            return str(turn["queries"][0])
    return None


def heldout_requests(eval_dir: Path, limit: int | None = None) -> list[SearchRequest]:
    """One request per question of the agent eval in ``eval_dir`` (one dataset), in its order:
    the agent's first query, or the question where it did not search."""
    import pyarrow.parquet as pq

    found = sorted(eval_dir.rglob("agent.examples.parquet"))
    if len(found) != 1:
        raise ZsearchError(f"{eval_dir}: expected one agent.examples.parquet, found {len(found)}")
    rows = pq.read_table(found[0], columns=["id", "question", "golden_answers", "turn_log"]).to_pylist()
    requests = [SearchRequest(query=first_query(r["turn_log"]) or r["question"], row_id=r["id"], question=r["question"],
                              golden_answers=tuple(r["golden_answers"] or ())) for r in rows if r["golden_answers"]]
    return requests[:limit] if limit is not None else requests


def measure(search: Any, requests: Sequence[SearchRequest], topk: int, log: Any = sys.stderr) -> list[dict[str, Any]]:
    """SIM_CONTROL rows: each request simulated under each quality (``search.simulate`` with the
    quality forced), ``CHUNK`` queries a call, a progress line per call on ``log``."""
    rows: list[dict[str, Any]] = []
    for quality in QUALITIES:
        for start in range(0, len(requests), CHUNK):
            chunk = list(requests[start:start + CHUNK])
            for r, res in zip(chunk, search.simulate(chunk, topk, [quality] * len(chunk)), strict=True):
                docs = [p.text for p in res.passages]
                rows.append({"id": f"{r.row_id}/{quality}", "row_id": r.row_id, "quality": quality,
                             "question": r.question, "golden_answers": list(r.golden_answers), "query": r.query,
                             "documents": docs,
                             "has_answer": [d != PLACEHOLDER_DOC and text_holds_any([d], r.golden_answers) for d in docs],
                             "padded": bool(res.log.get("padded")), "raw": res.log.get("raw"),
                             "simulator": getattr(search, "name", "sim")})
            done = sum(1 for row in rows if row["quality"] == quality)
            print(f"control: {quality} {done}/{len(requests)} queries", file=log, flush=True)
    return rows


def shares(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """U, N and U − N over the documents; the per-query shares (``*_any``); the padded share."""
    out: dict[str, Any] = {}
    for quality, key in zip(QUALITIES, ("u", "n")):
        mine = [r for r in rows if r["quality"] == quality]
        docs = [h for r in mine for h in r["has_answer"]]
        out[key] = sum(docs) / len(docs) if docs else float("nan")
        out[f"{key}_any"] = sum(any(r["has_answer"]) for r in mine) / len(mine) if mine else float("nan")
        out[f"{key}_padded"] = sum(r["padded"] for r in mine) / len(mine) if mine else float("nan")
    out["gap"] = out["u"] - out["n"]
    out["queries"] = len({r["row_id"] for r in rows})
    return out
