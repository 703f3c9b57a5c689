"""The manual builds as a site (``make docs``) with no warning: mkdocs.yml makes a link to a
missing page, or to a missing heading of a page, a warning, and ``--strict`` refuses any.
One build takes about a second."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (the dev extra has them: make setup)")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``root/mkdocs.yml`` into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's end-of-life banner: not ours
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def warnings(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (run.stdout + run.stderr).splitlines() if "WARNING" in line or "ERROR" in line]


def test_the_site_builds_with_no_warning(tmp_path):
    run = build(ROOT, tmp_path / "site")
    if run.returncode != 0:
        pytest.fail("mkdocs build --strict failed:\n" + "\n".join(warnings(run) or [run.stderr]), pytrace=False)
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def test_the_strict_build_refuses_a_missing_page_and_a_missing_heading(tmp_path):
    # the check above must be able to fail: the real docs and config, plus two broken links
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "index.md", "a", encoding="utf-8") as fh:
        fh.write("\n[gone](no-such-page.md) and [nowhere](methods.md#no-such-heading)\n")
    run = build(tmp_path, tmp_path / "site")
    found = "\n".join(warnings(run))
    assert run.returncode != 0
    assert "no-such-page.md" in found and "no-such-heading" in found, found
