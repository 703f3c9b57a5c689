"""``zsearch simsft``: fine-tune the ZeroSearch simulator on judged query-document rows (§3.3).

Each JUDGMENT row (``zsearch judge``) becomes one SFT_EXAMPLE:

* **prompt**: exactly the Table 2 prompt, :func:`~zsearch_cli.prompts.render_simulator_prompt`,
  with the judge's label as the quality word (``useful``/``noisy``, "Useful/Noisy Output:")
  and **the row's own** question and first gold answer, as the simulator is asked in
  rollout. Rows whose label is null (the judge's output did not parse) are skipped.
* **completion**: the row's documents as ``"\\nDoc 1: …\\nDoc 2: …"``, one line per
  document, at most five (Table 2 asks for five; fewer when the engine returned fewer).
  ZeroSearch's documents are ~30-word snippets without titles (paper Table 10), so by
  default each document is its text only, whitespace flattened, cut to ``doc_words``
  words; that also keeps five documents inside the served simulator's ``max_tokens``
  budget (``SimConfig.max_tokens`` = 320). ``titles`` prefixes "Title: ".
  The completion starts with a newline because the prompt ends at "Output:".

Every completion is checked to parse back (``search.sim_text.parse_documents``) into
exactly its documents; a row that would not (a document containing a "Doc 3." marker, say)
is skipped and counted, so the model never learns a format the parser misreads.

The model is then trained by the generic SFT trainer on the raw prompt text, without a
chat template (``SIM_CHAT_TEMPLATE`` is False: the ``sft`` simulator sends the raw prompt),
at the paper's lr 1e-6, and OUT/final is served with ``--search sim:OUT/final`` or
``vllm serve OUT/final`` + ``--search sim+http://HOST:PORT/v1``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from zsearch_cli.errors import ZsearchError
from zsearch_cli.prompts import SIMULATOR_QUALITIES, render_simulator_prompt
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import JUDGMENT, SFT_EXAMPLE
from zsearch_cli.search.sim_text import SFT_DOCS, SIM_CHAT_TEMPLATE, parse_documents
from zsearch_cli.train.sft_config import SFTConfig

console = Console(stderr=True)

SFT_SET_FILE = "sim_sft.parquet"
MAX_DOC_CHARS = 800
"""``SimConfig.max_doc_chars``: the parser cuts longer documents, so targets stay below it."""
_STRIP = " *-•"
"""Characters the parser strips from a document's ends (``sim_text._clean``)."""


def flatten_document(doc: str, titles: bool = False, doc_words: int = 30, max_chars: int = MAX_DOC_CHARS) -> str:
    """One line of document text from a stored ``"title\\ntext"`` string: the text (with
    ``titles``: "title: text"), whitespace collapsed, at most ``doc_words`` words (0 = all)
    and ``max_chars`` characters (cut at a word boundary)."""
    title, sep, text = doc.partition("\n")
    if not sep:
        title, text = "", doc
    title, text = " ".join(title.split()), " ".join(text.split())
    line = f"{title}: {text}" if titles and title and text else (text or (title if titles else ""))
    words = line.split()
    if doc_words > 0:
        words = words[:doc_words]
    line = " ".join(words).strip(_STRIP)
    while len(line) > max_chars:
        cut = line[:max_chars]
        line = (cut[: cut.rfind(" ")] if " " in cut else cut).rstrip(" ,;:").strip(_STRIP)
    return line


def render_documents(docs: Sequence[str]) -> str:
    """The completion: ``"\\nDoc 1: …\\nDoc 2: …"``, one line per document."""
    return "".join(f"\nDoc {i}: {d}" for i, d in enumerate(docs, start=1))


def build_example(row: dict[str, Any], titles: bool = False, doc_words: int = 30) -> tuple[dict[str, Any] | None, str]:
    """(SFT_EXAMPLE row, "ok") for one JUDGMENT row, or (None, why it was skipped)."""
    label = row.get("label")
    if label is None:
        return None, "null label"
    if label not in SIMULATOR_QUALITIES:
        return None, f"label {label!r}"
    answers = row.get("golden_answers") or []
    if not answers:
        return None, "no gold answer"
    docs = [flatten_document(d, titles, doc_words) for d in row.get("documents") or [] if d]
    docs = [d for d in docs if any(ch.isalnum() for ch in d)][:SFT_DOCS]
    if not docs:
        return None, "no documents"
    completion = render_documents(docs)
    if parse_documents(completion, SFT_DOCS, MAX_DOC_CHARS) != docs:
        return None, "documents do not parse back"
    prompt = render_simulator_prompt(label, row["question"], answers[0], row["query"])
    metadata = {"source": "simsft", "label": label, "query": row["query"], "row_id": row.get("row_id"),
                "trajectory_id": row.get("trajectory_id"), "n_docs": len(docs)}
    return {"id": row["id"], "prompt": prompt, "completion": completion,
            "metadata": json.dumps(metadata, ensure_ascii=False, sort_keys=True)}, "ok"


def build_sft_set(rows: Sequence[dict[str, Any]], *, balance: bool = False, seed: int = 0, titles: bool = False,
                  doc_words: int = 30) -> tuple[list[dict[str, Any]], Counter]:
    """SFT_EXAMPLE rows for JUDGMENT ``rows`` and the count of every reason a row was skipped
    (``balance``: equal useful/noisy, the majority downsampled as ``zsearch judge --balance``)."""
    skipped: Counter = Counter()
    usable = []
    for row in rows:
        example, why = build_example(row, titles, doc_words)
        if example is None:
            skipped[why] += 1
        else:
            usable.append((row, example))
    if balance:
        from zsearch_cli.commands.judge import balance as balance_rows

        keep = {r["id"] for r in balance_rows([r for r, _ in usable], seed)}
        skipped["balanced away"] += len(usable) - len(keep)
        usable = [(r, e) for r, e in usable if r["id"] in keep]
    return [e for _, e in usable], skipped


def simsft(judgments: Path, cfg: SFTConfig, config: dict[str, Any], *, balance: bool = False, titles: bool = False,
           doc_words: int = 30) -> Path:
    """Build OUT/sim_sft.parquet from ``judgments`` and train ``cfg`` (an SFTConfig, whose
    ``data`` is set here) on it; returns OUT/final."""
    from zsearch_cli.train.sft import run_sft

    if doc_words < 0:
        raise ZsearchError(f"--doc-words must be >= 0, got {doc_words}")
    rows = read_artifact(judgments, JUDGMENT).to_pylist()
    examples, skipped = build_sft_set(rows, balance=balance, seed=cfg.seed, titles=titles, doc_words=doc_words)
    labels = Counter(json.loads(e["metadata"])["label"] for e in examples)
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "none"
    console.print(f"simsft: {len(rows)} judged rows -> {len(examples)} examples ({labels['useful']} useful, "
                  f"{labels['noisy']} noisy); skipped: {reasons}", highlight=False)
    if not examples:
        raise ZsearchError(f"{judgments}: no usable rows (every row was skipped: {reasons})")
    out = Path(cfg.run.out)
    data = write_artifact(examples, out / SFT_SET_FILE, SFT_EXAMPLE, {**config, "skipped": dict(skipped)})
    cfg = SFTConfig.from_dict({**cfg.to_dict(), "data": str(data), "chat_template": SIM_CHAT_TEMPLATE})
    final = run_sft(cfg, console=console)
    serve = final / "merged" if cfg.optim.lora_r > 0 and (final / "merged").is_dir() else final
    console.print(
        f"simulator written to {final}. Use it in rollouts (topk <= {SFT_DOCS}):\n"
        f"  in-process:  zsearch train --search sim:{final} --topk {SFT_DOCS} ...\n"
        f"  served:      vllm serve {serve}   then   --search sim+http://localhost:8000/v1\n"
        f"  check by eye: zsearch search --search sim:{final} \"QUERY\" --question \"…\" --answer \"…\" "
        f"--quality useful", highlight=False, soft_wrap=True)
    return final
