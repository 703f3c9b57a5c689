"""The project documents its own methods: every "docs/methods.md §n" citation in the code,
tests and README names a section that exists, the docs the README links are there, and every
docs page the code, stages, tests, bench, Makefile or docs name by path exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ROOT / "docs" / "methods.md"
CITATION = re.compile(r"docs/methods\.md((?:,? §\d+(?:\.\d+)?(?:–\d+)?)+)")


def methods_sections() -> set[str]:
    """Section numbers of docs/methods.md: '## 4. …' gives '4', '### 4.3 …' gives '4.3'."""
    found = set()
    for line in METHODS.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line)
        if m:
            found.add(m.group(1))
    return found


def cited_files() -> list[Path]:
    """Where citations live (this file is left out: it cites missing sections on purpose)."""
    files = [*ROOT.glob("src/zsearch_cli/**/*.py"), *ROOT.glob("tests/*.py"), ROOT / "README.md",
             ROOT / "docs" / "architecture.md"]
    return sorted(f for f in files if f.name != Path(__file__).name)


def citations(text: str) -> list[str]:
    """Every section number a 'docs/methods.md §a, §b–c' citation names (ranges expanded)."""
    out = []
    for m in CITATION.finditer(text):
        for part in re.findall(r"§(\d+(?:\.\d+)?)(?:–(\d+))?", m.group(1)):
            first, last = part
            out.append(first)
            if last:
                out += [str(n) for n in range(int(first) + 1, int(last) + 1)]
    return out


def test_methods_has_sections_1_to_9():
    sections = methods_sections()
    assert {str(n) for n in range(1, 10)} <= sections
    assert {"4.1", "4.2", "4.3", "4.4", "4.5", "4.6", "4.7"} <= sections  # one per objective


def test_every_methods_citation_names_an_existing_section():
    sections = methods_sections()
    bad = []
    for path in cited_files():
        for number in citations(path.read_text(encoding="utf-8")):
            if number not in sections:
                bad.append(f"{path.relative_to(ROOT)}: §{number}")
    assert not bad, f"citations of missing docs/methods.md sections: {bad}"


def test_citation_parser_catches_a_missing_section():
    # the check above must be able to fail: §12 and §4.9 do not exist, §4–5 expands to 4 and 5
    assert citations("see docs/methods.md §12; and docs/methods.md §4.9, §6") == ["12", "4.9", "6"]
    assert citations("(docs/methods.md §4–5)") == ["4", "5"]
    assert "12" not in methods_sections() and "4.9" not in methods_sections()


def test_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for doc in ("docs/methods.md", "docs/architecture.md"):
        assert f"]({doc})" in readme and (ROOT / doc).is_file()


def test_no_citation_of_documents_outside_the_repo():
    # Code once cited an external note ("FORMULAS §n") and the papers' code as "the anchor";
    # neither is in the repository, so a reader could not follow such a citation.
    stale = re.compile(r"FORMULAS|\banchor\b")
    allowed = {"test_server.py"}  # "anchor" is a word of a random-text fixture there
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in cited_files() if p.name not in allowed
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if stale.search(line)]
    assert not bad, f"cite docs/methods.md and the paper instead: {bad}"


def test_every_prompt_constant_lives_in_the_prompts_package():
    # A prompt is part of a method's definition: one place to read and diff them all. Outside
    # zsearch_cli/prompts/, no module-level string named *PROMPT* or *TEMPLATE* may be defined
    # (imports of them are fine; booleans such as SIM_CHAT_TEMPLATE are not prompts, and a
    # tokenizer's jinja *_CHAT_TEMPLATE belongs to the model, not to a method).
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "zsearch_cli"
    strays = []
    for path in sorted(src.rglob("*.py")):
        if "prompts" in path.relative_to(src).parts:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            is_text = isinstance(value, (ast.JoinedStr, ast.BinOp)) or (
                isinstance(value, ast.Constant) and isinstance(value.value, str))
            strays += [f"{path.relative_to(src)}:{t.id}" for t in targets
                       if isinstance(t, ast.Name) and is_text and ("PROMPT" in t.id or "TEMPLATE" in t.id)
                       and not t.id.endswith("CHAT_TEMPLATE")]
    assert not strays, strays


DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]+?\.md\b")
"""A docs page named by its path from the repository root: ``docs/commands/serve.md``."""


def doc_path_files() -> list[Path]:
    """Where a docs page may be named by path: the README, the code, the recipes and the docs.
    CHANGELOG.md is left out (it is history: it names pages as they were then), as are build
    outputs and this file (it names missing pages on purpose)."""
    roots = [ROOT / "src" / "zsearch_cli", ROOT / "stages", ROOT / "tests", ROOT / "bench", ROOT / "docs"]
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "mkdocs.yml"]
    for root in roots:
        files += [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in {".py", ".sh", ".md", ".txt", ".yml", ".yaml", ".toml", ".c"}]
    return sorted(f for f in files if f.is_file() and f.resolve() != Path(__file__).resolve())


def dangling_doc_paths(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: docs/x.md`` for each docs page named in ``files`` that ``root`` lacks."""
    bad = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            bad += [f"{path.relative_to(root)}:{i}: {m}" for m in DOC_PATH.findall(line) if not (root / m).is_file()]
    return bad


def test_every_docs_page_named_by_path_exists():
    bad = dangling_doc_paths(doc_path_files())
    assert not bad, "docs pages named but missing (moved or merged? name the new page):\n" + "\n".join(bad)


def test_the_docs_path_check_catches_a_missing_page(tmp_path):
    # the check above must be able to fail: a page named in code that the tree lacks
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n", encoding="utf-8")
    code = tmp_path / "m.py"
    code.write_text('"""See docs/here.md and docs/gone.md (docs/sub/also-gone.md, "Trimming")."""\n'
                    "x = 'site/docs/not-ours.md'\n", encoding="utf-8")
    assert dangling_doc_paths([code], tmp_path) == ["m.py:1: docs/gone.md", "m.py:1: docs/sub/also-gone.md"]
