"""The vLLM version range: the backend refuses a vLLM outside it in one line, and the range is
the `gpu` extra's (pyproject.toml), so neither can move without the other. Which calls were
compared across the range: docs/gpu.md, "vLLM versions"."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.vllm import SUPPORTED_VLLM, check_vllm_version, import_vllm

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["0.26.0", "0.26.0+cpu", "0.27.1", "0.32.0", "0.32.1.dev3+g1a2b3c"])
def test_versions_in_the_range_pass(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0", "0.33.0.dev1", "1.0.0", "unknown"])
def test_versions_outside_the_range_are_refused_in_one_line(version):
    with pytest.raises(ZsearchError) as err:
        check_vllm_version(version)
    message = str(err.value)
    assert version in message and "vLLM 0.26 to 0.32" in message and "\n" not in message


def test_the_installed_vllm_is_in_the_range():
    import_vllm()  # raises if the CI's vLLM (the CPU build) fell out of the range


def test_the_range_is_the_gpu_extras():
    # Edges on both sides of each end: a version the extra admits must pass the backend's check,
    # and one it excludes must be refused.
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (vllm,) = [Requirement(r) for r in extra if Requirement(r).name == "vllm"]
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    edges = [f"{lo_major}.{lo_minor - 1}.9", f"{lo_major}.{lo_minor}.0", f"{hi_major}.{hi_minor}.9",
             f"{hi_major}.{hi_minor + 1}.0"]
    for version in edges:
        admitted = vllm.specifier.contains(version)
        try:
            check_vllm_version(version)
            accepted = True
        except ZsearchError:
            accepted = False
        assert admitted == accepted, f"pyproject's {vllm} and SUPPORTED_VLLM disagree on vLLM {version}"
    assert vllm.specifier.contains(f"{lo_major}.{lo_minor}.0") and not vllm.specifier.contains("0.25.9")
