"""`zsearch simsft`: the exact Table 2 prompt per judged row, "Doc i:" targets that parse
back into the same documents, skipping and balancing, the training ids matching what the
simulator sends, and an end-to-end run through the CLI whose model then serves
`zsearch search --search sim:OUT/final`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.models.base import GenerationOutput
from zsearch_cli.models.loading import load_model, load_tokenizer
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import JUDGMENT, SFT_EXAMPLE
from zsearch_cli.search.base import SearchRequest
from zsearch_cli.search.sim_text import parse_documents
from zsearch_cli.search.simulated import SimConfig, SimulatedSearch
from zsearch_cli.commands.simsft import build_example, build_sft_set, flatten_document
from zsearch_cli.train.sft_data import load_sft_items

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread (see test_sft.py): tiny models, shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _row(i: int, label: str | None, documents: list[str], question: str = "Who wrote Hamlet?",
         answers: tuple[str, ...] = ("William Shakespeare", "Shakespeare"), query: str = "hamlet author") -> dict:
    return {"id": f"r{i}#0/t0/q0", "row_id": f"r{i}", "trajectory_id": f"r{i}#0", "sample_index": 0, "turn": 0,
            "query_index": 0, "question": question, "golden_answers": list(answers), "query": query,
            "doc_ids": [f"d{j}" for j in range(len(documents))], "documents": documents, "prediction": None,
            "correct": False, "label": label, "parse_ok": label is not None,
            "parse_error": None if label is not None else "no verdict", "judge_output": "Verdict: yes",
            "judge_model": "judge"}


DOCS = [
    '"Hamlet"\nHamlet is a tragedy written by William Shakespeare\nsometime between 1599 and 1601.',
    "William Shakespeare\n  Shakespeare was an English playwright,   poet and actor.",
    "\nThe Globe Theatre was a theatre in London associated with Shakespeare.",
    "Elsinore\nKronborg is a castle in Helsingør, the setting of the play.",
    "Danish drama\nA list of plays set in Denmark.",
    "Extra\nA sixth document that is not used.",
]

EXPECTED_USEFUL_PROMPT = (
    "You are the Google search engine.\n"
    "Given a query, you need to generate five useful documents for the query.\n"
    "\n"
    'The user is trying to answer the question: "Who wrote Hamlet?" whose answer is William Shakespeare.\n'
    "Each document should contain about 30 words, and these documents should contain useful information.\n"
    "\n"
    "Query: hamlet author\n"
    "Useful Output:"
)


def test_example_has_the_exact_table2_prompt_and_documents_that_parse_back():
    example, why = build_example(_row(0, "useful", DOCS))
    assert why == "ok" and example["prompt"] == EXPECTED_USEFUL_PROMPT
    assert example["completion"] == (
        "\nDoc 1: Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601."
        "\nDoc 2: Shakespeare was an English playwright, poet and actor."
        "\nDoc 3: The Globe Theatre was a theatre in London associated with Shakespeare."
        "\nDoc 4: Kronborg is a castle in Helsingør, the setting of the play."
        "\nDoc 5: A list of plays set in Denmark.")
    docs = [flatten_document(d) for d in DOCS[:5]]
    assert parse_documents(example["completion"], 5) == docs
    noisy, _ = build_example(_row(1, "noisy", DOCS[:2], question="Q two?", answers=("first", "second"), query="qq"))
    assert "generate five noisy documents" in noisy["prompt"] and "contain noisy information" in noisy["prompt"]
    assert 'question: "Q two?" whose answer is first.\n' in noisy["prompt"]
    assert noisy["prompt"].endswith("Query: qq\nNoisy Output:")
    assert parse_documents(noisy["completion"], 5) == docs[:2]  # fewer than five: what there is
    meta = json.loads(noisy["metadata"])
    assert meta["label"] == "noisy" and meta["n_docs"] == 2


def test_flatten_titles_word_cap_and_skips():
    assert flatten_document("T\na  b\n c", titles=True) == "T: a b c"
    assert flatten_document("no title here") == "no title here"
    long = "Title\n" + " ".join(f"w{i}" for i in range(50))
    assert flatten_document(long).split() == [f"w{i}" for i in range(30)]
    assert len(flatten_document(long, doc_words=0).split()) == 50
    assert build_example(_row(0, None, DOCS)) == (None, "null label")
    assert build_example(_row(0, "useful", DOCS, answers=()))[1] == "no gold answer"
    assert build_example(_row(0, "useful", ["T\n***", ""]))[1] == "no documents"
    marker = build_example(_row(0, "useful", ["T\nSee Doc 3: the sequel."]))
    assert marker == (None, "documents do not parse back")


def test_balance_and_skip_counts():
    rows = [_row(i, "useful", DOCS[:1]) for i in range(3)] + [_row(3, "noisy", DOCS[:1]), _row(4, None, DOCS)]
    examples, skipped = build_sft_set(rows)
    assert len(examples) == 4 and skipped == {"null label": 1}
    balanced, skipped = build_sft_set(rows, balance=True, seed=1)
    labels = sorted(json.loads(e["metadata"])["label"] for e in balanced)
    assert labels == ["noisy", "useful"] and skipped["balanced away"] == 2


class _RecordingGenerator:
    """A generation backend that records the prompt ids it is sent and answers with fixed text."""

    def __init__(self, tokenizer, text: str):
        self.tokenizer, self.text, self.prompts = tokenizer, text, []

    def generate(self, prompts, params, stop=()):
        self.prompts.extend(list(p) for p in prompts)
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        return [GenerationOutput(ids, [0.0] * len(ids), "stop") for _ in prompts]


def test_training_ids_are_exactly_what_the_simulator_sends(tmp_path, tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    example, _ = build_example(_row(0, "useful", DOCS))
    data = write_artifact([example], tmp_path / "sim.parquet", SFT_EXAMPLE)
    items, _ = load_sft_items(data, tok, chat_template=False, max_length=4096)
    gen = _RecordingGenerator(tok, example["completion"])
    sim = SimulatedSearch("unused", SimConfig(temperature=0.0), generator=gen)
    result = sim.simulate([SearchRequest("hamlet author", "r0", "Who wrote Hamlet?", ("William Shakespeare",))], 5,
                          qualities=["useful"])[0]
    sent = gen.prompts[0]
    assert items[0].input_ids[: len(sent)] == sent and all(x == -100 for x in items[0].labels[: len(sent)])
    target = items[0].input_ids[len(sent):]
    assert target == tok.encode(example["completion"], add_special_tokens=False) + [tok.eos_token_id]
    assert [p.text for p in result.passages] == [flatten_document(d) for d in DOCS[:5]] and not result.log["padded"]


def test_cli_simsft_end_to_end_then_search_with_the_simulator(tmp_path, tiny_model_dir):
    rows = [
        _row(0, "useful", DOCS),
        _row(1, "noisy", DOCS[3:], question="Where is Elsinore?", answers=("Helsingør", "Denmark"), query="elsinore"),
        _row(2, None, DOCS),
        _row(3, "useful", DOCS[:2], question="Who played Hamlet?", answers=("Olivier",), query="hamlet actor"),
    ]
    judgments = write_artifact(rows, tmp_path / "judgments.parquet", JUDGMENT)
    out = tmp_path / "sim"
    result = runner.invoke(app, ["simsft", str(judgments), "--model", str(tiny_model_dir), "--out", str(out),
                                 "--device", "cpu", "--max-steps", "3", "--batch-size", "2", "--eval-fraction", "0",
                                 "--lr", "1e-4", "--save-every", "0"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "4 judged rows -> 3 examples (2 useful, 1 noisy); skipped: 1 null label" in result.output
    assert f"--search sim:{out / 'final'}" in result.output and f"vllm serve {out / 'final'}" in result.output

    sft_set = read_artifact(out / "sim_sft.parquet", SFT_EXAMPLE).to_pylist()
    assert [r["id"] for r in sft_set] == [rows[0]["id"], rows[1]["id"], rows[3]["id"]]
    assert sft_set[0]["prompt"] == EXPECTED_USEFUL_PROMPT
    assert 'question: "Where is Elsinore?" whose answer is Helsingør.' in sft_set[1]["prompt"]
    assert sft_set[1]["prompt"].endswith("Query: elsinore\nNoisy Output:")
    assert sft_set[2]["prompt"].endswith("Query: hamlet actor\nUseful Output:")
    for r, src in zip(sft_set, (rows[0], rows[1], rows[3])):
        assert parse_documents(r["completion"], 5) == [flatten_document(d) for d in src["documents"][:5]]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all(m["loss"] > 0 for m in metrics)
    model, _ = load_model(str(out / "final"), device="cpu")
    assert model is not None

    searched = runner.invoke(app, [
        "search", "--search", f"sim:{out / 'final'}?max_tokens=24&device=cpu", "hamlet author",
        "--question", "Who wrote Hamlet?", "--answer", "William Shakespeare", "--quality", "useful",
    ], env={"COLUMNS": "240"})
    assert searched.exit_code == 0, searched.output
    assert "rank" in searched.output  # (the title holds a long tmp path, so it may wrap anywhere)
    assert searched.output.count("│ sim-") == 5  # five rows: parsed documents, padded when the tiny model fails


def test_cli_simsft_rejects_a_file_without_usable_rows(tmp_path, tiny_model_dir):
    judgments = write_artifact([_row(0, None, DOCS)], tmp_path / "j.parquet", JUDGMENT)
    result = runner.invoke(app, ["simsft", str(judgments), "--model", str(tiny_model_dir), "--out",
                                 str(tmp_path / "o"), "--device", "cpu"])
    assert result.exit_code == 2 and "no usable rows" in result.output
    assert not Path(tmp_path / "o" / "final").exists()
