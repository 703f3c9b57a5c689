"""Dense and hybrid retrieval: the bundled MiniLM, a tiny random BERT, faiss types, RRF."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.dense import plan_faiss_type, resolve_encoder
from zsearch_cli.retrieval.hybrid import rrf_fuse
from zsearch_cli.retrieval.index import build_index, load_index

PASSAGES = {
    "everest": ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    "photo": ("Photosynthesis", "Photosynthesis is how green plants use sunlight, water and carbon dioxide to make sugar."),
    "python": ("Python", "Python is a high-level programming language created by Guido van Rossum."),
    "paris": ("Paris", "Paris is the capital and most populous city of France."),
    "violin": ("Violin", "The violin is a wooden string instrument played with a bow."),
    "nile": ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
    "moon": ("Apollo 11", "Apollo 11 was the first crewed mission to land on the Moon, in July 1969."),
    "vaccine": ("Vaccine", "A vaccine trains the immune system to recognise and fight a pathogen."),
}


def write_corpus(path: Path, n_extra: int = 0) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for pid, (title, text) in PASSAGES.items():
            fh.write(json.dumps({"id": pid, "title": title, "text": text}) + "\n")
        for i in range(n_extra):
            fh.write(json.dumps({"id": f"x{i}", "title": f"Filler {i}", "text": f"filler passage number {i} about topic {i % 7}"}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("dense") / "corpus.jsonl", n_extra=32)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random BertModel (hidden 32) built from a config and saved with MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("enc") / "tiny-bert"
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_encoder("minilm")).save_pretrained(path)
    return path


def test_minilm_finds_paraphrased_passages(corpus: Path, tmp_path: Path) -> None:
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "dense"}))
    assert index.methods == ["dense"]
    queries = ["What is the tallest peak in the world?", "How do leaves turn light into food?",
               "Which river flows through Egypt?", "first people to walk on the lunar surface"]
    top = [hits[0].id for hits in index.search(queries, 3, "dense")]
    assert top == ["everest", "photo", "nile", "moon"]
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["dense"]["dim"] == 384 and manifest["dense"]["faiss_type"] == "Flat"
    emb = np.load(tmp_path / "idx" / "dense" / "embeddings.npy", mmap_mode="r")
    assert emb.dtype == np.float32 and emb.shape == (len(index), 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_tiny_random_bert_end_to_end(corpus: Path, tiny_bert: Path, tmp_path: Path) -> None:
    opts = {"kind": "dense", "encoder": str(tiny_bert), "batch_size": 7, "max_length": 32}
    index = load_index(build_index(corpus, tmp_path / "idx", opts))
    emb = np.load(tmp_path / "idx" / "dense" / "embeddings.npy")
    assert emb.shape == (40, 32)
    # Flat inner-product search over unit vectors: a passage's own text is its nearest neighbour.
    title, text = PASSAGES["violin"]
    hits = index.search([f'"{title}"\n{text}'], 5, "dense")[0]
    assert hits[0].id == "violin" and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_length_sorted_batches_do_not_change_embeddings(tiny_bert: Path) -> None:
    from zsearch_cli.retrieval.dense import Encoder

    texts = ["short", "a much longer passage with many more words in it than the others", "mid length text"]
    enc = Encoder(str(tiny_bert), "cpu", max_length=32, batch_size=2)
    together = enc.encode(texts)
    alone = np.stack([enc.encode([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("faiss_type, planned", [("HNSW32", "HNSW32"), ("IVF64,PQ8", "IVF1,PQ8x5"),
                                                  ("IVF16,Flat", "IVF1,Flat")])
def test_faiss_types(corpus: Path, tiny_bert: Path, tmp_path: Path, faiss_type: str, planned: str,
                     capsys: pytest.CaptureFixture[str]) -> None:
    opts = {"kind": "dense", "encoder": str(tiny_bert), "faiss_type": faiss_type}
    index = load_index(build_index(corpus, tmp_path / "idx", opts))
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["dense"]["faiss_type"] == planned  # 40 passages: nlist -> 40 // 39, 2**5 <= 40
    if planned != faiss_type:
        assert "too few" in capsys.readouterr().err
    hits = index.search(["violin bow", "river"], 4, "dense")
    assert all(len(h) >= 1 for h in hits)


def test_faiss_type_errors() -> None:
    with pytest.raises(ZsearchError, match="PQ7 must divide the embedding size 32"):
        plan_faiss_type("IVF4,PQ7", 1000, 32)
    with pytest.raises(ZsearchError, match="unsupported faiss type 'LSH'"):
        plan_faiss_type("LSH", 1000, 32)
    assert plan_faiss_type("IVF4,PQ8", 100_000, 32) == "IVF4,PQ8x8"


def test_e5_prefixes(corpus: Path, tiny_bert: Path, tmp_path: Path) -> None:
    e5 = shutil.copytree(tiny_bert, tmp_path / "my-e5-small")
    build_index(corpus, tmp_path / "idx", {"kind": "dense", "encoder": str(e5)})
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["dense"]["prefixes"] == ["query: ", "passage: "]


def test_rrf_fuse_by_hand() -> None:
    # k = 60: a is 1st and 3rd -> 1/61 + 1/63 = 0.032266; b is 2nd in both -> 2/62 = 0.032258;
    # c is 1st in one only -> 1/61 = 0.016393; -1 (no result) is ignored.
    rows, scores = rrf_fuse([[0, 1, 5], [2, 1, 0, -1]], topk=3)
    assert rows == [0, 1, 2]
    assert scores == pytest.approx([1 / 61 + 1 / 63, 2 / 62, 1 / 61])


def test_hybrid_search_and_thread_safety(corpus: Path, tiny_bert: Path, tmp_path: Path) -> None:
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "hybrid", "encoder": str(tiny_bert)}))
    assert index.methods == ["bm25", "dense", "hybrid"]
    assert index.resolve_method("auto") == "hybrid"
    queries = [f"{title} {text.split()[3]}" for title, text in PASSAGES.values()]
    want = index.search(queries, 3, "hybrid")
    bm25 = index.search(queries, 100, "bm25")
    dense = index.search(queries, 100, "dense")
    row_of = {index.get(row).id: row for row in range(len(index))}
    for w, b, d in zip(want, bm25, dense):
        rows, scores = rrf_fuse([[row_of[p.id] for p in b], [row_of[p.id] for p in d]], 3)
        assert [row_of[p.id] for p in w] == rows
        assert [p.score for p in w] == pytest.approx(scores)
    # Concurrent callers on every method get exactly the sequential answers.
    jobs = [(q, m) for q in queries for m in ("bm25", "dense", "hybrid")] * 2
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda job: index.search([job[0]], 3, job[1])[0], jobs))
    for (q, m), hits in zip(jobs, got):
        assert hits == index.search([q], 3, m)[0]


def test_torch_flat_fallback_matches_exact_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-faiss-gpu CUDA path, run on CPU: chunked fp16 matmul + top-k merge is exact."""
    from zsearch_cli.retrieval.dense import _TorchFlat

    monkeypatch.setattr(_TorchFlat, "CHUNK", 7)  # several chunks, so the merge is exercised
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((30, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    queries = emb[:4] + 0.01
    scores, rows = _TorchFlat(emb, "cpu").search(queries, 5)
    assert rows.tolist() == np.argsort(-(queries @ emb.T), axis=1)[:, :5].tolist()
    np.testing.assert_allclose(scores, np.sort(queries @ emb.T, axis=1)[:, ::-1][:, :5], atol=2e-3)


def test_cli_hybrid_index_and_search(corpus: Path, tiny_bert: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    out = str(tmp_path / "idx")
    result = CliRunner().invoke(app, ["index", str(corpus), "--out", out, "--kind", "hybrid", "--encoder",
                                      str(tiny_bert), "--faiss-type", "HNSW32", "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["search", "violin bow string instrument", "--index", out, "-k", "2"])
    assert result.exit_code == 0, result.output
    assert "hybrid top-2" in result.stdout and "violin" in result.stdout


@pytest.mark.parametrize("victim, action", [("dense/index.faiss", "truncate"), ("dense/index.faiss", "delete"),
                                            ("dense/embeddings.npy", "truncate")])
def test_missing_or_truncated_dense_files_are_rebuild_errors(corpus: Path, tiny_bert: Path, tmp_path: Path,
                                                             victim: str, action: str) -> None:
    out = build_index(corpus, tmp_path / "idx", {"kind": "dense", "encoder": str(tiny_bert), "max_length": 32})
    path = out / victim
    if action == "delete":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ZsearchError, match=f"{victim}.*rebuild the index") as err:
        load_index(out).search(["violin"], 3, "dense")
    assert "\n" not in str(err.value)


def test_a_faiss_gpu_index_goes_to_the_process_gpu_not_gpu_0():
    # Under `accelerate launch` each process's torch device is its own GPU; the index used to
    # go to ordinal 0 whatever the device, so 8 processes put 8 copies of a wiki-18 index on
    # the first GPU. No GPU here: the ordinal is a pure function of the device and torch's
    # current device (injected).
    from zsearch_cli.retrieval.dense import gpu_number

    assert gpu_number("cuda:3") == 3
    assert gpu_number("cuda", current=lambda: 5) == 5  # plain "cuda": the process's current GPU
    assert gpu_number("cuda:0", current=lambda: 5) == 0  # an explicit ordinal wins
