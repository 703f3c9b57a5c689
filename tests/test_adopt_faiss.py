"""`zsearch index --adopt-faiss`: a faiss index built as Search-R1's `index_builder.py` builds
`e5_Flat.index` becomes the dense part without re-encoding, searches as faiss does on the
file, refuses each kind of mismatch in its own line, and refuses a changed or moved file.

MiniLM stands in for e5-base-v2 with E5's prefixes given explicitly (`--passage-prefix
'passage: ' --query-prefix 'query: '`), over the demo corpus in wiki-18's `contents` form,
every third sentence as a passage (579 passages).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import TORCH_THREADS
from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval import faiss_file
from zsearch_cli.retrieval.dense import Encoder, resolve_encoder
from zsearch_cli.retrieval.hybrid import DEPTH, rrf_fuse_batch
from zsearch_cli.retrieval.index import build_index, load_index

E5 = {"encoder": "minilm", "passage_prefix": "passage: ", "query_prefix": "query: ", "device": "cpu"}
QUESTIONS = [json.loads(line)["question"] for line in
             (Path(__file__).parents[1] / "src/zsearch_cli/data/demo/test.jsonl").read_text().splitlines()[:24]]


def search_r1_build(contents: list[str], model_path: str | Path, out: Path, *, prefix: str = "passage: ",
                    max_length: int = 256, batch_size: int = 64) -> Path:
    """Search-R1's `index_builder.py` (`build_dense_index` with `encode_all`), on CPU in fp32:
    `"passage: " + contents`, tokenizer(padding, truncation, max_length), mean pooling over
    the attention mask, L2 normalisation, float32, added in corpus order to
    `faiss.index_factory(dim, "Flat", METRIC_INNER_PRODUCT)`, then `write_index`. One thing
    differs: it batches 512 passages in corpus order, here batches of 64 are cut from the
    passages sorted by length (put back in corpus order before `add`), which pads 2-3x less
    on 2 cores. Padding is masked out of the mean, so only float rounding changes."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path), use_fast=True)
    model = AutoModel.from_pretrained(str(model_path)).eval()
    order = np.argsort([-len(doc) for doc in contents], kind="stable")
    chunks = []
    with torch.no_grad():
        for start in range(0, len(contents), batch_size):
            batch = [f"{prefix}{contents[i]}" for i in order[start : start + batch_size]]
            inputs = tokenizer(batch, padding=True, truncation=True, return_tensors="pt", max_length=max_length)
            hidden = model(**inputs, return_dict=True).last_hidden_state
            mask = inputs["attention_mask"]
            pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
            chunks.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    embeddings = np.empty((len(contents), chunks[0].shape[1]), dtype=np.float32)
    embeddings[order] = np.concatenate(chunks)
    return write_flat_ip(embeddings, out)


def write_flat_ip(embeddings: np.ndarray, out: Path) -> Path:
    import faiss

    index = faiss.index_factory(embeddings.shape[-1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(embeddings)
    faiss.write_index(index, str(out))
    return out


def write_wiki18(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """wiki-18 rows `{id, contents}`: every third sentence of the demo passages, under its title
    (579 passages of 9 to ~80 tokens, from all over the corpus: the demo's 525 whole passages
    would cost 6x the encoding time on 2 cores, and all 1,736 sentences 3x, for no other
    coverage)."""
    demo = Path(__file__).parents[1] / "src/zsearch_cli/data/demo/corpus.jsonl"
    out = []
    for line in demo.read_text().splitlines():
        r = json.loads(line)
        for j, sentence in enumerate(s for s in re.split(r"(?<=[.!?])\s+", r["text"]) if s):
            out.append({"id": f"{r['id']}.{j}", "contents": f'"{r["title"]}"\n{sentence}'})
    return out[::3]


@pytest.fixture(scope="module")
def files(rows: list[dict], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The corpus, its Search-R1 index, and a 240-passage corpus with its mismatched indexes."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.set_num_threads(TORCH_THREADS)
    d = tmp_path_factory.mktemp("adopt")
    minilm = resolve_encoder("minilm")
    contents = [r["contents"] for r in rows]
    small = rows[:240]
    small_contents = contents[:240]
    torch.manual_seed(0)  # another encoder of the same size (384) as MiniLM: a random 1-layer BERT
    other = d / "other-bert"
    BertModel(BertConfig(hidden_size=384, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(other)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(other)
    return {
        "corpus": write_wiki18(d / "wiki.jsonl", rows),
        "index": search_r1_build(contents, minilm, d / "e5_Flat.index"),
        "small": write_wiki18(d / "small.jsonl", small),
        "no_prefix": search_r1_build(small_contents, minilm, d / "no_prefix.index", prefix=""),
        "other_encoder": search_r1_build(small_contents, other, d / "other.index"),
        "short": search_r1_build(small_contents, minilm, d / "short.index", max_length=24),
        "unnormalised": write_flat_ip(2 * faiss_file.flat_vectors(faiss_file.open_flat(d / "e5_Flat.index"))[:240],
                                      d / "scaled.index"),
        "shuffled": write_wiki18(d / "shuffled.jsonl", [rows[i] for i in np.random.default_rng(1).permutation(len(rows))]),
    }


@pytest.fixture(scope="module")
def adopted(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`zsearch index CORPUS --adopt-faiss e5_Flat.index --kind hybrid`, through the CLI."""
    out = tmp_path_factory.mktemp("adopted") / "index"
    result = CliRunner().invoke(app, ["index", str(files["corpus"]), "--adopt-faiss", str(files["index"]),
                                      "--encoder", "minilm", "--passage-prefix", "passage: ", "--query-prefix",
                                      "query: ", "--kind", "hybrid", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_search_matches_faiss_on_the_file(adopted: Path, files: dict[str, Path]) -> None:
    import faiss

    index = load_index(adopted, device="cpu")
    hits = index.search(QUESTIONS, 10, "dense")
    # faiss itself on the file (read whole, not mapped), the same query vectors zsearch makes
    raw = faiss.read_index(str(files["index"]))
    encoder = Encoder("minilm", "cpu", query_prefix="query: ")
    scores, rows = raw.search(encoder.encode(QUESTIONS, "query"), 10)
    assert [[p.id for p in q] for q in hits] == [[r[0] for r in index.records(rr)] for rr in rows]
    assert np.array_equal(np.array([[p.score for p in q] for q in hits], dtype=np.float32), scores)
    # and queries encoded as Search-R1's retriever does ("query: ", mean pooling, normalised)
    search_r1_queries = faiss.read_index(str(search_r1_build([q for q in QUESTIONS], resolve_encoder("minilm"),
                                                             adopted.parent / "q.index", prefix="query: ")))
    q = faiss.rev_swig_ptr(search_r1_queries.get_xb(), len(QUESTIONS) * raw.d).reshape(len(QUESTIONS), raw.d)
    s2, r2 = raw.search(np.ascontiguousarray(q), 10)
    assert np.array_equal(r2, rows) and np.allclose(s2, scores, atol=1e-5)


def test_manifest_records_the_file_and_nothing_is_copied(adopted: Path, files: dict[str, Path]) -> None:
    manifest = json.loads((adopted / "manifest.json").read_text())
    dense = manifest["dense"]
    record = dense["adopted"]
    assert record["path"] == str(files["index"].absolute()) and record["bytes"] == files["index"].stat().st_size
    assert record["fingerprint"] == faiss_file.fingerprint(files["index"]) and record["metric"] == "inner_product"
    assert record["check"]["first"] == 16 and record["check"]["random"] == 16 and record["check"]["min_cosine"] >= 0.999
    assert (dense["encoder"], dense["pooling"], dense["normalize"], dense["prefixes"]) == \
        ("minilm", "mean", True, ["query: ", "passage: "])
    assert manifest["corpus"]["fingerprint"] and manifest["kinds"] == ["bm25", "dense"]
    assert [p.name for p in (adopted / "dense").iterdir()] == ["part.json"]  # no copy of the 0.9 MB file
    assert sum(f.stat().st_size for f in adopted.rglob("*") if f.is_file() and f.name != "corpus.arrow") \
        < files["index"].stat().st_size / 4


def test_hybrid_fuses_bm25_with_the_adopted_part(adopted: Path, files: dict[str, Path]) -> None:
    import faiss

    index = load_index(adopted, device="cpu")
    assert index.methods == ["bm25", "dense", "hybrid"] and index.resolve_method("auto") == "hybrid"
    hits = index.search(QUESTIONS, 5, "hybrid")
    depth = DEPTH
    _, bm25_rows = index.bm25.search(QUESTIONS, depth)
    raw = faiss.read_index(str(files["index"]))
    _, dense_rows = raw.search(Encoder("minilm", "cpu", query_prefix="query: ").encode(QUESTIONS, "query"), depth)
    rows, scores = rrf_fuse_batch(bm25_rows, dense_rows, 5)
    assert [[p.id for p in q] for q in hits] == [[r[0] for r in index.records(rr)] for rr in rows]
    assert [[p.score for p in q] for q in hits] == scores


def adopt(corpus: Path, faiss_path: Path, out: Path, **opts) -> Path:
    return build_index(corpus, out, {**E5, "adopt_faiss": faiss_path, **opts})


@pytest.mark.parametrize("case, corpus, message", [
    ("no_prefix", "small", r"no_prefix\.index was encoded without the passage prefix 'passage: ' \(\d+ of 32 sampled"),
    ("other_encoder", "small", r"other\.index does not hold 'minilm''s embeddings of this corpus .*cosine -?0\.\d+ at passage"),
    ("index", "shuffled", r"the corpus is in another order than e5_Flat\.index: passage \d+ of the corpus is stored as vector \d+"),
    ("short", "small", r"short\.index matches the sampled passages of up to \d+ tokens and none of the \d+ longer ones .*another --max-length than 256"),
    ("unnormalised", "small", r"scaled\.index's vectors are not L2-normalised \(norms 2\.000"),
    ("index", "small", r"e5_Flat\.index holds 579 vectors, the corpus has 240 passages"),
])
def test_each_mismatch_fails_with_its_own_line(case: str, corpus: str, message: str, files: dict[str, Path],
                                               tmp_path: Path) -> None:
    with pytest.raises(ZsearchError, match=message) as err:
        adopt(files[corpus], files[case], tmp_path / "idx")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "idx").exists() and not list(tmp_path.iterdir())  # nothing written, no temp left


def test_the_right_prefix_is_found_the_other_way_round(files: dict[str, Path], tmp_path: Path) -> None:
    """The file has E5's prefix, the options say none: the line says to pass it."""
    with pytest.raises(ZsearchError, match=r"e5_Flat\.index was encoded with the passage prefix 'passage: '.*"
                                           r"pass --passage-prefix 'passage: ' --query-prefix 'query: '"):
        adopt(files["corpus"], files["index"], tmp_path / "idx", passage_prefix="")


def test_header_mismatches_fail_before_the_corpus_is_read(files: dict[str, Path], tmp_path: Path) -> None:
    import faiss

    vectors = np.random.default_rng(0).standard_normal((240, 384)).astype(np.float32)
    cases = {"l2.index": (faiss.IndexFlatL2(384), r"l2\.index uses metric L2, not inner product"),
             "hnsw.index": (faiss.index_factory(384, "HNSW32,Flat", faiss.METRIC_INNER_PRODUCT),
                            r"hnsw\.index is a faiss IndexHNSWFlat; --adopt-faiss takes a Flat index"),
             "dim.index": (faiss.IndexFlatIP(128), r"dim\.index holds 128-dimensional vectors, encoder 'minilm' makes 384")}
    for name, (index, message) in cases.items():
        index.add(vectors[:, : index.d])
        faiss.write_index(index, str(tmp_path / name))
        with pytest.raises(ZsearchError, match=message):
            adopt(tmp_path / "no-such-corpus.jsonl", tmp_path / name, tmp_path / "idx")
    (tmp_path / "text.index").write_text("not faiss")
    with pytest.raises(ZsearchError, match=r"text\.index: not a readable faiss index \(Index type .* not recognized\)"):
        adopt(files["small"], tmp_path / "text.index", tmp_path / "idx")
    with pytest.raises(ZsearchError, match=r"--adopt-faiss makes the dense part, but --kind bm25 has none"):
        adopt(files["small"], files["index"], tmp_path / "idx", kind="bm25")
    with pytest.raises(ZsearchError, match=r"--faiss-type HNSW32 does not apply to --adopt-faiss"):
        adopt(files["small"], files["index"], tmp_path / "idx", faiss_type="HNSW32")


def test_a_changed_or_moved_file_is_refused_at_load(files: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 KiB blocks: the 0.9 MB file is fingerprinted by its samples, as a 60 GiB one is
    monkeypatch.setattr(faiss_file, "FINGERPRINT_BLOCK_BYTES", 4096)
    mine = shutil.copy(files["index"], tmp_path / "e5_Flat.index")
    out = adopt(files["corpus"], Path(mine), tmp_path / "idx")
    assert load_index(out, device="cpu").methods == ["dense"]  # --adopt-faiss alone: --kind dense
    data = Path(mine).read_bytes()
    vectors = faiss_file.flat_vectors(faiss_file.open_flat(files["index"]))
    write_flat_ip(vectors[::-1].copy(), Path(mine))  # the same vectors in another order: same size, other bytes
    with pytest.raises(ZsearchError, match=r"idx: the adopted faiss index .*e5_Flat\.index changed since it was adopted"):
        load_index(out, device="cpu")
    Path(mine).write_bytes(data[:-1536])  # four vectors short
    with pytest.raises(ZsearchError, match=r"is \d+ bytes, it was \d+ when adopted \(replaced or truncated\)"):
        load_index(out, device="cpu")
    Path(mine).write_bytes(data)
    Path(mine).rename(tmp_path / "moved.index")
    with pytest.raises(ZsearchError, match=r"e5_Flat\.index is missing \(moved or deleted\?\); adopt it again"):
        load_index(out, device="cpu")


def test_fingerprint_samples_fixed_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 64 blocks the file is sampled: a change in a block or of the size shows; one
    between blocks does not (the documented limit, for a file that no rebuild produces)."""
    monkeypatch.setattr(faiss_file, "FINGERPRINT_BLOCK_BYTES", 1024)
    path = tmp_path / "f.bin"
    data = np.random.default_rng(0).bytes(1 << 20)
    path.write_bytes(data)
    base = faiss_file.fingerprint(path)
    assert faiss_file.fingerprint(path) == base
    step = (len(data) - 1024) // 63
    for offset, shows in ((0, True), (len(data) - 1, True), (5 * step + 100, True), (5 * step + 2000, False)):
        edited = bytearray(data)
        edited[offset] ^= 0xFF
        path.write_bytes(edited)
        assert (faiss_file.fingerprint(path) != base) == shows, offset
    path.write_bytes(data + b"\0")
    assert faiss_file.fingerprint(path) != base
