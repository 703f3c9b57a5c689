"""The protocol behind a number: every setting that changes an EM/F1 (or a training curve).

Built here, in one place, for ``zsearch eval`` (one per dataset, on every EVAL_SUMMARY row)
and for training (on every METRICS row); :data:`PROTOCOL_FIELDS` names the columns that
``schemas.py`` declares, and the same values go into the Parquet metadata under
``zsearch.protocol``. Nothing here loads a model or an index: fingerprints are read from
files (the index manifest, the model folder, the hub cache), so it costs milliseconds.

``zsearch eval`` also uses it to decide whether an earlier run's rows may be reused: a rerun
into the same ``--out`` resumes only when its protocol and options equal the saved ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

METRIC_VERSION = "squad-v1"
"""Bump when ``rewards.score_answer`` changes. v1: SQuAD normalisation (lowercase, drop
punctuation and the articles a/an/the, collapse whitespace); EM = a normalised gold equals
the normalised prediction; subEM = a normalised gold is a substring of it; F1 over
whitespace tokens, the best over the golds; no <answer> scores 0 (tests/test_eval_protocol.py pins it)."""

_SAMPLE_BYTES = 1 << 20
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "config.json", "adapter_config.json", "*.gguf")


@dataclass(frozen=True)
class Protocol:
    """What a reader needs to compare two numbers. None: does not apply (or is unknown)."""

    model: str
    """--model as given: an HF id, a path or an alias."""
    model_revision: str | None
    """HF commit of a hub model (from the local hub cache), or ``sha256s:…`` of a local
    folder's weights (sampled: see _sampled_fingerprint)."""
    adapter: str | None
    """A LoRA adapter: its folder@fingerprint (eval of an adapter checkpoint; model = its base), or
    ``lora r=…`` (training). An adapter on an adapter base is the whole stack, base side first,
    joined by `` + ``: ``smollm2-warm@sha256s:… + runs/x/final@sha256s:…``."""
    corpus_fingerprint: str | None
    corpus_size: int | None
    retriever: str
    """bm25 | dense | hybrid | http:URL | serpapi | sim:… | none (no retrieval)."""
    bm25_k1: float | None
    bm25_b: float | None
    bm25_analyzer: str | None
    encoder: str | None
    topk: int | None
    max_turns: int | None
    max_turn_tokens: int | None
    max_obs_tokens: int | None
    prompt: str
    """The action protocol / method and a hash of the prompt text actually sent."""
    metric_version: str
    decoding: str
    """greedy (temperature 0) or sampling; ``unknown`` for another system's predictions, ``none`` for sft."""
    temperature: float | None
    top_p: float | None
    seed: int | None
    dataset: str
    """The dataset key (see data/qa.py dataset_key); training: the train data."""
    dataset_fingerprint: str | None
    """sha256 of the QA file(s): two files under one key are told apart."""
    split: str | None
    limit: int | None
    """--limit, or None for the full set."""
    full_set: bool
    """Every row of the dataset was scored (False: a --limit subset)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def one_line(self) -> str:
        """For humans, under ``zsearch eval``'s table."""
        model = self.model + (f"@{self.model_revision[:24]}" if self.model_revision else "")
        parts = [f"model {model}" + (f" + adapter {self.adapter}" if self.adapter else "")]
        if self.retriever != "none":
            corpus = (f"corpus {self.corpus_fingerprint[:12]} ({self.corpus_size} docs)"
                      if self.corpus_fingerprint else "corpus unknown")
            ret = self.retriever
            if self.bm25_k1 is not None:
                ret += f" k1={self.bm25_k1:g} b={self.bm25_b:g} {self.bm25_analyzer}"
            if self.encoder:
                ret += f" encoder={self.encoder}"
            parts += [corpus, ret, f"top-{self.topk}"]
        if self.max_turns:
            parts.append(f"turns {self.max_turns} x {self.max_turn_tokens} tok, obs {self.max_obs_tokens} tok")
        else:
            parts.append(f"one turn of {self.max_turn_tokens} tok")
        parts.append(f"prompt {self.prompt}")
        parts.append(f"metric {self.metric_version}")
        parts.append(f"greedy (seed {self.seed})" if self.decoding == "greedy"
                     else f"sampling T={self.temperature:g} top-p={self.top_p:g} seed {self.seed}")
        return "protocol: " + "; ".join(parts)


PROTOCOL_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Protocol))

RESUME_FIELDS = tuple(f for f in PROTOCOL_FIELDS if f not in ("limit", "full_set"))
"""What a resumed eval must match: everything but which rows were asked for."""


def file_fingerprint(*paths: str | Path) -> str | None:
    """sha256 of the files' bytes (QA files are small), None when one cannot be read."""
    digest = hashlib.sha256()
    try:
        for p in paths:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    except OSError:
        return None
    return "sha256:" + digest.hexdigest()[:32]


# ----------------------------------------------------------------------------- pieces


def _sampled_fingerprint(folder: Path) -> str | None:
    """A cheap stand-in for hashing every weight (tens of GB): per file its name, its size,
    the first and last MiB and 64 blocks of 64 KiB spread evenly over it. Training moves
    nearly every weight, so a retrained folder differs; the cost is a few MiB of reads."""
    digest = hashlib.sha256()
    files = sorted({p for g in _WEIGHT_GLOBS for p in folder.glob(g) if p.is_file()})
    if not files:
        return None
    for p in files:
        size = p.stat().st_size
        digest.update(f"{p.name}\0{size}\0".encode())
        offsets = [0, max(0, size - _SAMPLE_BYTES)] + [size * i // 64 for i in range(1, 64)]
        with open(p, "rb") as fh:
            for i, offset in enumerate(offsets):
                fh.seek(offset)
                digest.update(fh.read(_SAMPLE_BYTES if i < 2 else 1 << 16))
    return "sha256s:" + digest.hexdigest()[:32]


def _hub_revision(repo_id: str) -> str | None:
    """The commit of ``repo_id`` in the local hub cache (what a load without network uses)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - no hub package / malformed id: the revision is unknown
        return None
    return Path(found).parent.name if isinstance(found, str) else None


def model_identity(model: str) -> tuple[str, str | None, str | None]:
    """(model, revision, adapter) for ``--model``: an adapter folder reports its base model."""
    from zsearch_cli.models.loading import SMOLLM2_ALIAS, WARM_ALIAS, adapter_base, is_lora_checkpoint, resolve_model_path
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.models.warm import shipped_dir

    # smollm2 is dequantized into the cache now if it is not there yet (the run loads it next
    # anyway): naming the cache folder before it exists gave the first run on a machine no
    # revision, unlike every later run. The warm adapter is named by its shipped files.
    aliases = {SMOLLM2_ALIAS: lambda: Path(resolve_model_path(SMOLLM2_ALIAS)), WARM_ALIAS: shipped_dir}
    path = aliases[model]() if model in aliases else Path(model).expanduser()
    if path.is_dir():
        if is_lora_checkpoint(path):
            try:
                base = adapter_base(path)
            except ZsearchError:
                base = "?"
            base_model, base_rev, base_layers = model_identity(str(base))
            # a base that is itself an adapter (smollm2-warm: smollm2 + the shipped warm layer)
            # stays in the record: the same adapter on another warm layer is another model
            return base_model, base_rev, _stacked(base_layers, f"{model}@{_sampled_fingerprint(path)}")
        return model, _sampled_fingerprint(path), None
    return model, _hub_revision(model), None


ADAPTER_JOIN = " + "
"""Between the layers of an adapter stack in ``Protocol.adapter``, base side first:
``smollm2-warm@sha256s:… + runs/x/final@sha256s:…``."""


def _stacked(*layers: str | None) -> str | None:
    return ADAPTER_JOIN.join(layer for layer in layers if layer) or None


def adapter_layers(adapter: str | None) -> list[str]:
    """The layers of a recorded adapter stack, base side first (empty for None)."""
    return adapter.split(ADAPTER_JOIN) if adapter else []


def _retriever(search: str, index: str | Path | None, strict: bool) -> dict[str, Any]:
    """Retriever fields for a ``--search`` spec, from the index manifest (no index load).
    Not ``strict``: an unreadable manifest leaves the corpus unknown (a trainer given its
    own search object); strict (eval): the one-line error, before any model loads."""
    from zsearch_cli.search.factory import INDEX_METHODS

    from zsearch_cli.errors import stored_value

    spec = search.strip()
    # the record (and the protocol line eval prints) never holds a key (errors.stored_value); the
    # live spec still reaches the served corpus below
    out: dict[str, Any] = dict(retriever=stored_value(spec), corpus_fingerprint=None, corpus_size=None, bm25_k1=None,
                               bm25_b=None, bm25_analyzer=None, encoder=None)
    if spec in INDEX_METHODS:
        from zsearch_cli.errors import ZsearchError
        from zsearch_cli.retrieval.index import read_manifest

        try:
            manifest = read_manifest(Path(index) if index is not None else Path("runs/index"))
        except ZsearchError:
            if strict:
                raise
            return out
        from zsearch_cli.retrieval.settings import index_settings

        out.update(index_settings(manifest, spec))
    elif spec.startswith(("http://", "https://")):
        out.update(_served_corpus(spec))
    return out


REMOTE_SETTINGS = ("corpus_fingerprint", "corpus_size", "bm25_k1", "bm25_b", "bm25_analyzer", "encoder")


def _served_corpus(url: str) -> dict[str, Any]:
    """A ``zsearch serve`` says its index and retriever settings in /health (``settings``;
    older servers: the fingerprint prefix and size only); other servers (Search-R1's) do
    not, and those fields are recorded as unknown. The retriever stays the URL. Replicas
    (``http://a,http://b``) serve one index: the first that answers says its settings."""
    import requests

    for replica in (u.strip() for u in url.split(",") if u.strip()):
        try:
            health = requests.get(replica.rstrip("/") + "/health", timeout=2).json()
            settings = health.get("settings")
            if isinstance(settings, dict):
                return {k: settings.get(k) for k in REMOTE_SETTINGS}
            fingerprint = str(health["index"]).split("-")[0]
            return {"corpus_fingerprint": fingerprint, "corpus_size": int(health["n_docs"])}
        except Exception:  # noqa: BLE001 - not a zsearch server, or down: the search itself will say so
            continue
    return {}


def prompt_id(protocol: str, method: str = "agent", template: str | None = None) -> str:
    """``tags/agent:1a2b3c4d``: the action protocol, the method, and a hash of the prompt
    text a placeholder question is sent as (catches a prompt edited between versions)."""
    from zsearch_cli.rollout.protocols import PROTOCOLS

    proto = PROTOCOLS[protocol]() if protocol in PROTOCOLS else None
    text = json.dumps([protocol, method, template, proto.system_prompt if proto else None,
                       proto.build_prompt("QUESTION") if proto else None])
    return f"{protocol}/{method}:{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def build_protocol(options: Mapping[str, Any], *, dataset: str, dataset_fingerprint: str | None,
                   split: str | None, limit: int | None, full_set: bool, method: str = "agent", template: str | None = None,
                   adapter: str | None = None, strict: bool = True) -> Protocol:
    """The protocol of a run from its resolved options (eval's or train's names, which agree:
    model, search, index, topk, max_turns, max_turn_tokens, max_obs_tokens, protocol,
    temperature, top_p, seed). ``method`` direct/cot use no retrieval."""
    model, revision, model_adapter = model_identity(str(options["model"]))
    retrieves = method in ("agent", "rag")  # direct, cot (and sft) use no retrieval
    ret = _retriever(str(options.get("search") or "bm25"), options.get("index"), strict) if retrieves else dict(
        retriever="none", corpus_fingerprint=None, corpus_size=None, bm25_k1=None, bm25_b=None,
        bm25_analyzer=None, encoder=None)
    temperature = float(options.get("temperature") or 0.0)
    agent = method == "agent"

    def num(key: str, applies: bool = True) -> int | None:
        return int(options[key]) if applies and options.get(key) is not None else None

    return Protocol(
        model=model, model_revision=revision, adapter=_stacked(model_adapter, adapter), **ret,
        topk=num("topk", retrieves), max_turns=num("max_turns", agent) if agent else 0,
        max_turn_tokens=num("max_turn_tokens"), max_obs_tokens=num("max_obs_tokens", agent),
        prompt="sft" if method == "sft" else prompt_id(str(options.get("protocol") or "tags"), method, template),
        metric_version=METRIC_VERSION,  # sft: nothing is sampled, the loss is teacher-forced
        decoding="none" if method == "sft" else "greedy" if temperature == 0 else "sampling", temperature=temperature,
        top_p=float(options.get("top_p") if options.get("top_p") is not None else 1.0),
        seed=int(options.get("seed") or 0),
        dataset=dataset, dataset_fingerprint=dataset_fingerprint, split=split, limit=limit, full_set=full_set,
    )


def training_protocol(config: Mapping[str, Any]) -> Protocol:
    """The protocol of a training run's metrics, from its resolved config (TrainConfig or
    SFT's): the model it started from, the rollout settings, the training data."""
    from zsearch_cli.data.qa import dataset_key

    data = config.get("train_data") or config.get("data")
    if config.get("algo") == "hrpo":  # the Dr. Zero proposer draws seed passages, not QA: see corpus_*
        key, split, fingerprint = "corpus", None, None
    elif data:
        files = [p.strip() for p in str(data).split(",") if p.strip()]
        key, split = ",".join(dataset_key(Path(f), None)[0] for f in files), None
        fingerprint = file_fingerprint(*files)
    else:
        from zsearch_cli.data.demo import demo_qa

        key, split, fingerprint = "demo", "train", file_fingerprint(demo_qa("train"))
    lora = config.get("lora_r") or 0
    method = "agent" if "topk" in config else "sft"
    return build_protocol(config, dataset=key, dataset_fingerprint=fingerprint, split=split, limit=None,
                          full_set=True, method=method, adapter=f"lora r={lora} alpha={config.get('lora_alpha')}"
                          if lora else None, strict=False)


def differing(saved: Mapping[str, Any], now: Mapping[str, Any], may_change: set[str] | frozenset[str] = frozenset(),
              ) -> list[str]:
    """``name=old->new`` for every key of ``now`` whose value differs from ``saved``, except
    ``may_change``: the rule ``train --resume`` and ``eval``'s reuse of rows both follow."""
    return [f"{k}={saved.get(k)!r}->{now[k]!r}" for k in now if k not in may_change and saved.get(k) != now[k]]
