"""One rule for every folder zsearch replaces (issue 36.1-2; files.py): write beside, move the
old aside, rename the new in, remove the old; a later run cleans what dead processes left.
Faults are planted for real: a process SIGKILLed at the window between moving the old export
aside and renaming the new one in, and one killed while writing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.files import clean_stale_temps, replace_folder

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

KILLED_EXPORT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import zsearch_cli.files as files
    import zsearch_cli.commands.export as export
    where = sys.argv[3]
    if where == "window":  # SIGKILL between moving the old folder aside and renaming the new one in
        rename, calls = os.rename, []
        def killing_rename(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return rename(src, dst)
        files.os.rename = killing_rename
    else:  # SIGKILL halfway through writing the new folder
        write = export._write_full
        def killing_write(model, tokenizer, dtype, tmp):
            write(model, tokenizer, dtype, tmp)
            os.kill(os.getpid(), signal.SIGKILL)
        export._write_full = killing_write
    export.export(Path(sys.argv[1]), Path(sys.argv[2]), force=True)
""")


def _killed_export(model: Path, out: Path, where: str) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(model), str(out), where], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]


def _beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_a_kill_between_aside_and_in_loses_neither_export(tmp_path, tiny_model_dir):
    out = tmp_path / "export"
    assert runner.invoke(app, ["export", str(tiny_model_dir), "--out", str(out)]).exit_code == 0
    first = (out / "model.safetensors").read_bytes()
    _killed_export(tiny_model_dir, out, "window")
    # Today's code deleted the old export first: a kill there left no export at all. Now the old
    # one sits aside and the new one beside, both under the dead process's pid.
    assert not out.exists()
    assert any(".old-" in n for n in _beside(out)) and any(n.endswith(".tmp") for n in _beside(out))
    # The next run puts the old one back and removes the dead process's new folder.
    lines = clean_stale_temps(out)
    assert len(lines) == 1 and "restored the previous version" in lines[0]
    assert (out / "model.safetensors").read_bytes() == first and _beside(out) == []


def test_a_killed_export_leaves_a_temp_that_the_next_export_removes(tmp_path, tiny_model_dir):
    out = tmp_path / "export"
    _killed_export(tiny_model_dir, out, "writing")
    assert not out.exists() and len(_beside(out)) == 1  # tens of MB, left forever before
    result = runner.invoke(app, ["export", str(tiny_model_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file() and _beside(out) == []


def test_a_live_writers_folders_are_kept_and_a_failed_write_leaves_the_old_folder(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "a").write_text("old")
    live = tmp_path / f".t.{os.getpid()}.abc.tmp"  # this process is alive: a concurrent writer
    live.mkdir()
    assert clean_stale_temps(target) == [] and live.is_dir()
    live.rmdir()

    def failing(tmp: Path) -> None:
        (tmp / "a").write_text("new")
        raise RuntimeError("disk full")

    try:
        replace_folder(target, failing)
    except RuntimeError:
        pass
    assert (target / "a").read_text() == "old" and _beside(target) == []
    replace_folder(target, lambda tmp: (tmp / "a").write_text("new"))
    assert (target / "a").read_text() == "new" and _beside(target) == []
