"""``--bm25-preset pyserini``: Lucene's English analyzer and BM25Similarity, without Java.

The expected terms below were hand-checked against the rules in lucene_analyzer.py's
docstring and agree with what Lucene 9 itself produced for the same strings (Pyserini
0.22.1's ``Analyzer(get_lucene_analyzer())``, run once by hand; bench/pyserini.py repeats
the comparison on whole corpora where Java is installed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.retrieval.bm25 import lucene_norm_lengths, lucene_scores
from zsearch_cli.retrieval.index import build_index, load_index
from zsearch_cli.retrieval.lucene_analyzer import porter_stem, standard_tokens
from zsearch_cli.retrieval.tokenize import Tokenizer

LUCENE = Tokenizer("porter-lucene", "en", "lucene")


@pytest.mark.parametrize("text, terms", [
    # possessives: 's / ’s / 'S removed before lowercasing; "isn't" is one token, kept
    ("The dog's bone and JAMES'S cat’s toys", ["dog", "bone", "jame", "cat", "toi"]),
    ("O'Neil's house isn't there", ["o'neil", "hous", "isn't"]),
    # Lucene's 33 English stopwords only
    ("they will not be there, such as these", []),
    ("he she we", ["he", "she", "we"]),
    # UAX #29: letters join across . ' : _ ; digits across . , ; hyphen, @, / split
    ("U.S.A. 42.195 km, 2,850 people; 3.14.15 re:Invent foo_bar ___ x-ray",
     ["u.s.a", "42.195", "km", "2,850", "peopl", "3.14.15", "re:inv", "foo_bar", "x", "rai"]),
    ("e-mail@host.com http://example.org/a_b?c=1", ["e", "mail", "host.com", "http", "example.org", "a_b", "c", "1"]),
    # Java lowercasing (no final sigma, İ -> i); no accent folding
    ("ΟΔΟΣ İstanbul Straße naïve café", ["οδοσ", "istanbul", "straße", "naïv", "café"]),
    # each Han / Hiragana character alone, Katakana and Hangul runs together
    ("日本語テキスト ひらがな カタカナ 한국어", ["日", "本", "語", "テキスト", "ひ", "ら", "が", "な", "カタカナ", "한국어"]),
    # superscripts and fractions are not word characters in UAX #29 (they are in Python's \w)
    ("mc² ³⁴ ½ a1b2 v2.0 1990s", ["mc", "a1b2", "v2.0", "1990"]),
    ("Dr. Zero_v2 ships in 2026!", ["dr", "zero_v2", "ship", "2026"]),
])
def test_english_analyzer_chain(text: str, terms: list[str]) -> None:
    assert LUCENE.terms(text) == terms


@pytest.mark.parametrize("word, lucene, snowball_porter, snowball_english", [
    # the reference C version's departures from the paper, which Lucene follows:
    ("possibly", "possibl", "possibli", "possibl"),       # bli -> ble (paper: abli -> able)
    ("archaeologies", "archaeolog", "archaeologi", "archaeolog"),  # logi -> log
    ("trekking", "trek", "trekk", "trekk"),               # any double consonant but l/s/z undoubles
    ("us", "us", "u", "us"),                              # words of <= 2 letters are left alone
    ("generalization", "gener", "gener", "general"),      # Porter, not Porter2
    ("news", "new", "new", "news"),
])
def test_porter_is_lucenes_not_snowballs(word: str, lucene: str, snowball_porter: str, snowball_english: str) -> None:
    import Stemmer

    assert porter_stem(word) == lucene
    assert Stemmer.Stemmer("porter").stemWord(word) == snowball_porter
    assert Stemmer.Stemmer("english").stemWord(word) == snowball_english


@pytest.mark.parametrize("word, stem", [
    ("caresses", "caress"), ("ponies", "poni"), ("ties", "ti"), ("cats", "cat"), ("feed", "feed"),
    ("agreed", "agre"), ("plastered", "plaster"), ("motoring", "motor"), ("sing", "sing"),
    ("conflated", "conflat"), ("troubled", "troubl"), ("sized", "size"), ("hopping", "hop"),
    ("falling", "fall"), ("hissing", "hiss"), ("fizzed", "fizz"), ("failing", "fail"), ("filing", "file"),
    ("happy", "happi"), ("sky", "sky"), ("relational", "relat"), ("conditional", "condit"),
    ("electrical", "electr"), ("hopeful", "hope"), ("goodness", "good"), ("adjustable", "adjust"),
    ("replacement", "replac"), ("adoption", "adopt"), ("controlling", "control"), ("rolling", "roll"),
])
def test_porter_paper_examples(word: str, stem: str) -> None:
    # Porter (1980)'s own worked examples, through the full algorithm.
    assert porter_stem(word) == stem


def test_long_tokens_are_cut_at_255() -> None:
    assert [len(t) for t in standard_tokens("z" * 600)] == [255, 255, 90]


def _byte4_roundtrip(length: int) -> int:
    """Lucene's SmallFloat.intToByte4 then byte4ToInt, bit by bit (24 free values)."""
    if length < 24:
        return length
    x = length - 24
    if x.bit_length() < 4:
        return length
    shift = x.bit_length() - 4
    return 24 + ((x >> shift) << shift)


def test_lucene_norm_lengths_match_smallfloat() -> None:
    lengths = np.arange(0, 5000)
    assert lucene_norm_lengths(lengths).tolist() == [_byte4_roundtrip(int(n)) for n in lengths]
    # hand: 23 exact; 100 = 24 + 76 = 24 + 0b1001100 -> top 4 bits 0b1001 << 3 = 72 -> 96
    assert lucene_norm_lengths(np.array([23, 31, 32, 100]))[[0, 3]].tolist() == [23, 96]


def test_lucene_scores_hand_computed() -> None:
    # idf 2, tf 3, length 100 (stored as 96), avgdl 50, k1 0.9, b 0.4:
    # norm = 0.9 * (0.6 + 0.4 * 96 / 50) = 1.2312; score = 2 * 3 / (3 + 1.2312) = 1.41804...
    got = lucene_scores(np.array([2.0]), np.array([3.0]), np.array([100]), 50.0, 0.9, 0.4)
    assert got.dtype == np.float32 and got[0] == pytest.approx(6 / (3 + 1.2312), rel=1e-6)


# ----------------------------------------------------------------------------- the preset end to end


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_preset_is_stored_in_the_manifest_and_used_at_search(tmp_path: Path) -> None:
    rows = [{"id": "a", "title": "Trekking", "text": "Trekking in Nepal is possibly the best."},
            {"id": "b", "title": "Geology", "text": "Geology of the U.S.A. and O'Neil's rocks."}]
    out = build_index(write(tmp_path / "c.jsonl", rows), tmp_path / "idx", {"bm25_preset": "pyserini"})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["bm25_preset"] == "pyserini"
    assert {k: manifest["bm25"][k] for k in ("k1", "b", "stemmer", "stopwords", "analyzer", "norms")} == {
        "k1": 0.9, "b": 0.4, "stemmer": "porter-lucene", "stopwords": "en", "analyzer": "lucene", "norms": "lucene"}
    index = load_index(out)
    assert index._bm25.tokenizer.analyzer == "lucene"
    # "u.s.a" is one Lucene token: the default analyzer would split it and match "a"/"s"
    assert [p.id for p in index.search(["U.S.A."], 3)[0]] == ["b"]
    assert [p.id for p in index.search(["o'neil"], 3)[0]] == ["b"]
    default = load_index(build_index(tmp_path / "c.jsonl", tmp_path / "idx2", {}))
    assert default._bm25.tokenizer.analyzer == "simple" and json.loads(
        (tmp_path / "idx2" / "manifest.json").read_text())["bm25"]["k1"] == 1.2


def test_equal_scores_are_ordered_by_id_string_like_anserini(tmp_path: Path) -> None:
    # 40 identical passages: every score ties. Anserini sorts ties by docid as a string,
    # so d10 < d100 < d11 < ... < d9; zsearch's own order is the corpus row order.
    rows = [{"id": f"d{i}", "title": "", "text": "same words here"} for i in range(40, 0, -1)]
    corpus = write(tmp_path / "c.jsonl", rows)
    pys = load_index(build_index(corpus, tmp_path / "p", {"bm25_preset": "pyserini"}))
    assert [p.id for p in pys.search(["words"], 3)[0]] == ["d1", "d10", "d11"]
    own = load_index(build_index(corpus, tmp_path / "z", {}))
    assert [p.id for p in own.search(["words"], 3)[0]] == ["d40", "d39", "d38"]


def test_cli_preset_flag(tmp_path: Path) -> None:
    corpus = write(tmp_path / "c.jsonl", [{"id": "a", "text": "possibly trekking"}])
    result = CliRunner().invoke(app, ["index", str(corpus), "--out", str(tmp_path / "i"), "--bm25-preset", "pyserini"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "i" / "manifest.json").read_text())["params"]["k1"] == 0.9
    result = CliRunner().invoke(app, ["index", str(corpus), "--out", str(tmp_path / "j"), "--bm25-preset", "lucene"])
    assert result.exit_code == 2 and "unknown BM25 preset 'lucene'" in result.stderr
