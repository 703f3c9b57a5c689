"""stages/zerosearch-mini.sh (issue 38): the rule judge and the judge's verdict prefill, the
controllability measure, the report's goals, and the recipe end to end at tiny size, where
the report must fail on a planted bug: simsft's useful/noisy prompt words swapped.

The measured run on smollm2 is the README's ("ZeroSearch in miniature")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, JUDGMENT, SFT_EXAMPLE, SIM_CONTROL
from zsearch_cli.train import zerosearch_mini as mini

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
CORPUS = {json.loads(line)["id"]: json.loads(line) for line in
          (REPO / "src" / "zsearch_cli" / "data" / "demo" / "corpus.jsonl").read_text().splitlines()}


def _query(i: int, docs: list[str], golds: list[str]) -> dict:
    return {"id": f"q{i}#0/t0/q0", "row_id": f"q{i}", "trajectory_id": f"q{i}#0", "sample_index": 0, "turn": 0,
            "query_index": 0, "question": f"Question {i}?", "golden_answers": golds, "query": f"query {i}",
            "doc_ids": [f"d{i}.{k}" for k in range(len(docs))], "documents": docs, "prediction": None, "correct": False}


def test_rule_judge_labels_by_a_gold_answer_in_the_documents(tmp_path):
    rows = [_query(0, ["Mona Lisa\nA portrait.", "Paris\nA city."], ["Mona Lisa"]),  # in a title
            _query(1, ["Paris\nThe city.", "Theft\nIt was stolen by Vincenzo Peruggia in 1911."], ["Peruggia"]),
            _query(2, ["Paris\nThe city of 19110 lights."], ["1911"]),  # whole tokens only: no
            _query(3, ["Paris\nThe city."], [])]  # no gold: no verdict, never a guess
    queries = write_artifact(rows, tmp_path / "queries.parquet", COLLECTED_QUERY)
    result = runner.invoke(app, ["judge", str(queries), "--judge-model", "rule:answer", "--out", str(tmp_path / "j")])
    assert result.exit_code == 0, result.output
    judged = read_artifact(tmp_path / "j" / "judgments.parquet", JUDGMENT).to_pylist()
    assert [r["label"] for r in judged] == ["useful", "useful", "noisy", None]
    assert judged[1]["judge_output"] == "rule:answer: Doc 2 holds 'Peruggia'\nVerdict: yes"
    assert judged[2]["judge_output"] == "rule:answer: none of the 1 documents holds a gold answer\nVerdict: no"
    assert {r["judge_model"] for r in judged} == {"rule:answer"} and judged[3]["parse_error"]
    for args, message in ((["--judge-model", "rule:nope"], "rule 'nope' is not a rule judge; use rule:answer"),
                          (["--judge-model", "rule:answer", "--judge-url", "http://127.0.0.1:9/v1"], "needs no --judge-url"),
                          (["--judge-model", "rule:answer", "--prefill-verdict"], "a rule judge writes no reply")):
        result = runner.invoke(app, ["judge", str(queries), *args, "--out", str(tmp_path / "bad")])
        assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


class _ProseJudge:
    """smollm2's real replies to the verdict prompt (issue 38's probe, 10 of 10 like this): prose,
    unless its reply was started with "Verdict:", when it goes on " no" and then prose."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prefill = tokenizer.encode("Verdict:", add_special_tokens=False)

    def generate(self, prompts, params):
        from types import SimpleNamespace

        def reply(ids):
            text = (" no\n\nThe documents do not contain" if ids[-len(self.prefill):] == self.prefill
                    else "The documents do not contain enough information to answer the query.")
            return SimpleNamespace(token_ids=self.tokenizer.encode(text, add_special_tokens=False))

        return [reply(list(p)) for p in prompts]


def test_prefill_verdict_makes_a_prose_judge_give_a_verdict(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    import zsearch_cli.models.factory as factory

    judge = _ProseJudge(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    monkeypatch.setattr(factory, "load_backend", lambda *a, **k: judge)
    queries = write_artifact([_query(i, ["Paris\nThe city."], ["Paris"]) for i in range(2)],
                             tmp_path / "queries.parquet", COLLECTED_QUERY)
    base = ["judge", str(queries), "--judge-model", "smollm2", "--device", "cpu"]
    assert runner.invoke(app, [*base, "--out", str(tmp_path / "prose")]).exit_code == 0
    prose = read_artifact(tmp_path / "prose" / "judgments.parquet", JUDGMENT).to_pylist()
    assert [r["label"] for r in prose] == [None, None]  # the strict parser does not guess from prose
    result = runner.invoke(app, [*base, "--prefill-verdict", "--out", str(tmp_path / "pre")])
    assert result.exit_code == 0, result.output
    pre = read_artifact(tmp_path / "pre" / "judgments.parquet", JUDGMENT).to_pylist()
    assert [(r["label"], r["judge_output"]) for r in pre] == [("noisy", "Verdict: no\n\nThe documents do not contain")] * 2
    # a resume into the other setting would mix two judges in one file
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "pre")])
    assert result.exit_code == 2 and "was judged with --prefill-verdict" in result.output


class _WordSim:
    """A stand-in simulator model: writes the answer under the useful prompt, and under the
    noisy one a document without it, or nothing for the query "silent" (so padding shows)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params):
        from types import SimpleNamespace

        out = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids)
            text = ("" if "Query: silent" in prompt else "\nDoc 1: Paris is the capital.\nDoc 2: Paris, France."
                    if "useful documents" in prompt else "\nDoc 1: Lyon is a city.\nDoc 2: Paris, France.")
            out.append(SimpleNamespace(token_ids=self.tokenizer.encode(text, add_special_tokens=False)))
        return out


def test_controllability_counts_the_documents_the_policy_sees(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from zsearch_cli.audit.controllability import heldout_requests, measure, shares
    from zsearch_cli.search.simulated import SimConfig, SimulatedSearch

    turn = json.dumps([{"turn": 0, "queries": ["capital of france"], "doc_ids": [["d"]]}])
    examples = tmp_path / "eval" / "demo" / "agent.examples.parquet"
    examples.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([
        {"id": "a", "question": "Capital of France?", "golden_answers": ["Paris"], "turn_log": turn},
        {"id": "b", "question": "silent", "golden_answers": ["Paris"], "turn_log": "[]"},  # no search: the question
        {"id": "c", "question": "No gold?", "golden_answers": [], "turn_log": "[]"}]), examples)
    requests = heldout_requests(tmp_path / "eval")
    assert [(r.row_id, r.query) for r in requests] == [("a", "capital of france"), ("b", "silent")]
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    sim = SimulatedSearch("stand-in", SimConfig(temperature=0.0), generator=_WordSim(tok))
    rows = measure(sim, requests, topk=2, log=open(os.devnull, "w"))
    assert [r["id"] for r in rows] == ["a/useful", "b/useful", "a/noisy", "b/noisy"]
    assert [r["has_answer"] for r in rows] == [[True, True], [False, False], [False, True], [False, False]]
    assert rows[1]["padded"] and not rows[0]["padded"]
    s = shares(rows)  # padding counts: the policy sees a placeholder there
    assert (s["u"], s["n"], s["gap"], s["u_any"], s["n_any"], s["queries"]) == (0.5, 0.25, 0.25, 0.5, 0.5, 2)
    write_artifact(rows, tmp_path / "control.parquet", SIM_CONTROL)  # the schema holds them


def test_compare_judges_says_when_agreement_is_chance():
    rule = {str(i): "useful" if i < 6 else "noisy" for i in range(10)}
    always_no = {str(i): "noisy" for i in range(8)} | {"8": None, "9": None}
    c = mini.compare_judges(always_no, rule)
    assert (c["rows"], c["lm_parsed"], c["both"], c["lm_useful"]) == (10, 8, 8, 0.0)
    assert c["agreement"] == pytest.approx(2 / 8) and c["kappa"] == pytest.approx(0.0)
    assert mini.compare_judges({"0": None}, rule)["agreement"] is None


def _finished_run(out: Path, base: tuple[float, float], sim: tuple[float, float], em: tuple[float, float],
                  seconds: float = 600.0) -> Path:
    """A recipe folder with every stage's output: U/N given as shares of 20 one-document queries."""
    out.mkdir(parents=True)
    rows = [_query(i, ["T\nx"], ["x"]) for i in range(4)]
    for name, labels in (("judge-rule", ["useful", "useful", "noisy", "noisy"]), ("judge-lm", ["noisy"] * 2)):
        judged = [{**r, "label": lab, "parse_ok": True, "parse_error": None, "judge_output": "", "judge_model": name}
                  for r, lab in zip(rows, labels)]
        write_artifact(judged, out / name / "judgments.parquet", JUDGMENT)
    for name, (u, n) in (("control-base", base), ("control-sim", sim)):
        ctl = [{"id": f"h{i}/{q}", "row_id": f"h{i}", "quality": q, "question": "?", "golden_answers": ["x"],
                "query": "?", "documents": ["d"], "has_answer": [i < round(share * 20)], "padded": False, "raw": "",
                "simulator": name} for q, share in (("useful", u), ("noisy", n)) for i in range(20)]
        write_artifact(ctl, out / name / "control.parquet", SIM_CONTROL)
    for name, value in (("heldout-before", em[0]), ("heldout-after", em[1])):
        (out / f"eval-{name}" / "demo").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([{"em": value, "n": 72}]), out / f"eval-{name}" / "demo" / "agent.summary.parquet")
    (out / "train").mkdir()
    pq.write_table(pa.Table.from_pylist([{"step": s, "rollout/reward_mean": 0.1 * s, "search/noise_p": 0.05 * s}
                                         for s in range(1, 5)]), out / "train" / "metrics.parquet")
    sft = [{"id": str(i), "prompt": "p", "completion": "c", "metadata": json.dumps({"label": lab})}
           for i, lab in enumerate(["useful", "noisy"])]
    write_artifact(sft, out / "simsft" / "sim_sft.parquet", SFT_EXAMPLE, {"judgments": "judge-rule/judgments.parquet"})
    for stage in mini.STAGES:
        (out / stage).mkdir(exist_ok=True)
        (out / stage / ".done").write_text(f"{seconds / len(mini.STAGES):.4f}\nzsearch {stage} ")
    return out


def test_report_checks_each_goal(tmp_path, capsys):
    s = mini.report(_finished_run(tmp_path / "ok", base=(0.2, 0.15), sim=(0.6, 0.2), em=(22 / 72, 21 / 72)))
    assert all(s["goals"].values()), s["goals"]
    assert s["control_sim"]["gap"] == pytest.approx(0.4) and s["control_base"]["gap"] == pytest.approx(0.05)
    assert s["judges"]["agreement"] == 0.0 and s["judges"]["rule_useful_rows"] == 2 and s["simsft"]["examples"] == 2
    assert (s["rl"]["window"], s["rl"]["reward_first"], s["rl"]["noise_p_last"]) == (2, pytest.approx(0.15), 0.2)
    assert s["wall_s"] == pytest.approx(600) and json.loads((tmp_path / "ok" / "summary.json").read_text())["goals"] == s["goals"]
    assert "| U - N | 0.050 | 0.400 |" in mini.table(s)
    goals = list(mini.GOALS.values())
    for name, kwargs, missed in (
            ("gap", {"sim": (0.45, 0.2)}, [goals[0]]),  # 0.25 < 0.30
            ("base", {"base": (0.6, 0.1)}, [goals[1]]),  # the base switches as well: 0.5 >= 0.4
            ("em", {"em": (22 / 72, 20 / 72)}, [goals[2]]),  # two questions lost
            ("time", {"seconds": 3700.0}, [goals[3]])):
        args = {"base": (0.2, 0.15), "sim": (0.6, 0.2), "em": (22 / 72, 21 / 72), **kwargs}
        s = mini.report(_finished_run(tmp_path / name, **args))
        assert [g for g, met in s["goals"].items() if not met] == missed, name
    assert mini.main(["report", str(tmp_path / "gap"), "--strict"]) == 1
    assert f"MISSED: {goals[0]}" in capsys.readouterr().out
    assert mini.main(["report", str(tmp_path / "gap")]) == 0  # not strict: the table only
    assert mini.main(["report", str(tmp_path / "nothing")]) == 2


# ----------------------------------------------------------------------------- the recipe at tiny size

# The agent is taught one query per question: the collected ones find a "Mona Lisa" passage
# (rule:answer: useful) or a Shakespeare one (noisy), and the held-out ones are the queries the
# simulators are measured on.
TRAIN = [("mini-1", "Which painting did Vincenzo Peruggia steal from the Louvre?", "peruggia louvre theft"),
         ("mini-2", "Which painting was never shown at the Globe?", "globe theatre southwark")]
HELDOUT = [("mini-5", "Which portrait did Leonardo paint on a poplar panel?", "leonardo poplar panel"),
           ("mini-6", "Which painting hangs far from Holy Trinity Church?", "holy trinity chancel")]
PLANT = '''\
# Planted bug (tests/test_zerosearch_mini.py): simsft writes the other quality word into every
# training prompt, as a swapped useful/noisy mapping in its code would.
import importlib.abc, importlib.util, sys

class _Swap(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "zsearch_cli.commands.simsft":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            real = module.render_simulator_prompt
            module.render_simulator_prompt = lambda quality, *a: real({"useful": "noisy", "noisy": "useful"}[quality], *a)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Swap())
'''


def _qa(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps({"id": r[0], "question": r[1], "golden_answers": ["Mona Lisa"]}) + "\n"
                            for r in rows))
    return path


def _both_labels(path: Path) -> Path:
    """Judged rows with both labels for each held-out query, as a large judge labelling two result
    lists of one query would: a "Mona Lisa" passage (useful) and a Shakespeare one (noisy). The
    tiny random simulator cannot learn the switch from the collected rows (one result list per
    query: it learns each query's documents, so U = N on every query, measured); from these it
    learns the word, the one thing that tells the two apart."""
    docs = {"useful": "art-0042", "noisy": "art-0002"}
    rows = [{**_query(0, [f"{CORPUS[d]['title']}\n{CORPUS[d]['text']}"], ["Mona Lisa"]), "id": f"{i}/{label}",
             "row_id": i, "question": q, "query": query, "doc_ids": [d], "label": label, "parse_ok": True,
             "parse_error": None, "judge_output": "", "judge_model": "a large judge"}
            for i, q, query in HELDOUT for label, d in docs.items()]
    return write_artifact(rows, path, JUDGMENT)


@pytest.fixture(scope="module")
def mini_inputs(tmp_path_factory, tiny_model_dir, demo_index):
    """The QA files, the agent (the tiny model taught to search the queries above, then answer),
    the simulator's base (a tiny model with smollm2's real tokenizer) and its judged rows."""
    from zsearch_cli.models.tiny import make_tiny_model_with_tokenizer, smollm2_tokenizer
    from zsearch_cli.rollout.protocols import PROTOCOLS

    root = tmp_path_factory.mktemp("zerosearch-mini")
    protocol = PROTOCOLS["tags"]()
    pairs = [{"id": i, "prompt": protocol.build_prompt(q),
              "completion": f"<think> I need to search. </think>\n<search> {query} </search>\n\n"
                            "<information>Doc 1(Title: Mona Lisa) a painting</information>\n\n<answer> Mona Lisa </answer>"}
             for i, q, query in TRAIN + HELDOUT]
    write_artifact(pairs, root / "warmup.parquet", SFT_EXAMPLE)
    result = runner.invoke(app, ["sft", str(root / "warmup.parquet"), "--model", str(tiny_model_dir), "--out",
                                 str(root / "agent"), "--device", "cpu", "--max-steps", "60", "--lr", "3e-3",
                                 "--batch-size", "4", "--eval-fraction", "0", "--lr-schedule", "constant",
                                 "--warmup-ratio", "0", "--save-every", "0"])
    assert result.exit_code == 0, result.output
    return {"train": _qa(root / "train.jsonl", TRAIN), "heldout": _qa(root / "heldout.jsonl", HELDOUT),
            "agent": root / "agent" / "final", "index": demo_index, "judged": _both_labels(root / "judged.parquet"),
            "sim": make_tiny_model_with_tokenizer(root / "sim-base", smollm2_tokenizer(), seed=0)}


def _run(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "stages" / "zerosearch-mini.sh")], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_recipe_end_to_end_fails_on_swapped_prompt_words(mini_inputs, tiny_model_dir, tmp_path):
    """stages/zerosearch-mini.sh with tiny settings, each step a fresh process: the tiny simulator
    learns the switch (U - N = 1 on the held-out queries, its base 0) and every goal is met; a
    second run skips every stage; then simsft again with its prompt words swapped, for real in
    its module: U - N is negative and the strict report exits 1 naming the controllability goals."""
    out = tmp_path / "mini"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OUT": str(out), "INDEX": str(mini_inputs["index"]), "MODEL": str(mini_inputs["agent"]),
           "SIM_MODEL": str(mini_inputs["sim"]), "JUDGE_MODEL": str(tiny_model_dir), "JUDGE_SAMPLE": "2",
           "SIM_JUDGMENTS": str(mini_inputs["judged"]), "COLLECT_DATA": str(mini_inputs["train"]),
           "TRAIN_DATA": str(mini_inputs["train"]), "HELDOUT": str(mini_inputs["heldout"]), "SAMPLES": "1",
           "COLLECT_TEMPERATURE": "0", "DOC_WORDS": "4", "SIM_STEPS": "14", "SIM_LR": "5e-3", "SIM_BATCH": "4",
           "SIM_MAX_TOKENS": "12", "SIM_TEMPERATURE": "0", "STEPS": "2", "BATCH": "2", "GROUP": "2", "LR": "1e-6",
           "LORA_R": "4", "TURN_TOKENS": "40", "DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = _run(env, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "zerosearch-mini check: every goal met" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["control_sim"]["u"], s["control_sim"]["n"], s["control_base"]["gap"]) == (1.0, 0.0, 0.0), s
    control = read_artifact(out / "control-sim" / "control.parquet", SIM_CONTROL).to_pylist()
    assert {r["query"] for r in control} == {query for *_, query in HELDOUT}  # the agent's held-out queries
    judged = read_artifact(out / "judge-rule" / "judgments.parquet", JUDGMENT).to_pylist()
    assert sorted((r["query"], r["label"]) for r in judged) == [("globe theatre southwark", "noisy"),
                                                               ("peruggia louvre theft", "useful")]
    assert s["judges"]["rows"] == 2 and s["heldout_n"] == 2 and s["rl"]["steps"] == 2
    assert (s["simsft"]["useful"], s["simsft"]["noisy"]) == (2, 2)

    again = _run(env, tmp_path)  # resumed: every stage finished, so each is skipped
    assert again.returncode == 0 and again.stdout.count("done before:") == 9, again.stdout[-3000:]

    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(PLANT)
    for stage in ("simsft", "control-sim"):
        shutil.rmtree(out / stage)
    proc = _run({**env, "PYTHONPATH": str(plant)}, tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"MISSED: {mini.GOALS['gap']}; {mini.GOALS['gap_vs_base']}" in proc.stdout, proc.stdout[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["control_sim"]["gap"] < 0 and s["control_base"]["gap"] == 0.0
    prompts = read_artifact(out / "simsft" / "sim_sft.parquet", SFT_EXAMPLE).to_pylist()
    useful = [p for p in prompts if json.loads(p["metadata"])["label"] == "useful"]
    assert useful and all("Noisy Output:" in p["prompt"] for p in useful)  # the bug really was in place
