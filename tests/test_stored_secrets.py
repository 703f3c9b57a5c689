"""Issue 36: a run folder is shared (it is enough to rerun its run), so no key given in an
option is stored in it. Real commands on the tiny model, with real HTTP on 127.0.0.1 to a
retrieval server that records the credentials it is sent: ``train`` with a canary key in its
``--search`` URL (``user:KEY@``) and in its ``--val-search`` URL (the key as the user name),
then ``export`` and ``eval``; every file they wrote is walked (text, JSON, YAML, the
metadata and every column of every Parquet file, the model card, the log) and the canary
must be in none. A replay of the stored config refuses in one line instead of sending
``***`` as the key, and ``--resume`` / eval's reuse of rows work with the key given again.
The canary holds digits and no key-like word, so only the stored-form rule keeps it out."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from helpers import TORCH_THREADS
from zsearch_cli.cli import app
from zsearch_cli.errors import holds_withheld, read_back, stored_config, stored_value

CANARY = "q7Zx4CANARY93kd0"
runner = CliRunner()


@pytest.fixture()
def keyed_server(demo_index):
    """A zsearch retrieval server that records each request's Authorization header."""
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.retrieval.server import create_app, serving

    server = create_app(load_index(demo_index), method="bm25")
    seen: list[str] = []

    @server.middleware("http")
    async def record(request, call_next):  # type: ignore[no-untyped-def]
        seen.append(request.headers.get("authorization", ""))
        return await call_next(request)

    with serving(server) as url:
        yield url, seen


def _keyed(url: str, userinfo: str) -> str:
    return url.replace("http://", f"http://{userinfo}@")


def _sent_credentials(seen: list[str]) -> set[str]:
    return {base64.b64decode(h.split()[1]).decode() for h in seen if h.lower().startswith("basic ")}


def _texts(path: Path) -> list[str]:
    """Everything a file holds that a reader could see: its bytes as text, and for Parquet
    its metadata and every value of every column (zstd hides them from a byte search)."""
    out = [path.read_bytes().decode("utf-8", "replace")]
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        out += [k.decode() + v.decode("utf-8", "replace") for k, v in (table.schema.metadata or {}).items()]
        out.append(json.dumps(table.to_pylist(), default=str))
    return out


def _files_with_canary(*folders: Path) -> list[str]:
    found, walked = [], 0
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            walked += 1
            if any(CANARY in text for text in _texts(path)):
                found.append(str(path.relative_to(folder.parent)))
    assert walked > 10, "the walk found almost nothing: the test would prove nothing"
    return found


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def test_no_key_is_stored_and_a_replay_asks_for_it(tmp_path, tiny_model_dir, keyed_server):
    url, seen = keyed_server
    search, val_search = _keyed(url, f"zuser:{CANARY}"), _keyed(url, CANARY)
    qa = tmp_path / "val.jsonl"  # two sources: validation writes a per-source summary, which export's card reads
    qa.write_text("".join(json.dumps({"id": f"v{i}", "question": q, "golden_answers": [a], "data_source": s}) + "\n"
                          for i, (q, a, s) in enumerate([("Who painted the Mona Lisa?", "Leonardo", "nq"),
                                                         ("Where is the Louvre?", "Paris", "hotpotqa")])))
    run = tmp_path / "run"
    common = ["--algo", "grpo", "--model", str(tiny_model_dir), "--batch-size", "2", "-G", "2",
              "--max-turn-tokens", "12", "--max-turns", "2", "--device", "cpu", "--lr", "1e-3", "--save-every", "1",
              "--save-rollouts", "--val-data", str(qa), "--val-every", "1"]
    run.mkdir()
    with open(run / "train.log", "w") as log:  # the log a user keeps beside the run (stdout and stderr)
        done = subprocess.run([sys.executable, "-m", "zsearch_cli", "train", *common, "--search", search,
                               "--val-search", val_search, "--steps", "2", "--out", str(run)],
                              stdout=log, stderr=subprocess.STDOUT, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, (run / "train.log").read_text()[-3000:]
    assert (run / "rollouts").is_dir() and list((run / "val").glob("*.summary.parquet"))

    exported = tmp_path / "export"
    result = runner.invoke(app, ["export", str(run), "--out", str(exported)])
    assert result.exit_code == 0, result.output
    assert (exported / "README.md").is_file()

    evaluated = tmp_path / "eval"
    eval_args = ["eval", "--model", str(tiny_model_dir), "--search", search, "--limit", "2", "--max-turns", "2",
                 "--max-turn-tokens", "8", "--device", "cpu", "--out", str(evaluated)]
    result = runner.invoke(app, eval_args)
    assert result.exit_code == 0, result.output
    assert CANARY not in result.output  # eval's printed protocol line shows the retriever withheld

    assert _files_with_canary(run, exported, evaluated) == []
    assert "http://***@" in (run / "config.yaml").read_text()  # withheld, not dropped: the rest replays

    # the stored config replayed as it is: one line naming the option and how to give the key,
    # before any request and any folder
    asked = len(seen)
    for command, folder in (("train", run), ("eval", evaluated)):
        result = runner.invoke(app, [command, "--config", str(folder / "config.yaml"), "--out", str(tmp_path / "new")])
        assert result.exit_code == 2, result.output
        line = _one_error_line(result.output)
        assert "key 'search' (--search)" in line and "give --search again on the command line" in line, line
    result = runner.invoke(app, ["eval", "--config", str(evaluated / "config.yaml"), "--search", _keyed(url, "***"),
                                 "--out", str(tmp_path / "new")])  # a command line copied from the header
    assert result.exit_code == 2 and "give the key itself" in _one_error_line(result.output)
    assert len(seen) == asked and not (tmp_path / "new").exists()

    # --resume with the keys given again (the command line overrides the file): the withheld
    # values equal them, so the checkpoint's options match and the run goes on from step 2
    result = runner.invoke(app, ["train", "--config", str(run / "config.yaml"), "--search", search,
                                 "--val-search", val_search, "--resume", "--steps", "3", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "step-3").is_dir()
    # eval reuses its rows with the key given again (its protocol recorded the URL withheld)
    result = runner.invoke(app, [*eval_args[:-1], str(evaluated)])
    assert result.exit_code == 0 and "2 examples already scored" in result.output, result.output
    assert _files_with_canary(run, evaluated) == []
    sent = _sent_credentials(seen)  # (the tiny model never searches: these are the protocol's /health calls)
    assert sent and sent <= {f"zuser:{CANARY}", f"{CANARY}:"}, sent  # the key given, never *** as one


SPECS = [  # (as given, as stored): every credential form withheld, every other option kept
    (f"http://user:{CANARY}@h:8000", "http://***@h:8000"),
    (f"https://{CANARY}@h", "https://***@h"),
    (f"sim+http://u:{CANARY}@h/v1?mode=prompt&max_tokens=64", "sim+http://***@h/v1?mode=prompt&max_tokens=64"),
    (f"serpapi?engine=bing&base_url=https://proxy/s?api_key={CANARY}", "serpapi?engine=bing&base_url=https://proxy/s?api_key=***"),
    (f"http://a:1,http://u:{CANARY}@b:2", "http://a:1,http://***@b:2"),
    (f"http://h/v1?X-Amz-Signature={CANARY}&x=1", "http://h/v1?X-Amz-Signature=***&x=1"),
    (f"http://h/v1?token={CANARY}", "http://h/v1?token=***"),
    ("sim:smollm2?noise_end=0.5&cache_size=0", "sim:smollm2?noise_end=0.5&cache_size=0"),
    ("runs/index", "runs/index"),
]


@pytest.mark.parametrize("given,stored", SPECS)
def test_the_stored_form_of_each_spec(given, stored):
    assert stored_value(given) == stored and stored_value(stored) == stored
    assert holds_withheld(stored) == (stored != given)
    assert stored_config({"search": given, "seeds": [given], "n": 3}) == {"search": stored, "seeds": [stored], "n": 3}


def test_a_record_read_back_equals_the_options_given_again():
    saved = read_back({"search": f"http://u:{CANARY}@h:1", "topk": 3})  # an older file, with the key
    assert saved["search"] == "http://u:another-key@h:1" and not saved["search"] != "http://u:k@h:1"
    assert saved["search"] != "http://u:k@h:2" and saved["search"] != "bm25"
    assert CANARY not in json.dumps(saved)


def test_a_judge_url_asks_for_its_key_with_the_variable_it_may_come_from(tmp_path):
    config = tmp_path / "judge.yaml"
    config.write_text("judge_url: http://***@127.0.0.1:9/v1\njudge_model: m\n")
    queries = tmp_path / "queries.parquet"
    queries.write_bytes(b"")  # never read: the refusal comes first
    result = runner.invoke(app, ["judge", str(queries), "--config", str(config), "--out", str(tmp_path / "j")])
    line = _one_error_line(result.output)
    assert result.exit_code == 2 and "key 'judge_url' (--judge-url)" in line and "OPENAI_API_KEY" in line, line
