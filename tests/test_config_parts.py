"""The options as nested parts (``config/``): one field reaches every command that rolls out,
files written before the parts nested read back unchanged, and the library imports without
typer.

- A throwaway rollout option, added to ``RolloutOptions`` alone, must become a flag of every
  command that rolls out and reach the engine those commands build: the proof that adding an
  option is one field (before the parts nested, each command listed the names it took, and a
  new one silently missed those that did not list it).
- A checkpoint's config written by zsearch before the parts nested (``tests/golden/``) must
  pass today's resume rule for the same flags: ``to_dict`` is flat, as it was.
- Every module outside ``cli*.py`` imports with typer blocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zsearch_cli.config.fields import from_flat, leaves, part, to_flat, with_options
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.train.config import TrainConfig, resolve_config, with_later_options

ROOT = Path(__file__).resolve().parents[1]
OLD_CHECKPOINT = ROOT / "tests" / "golden" / "train-checkpoint-config-2ed08ba.json"

ROLLING_COMMANDS = ("train", "solve", "propose", "eval", "collect", "agent serve", "drzero", "warmup-data")
"""Every command that builds a rollout engine (warmup-data plays teacher trajectories through it)."""


# ----------------------------------------------------------------------------- one field reaches every command

THROWAWAY = r'''
import dataclasses, json, sys
from dataclasses import dataclass
import zsearch_cli.config.parts as parts
from zsearch_cli.config.fields import option

@dataclass(kw_only=True)
class RolloutOptions(parts.RolloutOptions):
    throwaway_knob: int = option(7)
    """A rollout option that exists only in this test."""

RolloutOptions.__qualname__ = RolloutOptions.__name__ = "RolloutOptions"
parts.RolloutOptions = RolloutOptions  # before any command's options are declared

import typer
from typer.testing import CliRunner
from zsearch_cli.cli import app
import zsearch_cli.rollout.build as build

def commands(group, prefix=""):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd

flags = {name: sorted(p.name for p in cmd.params if p.name == "throwaway_knob")
         for name, cmd in commands(typer.main.get_command(app))}

seen = []
class Stop(Exception):
    pass
class RecordingEngine:  # the engine eval builds: record the rollout options it gets, run nothing
    def __init__(self, backend, protocol, search, config=None, **kw):
        seen.append(config)
        raise Stop
import zsearch_cli.models.factory as factory
factory.load_backend = lambda *a, **k: None  # no model to load for a record
build.RolloutEngine = RecordingEngine
result = CliRunner().invoke(app, ["eval", "--throwaway-knob", "9", "--datasets", sys.argv[1], "--out", sys.argv[2],
                                  "--index", sys.argv[3]])
print(json.dumps({"flags": flags, "engine_knob": [getattr(r, "throwaway_knob", None) for r in seen],
                  "exc": repr(result.exception)}))
'''


def test_a_new_rollout_option_is_one_field_and_reaches_every_command_that_rolls_out(tmp_path, demo_index):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "q0", "question": "who?", "golden_answers": ["me"]}) + "\n")
    run = subprocess.run([sys.executable, "-c", THROWAWAY, str(qa), str(tmp_path / "eval"), str(demo_index)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    missing = [name for name in ROLLING_COMMANDS if got["flags"].get(name) != ["throwaway_knob"]]
    assert not missing, f"the new rollout option is no flag of: {missing}"
    # and the value set on the command line is the one the engine gets: the part goes as it is
    assert got["engine_knob"] == [9], got


# ----------------------------------------------------------------------------- flat records, nested objects


def test_parts_nest_but_save_flat():
    cfg = TrainConfig.from_flat(topk=5, lr=2e-6, val_every=3, noise_end=0.5, algo="dspo")
    assert (cfg.rollout.topk, cfg.optim.lr, cfg.validation.val_every, cfg.sim.noise_end) == (5, 2e-6, 3, 0.5)
    flat = cfg.to_dict()
    assert "rollout" not in flat and (flat["topk"], flat["lr"], flat["algo"]) == (5, 2e-6, "dspo")
    assert TrainConfig.from_dict(flat) == cfg
    # with_options changes a leaf wherever it sits, and nothing else
    moved = with_options(cfg, topk=2, steps=9)
    assert (moved.rollout.topk, moved.steps, moved.optim.lr) == (2, 9, 2e-6) and cfg.rollout.topk == 5
    with pytest.raises(TypeError, match="no option"):
        TrainConfig.from_flat(top_k=3)  # a typo is an error, not a silently ignored key


def test_a_part_excludes_and_redefaults_by_flat_name():
    from dataclasses import dataclass

    @dataclass(kw_only=True)
    class Greedy:
        rollout: RolloutOptions = part(RolloutOptions, exclude=("top_p",), temperature=0.0)

    # hand reasoning: every RolloutOptions field but top_p is an option, temperature defaults to 0
    assert set(leaves(Greedy)) == set(leaves(RolloutOptions)) - {"top_p"}
    assert leaves(Greedy)["temperature"].default == 0.0 and Greedy().rollout.temperature == 0.0
    assert "top_p" not in to_flat(Greedy()) and from_flat(Greedy, {"top_p": 0.5}).rollout.top_p == 1.0
    with pytest.raises(TypeError, match="no option"):
        part(RolloutOptions, exclude=("topp",))


def test_the_library_checks_the_ranges_the_fields_declare():
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.train.config import check_config

    # temperature: >= 0 for eval (0 = greedy), > 0 where RL samples; warmup_ratio: [0, 1)
    with pytest.raises(ZsearchError, match=r"--temperature must be > 0 \(RL samples\), got 0.0"):
        check_config(TrainConfig.from_flat(temperature=0.0))
    with pytest.raises(ZsearchError, match=r"--warmup-ratio must be >= 0 and < 1"):
        check_config(TrainConfig.from_flat(warmup_ratio=1.0))
    with pytest.raises(ZsearchError, match=r"--val-limit must be >= 1, got 0"):
        check_config(TrainConfig.from_flat(val_limit=0))


# ----------------------------------------------------------------------------- files written before


def test_a_checkpoint_written_before_the_parts_nested_passes_the_resume_rule():
    from zsearch_cli.config.fields import execution_options
    from zsearch_cli.protocol import differing

    RESUME_MAY_CHANGE = execution_options(TrainConfig)  # what the trainer's --resume lets differ
    old = json.loads(OLD_CHECKPOINT.read_text())
    saved = old["checkpoint_config"]
    # the same flags as the old run (tests/golden/…json "flags"), as today's code resolves them
    cfg = resolve_config(TrainConfig.from_flat(
        model="MODEL", index=Path("INDEX"), out=Path("OUT"), steps=1, batch_size=2, group_size=2, max_turns=1,
        max_turn_tokens=8, save_every=1, algo="grpo", lora_r=4, top_p=0.9, lr=2e-6, warmup_ratio=0.1))
    assert differing(with_later_options(saved), cfg.to_dict(), RESUME_MAY_CHANGE) == []
    # and the saved dict reads back into the nested config, keys and values unchanged (the options
    # added since, e.g. vllm_sleep, at the values that run used: with_later_options)
    later = with_later_options(saved)
    assert TrainConfig.from_dict(saved).to_dict() == {k: later[k] for k in cfg.to_dict()}
    # a real difference is still caught (the rule is not vacuous)
    assert differing(with_later_options(saved), with_options(cfg, topk=4).to_dict(), RESUME_MAY_CHANGE)


# ----------------------------------------------------------------------------- no typer in the library

BLOCK_TYPER = r'''
import importlib, pkgutil, sys
class NoTyper:
    def find_spec(self, name, path=None, target=None):
        if name == "typer" or name.startswith("typer."):
            raise ImportError("typer is blocked")
sys.meta_path.insert(0, NoTyper())
import zsearch_cli
failed = []
for mod in pkgutil.walk_packages(zsearch_cli.__path__, "zsearch_cli."):
    leaf = mod.name.rsplit(".", 1)[-1]
    if leaf.startswith("cli") or mod.name == "zsearch_cli.__main__":
        continue
    try:
        importlib.import_module(mod.name)
    except Exception as err:
        failed.append(f"{mod.name}: {type(err).__name__}: {err}")
print("\n".join(failed) or "ok")
'''


def test_every_library_module_imports_without_typer():
    run = subprocess.run([sys.executable, "-c", BLOCK_TYPER], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "ok", run.stdout


def test_no_library_module_imports_the_cli():
    import ast

    src = ROOT / "src" / "zsearch_cli"
    offenders = []
    for path in src.rglob("*.py"):
        if path.name.startswith("cli") or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n.split(".")[-1].startswith("cli_") or n in ("typer", "zsearch_cli.cli") for n in names):
                offenders.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not offenders, offenders
