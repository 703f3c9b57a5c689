"""ZeroSearch's simulated search engine: an LLM writes the documents (paper §3.3–3.4).

``--search sim:MODEL_OR_PATH`` generates in-process (``load_backend``; one batched call per
turn), ``--search sim+http://host:port/v1`` asks an OpenAI-compatible server (``vllm serve``).
Options (:class:`SimConfig`) come from factory keyword arguments or from the spec itself,
``sim:PATH?noise_end=0.75&mode=prompt``, so a ``--search`` string alone can configure it.

Per call: the quality is drawn from the noise curriculum at the current step (noisy with
probability p(t)); the prompt carries the question and first gold answer of **the row that
issued the query** (SearchRequest fields, never a batch position); the output is parsed into
exactly ``topk`` documents, re-asked once and then padded (flagged) when short. Everything is
logged in ``SearchResult.log``, which the engine stores in the turn's ``search_log``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError, shown_kind, shown_name, shown_spec
from zsearch_cli.prompts.simulator import PROMPT_MODE_SYSTEM
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchBackend, SearchBackendError, SearchRequest, SearchResult
from zsearch_cli.search.curriculum import NoiseCurriculum, derived_seed
from zsearch_cli.search.sim_text import (
    MODES,
    PLACEHOLDER_DOC,
    SFT_DOCS,
    SIM_CHAT_TEMPLATE,
    parse_documents,
    render_request_prompt,
)


@dataclass
class SimConfig:
    """Simulator options (factory keyword arguments or ``?key=value`` in the spec)."""

    mode: str = "sft"
    """sft: the Table 2 prompt for a fine-tuned simulator; prompt: our one-shot prompt for an
    untuned instruct model."""
    noise_start: float = 0.0
    """p_s. Paper: 0 for Qwen-2.5 (3B and 7B), 0.25 for LLaMA-3.2-3B."""
    noise_end: float = 0.25
    """p_e. Default: the paper's Qwen-2.5-3B setting (0→0.25), the closest to the small
    models zsearch runs by default; 7B uses 0.75, LLaMA-3.2-3B 0.5."""
    noise_base: float = 4.0
    """b in eq. 1 (paper default 4)."""
    noise_schedule: str = "curriculum"
    """curriculum (eq. 1) or fixed (p = noise_start at every step; the paper's random ablation
    is fixed at 0.5)."""
    seed: int = 0
    """Seeds the quality draws and the simulator's sampling."""
    temperature: float = 0.7
    """Simulator sampling temperature. The paper does not state one; 0.7 keeps documents
    varied across calls while the format stays stable. 0 is greedy (and disables re-asking)."""
    top_p: float = 1.0
    max_tokens: int = 320
    """Five ~30-word documents are ~200 tokens; the rest is slack for the Doc i: prefixes."""
    max_doc_chars: int = 800
    """Each parsed document is cut to this many characters (at a word boundary)."""
    reask: bool = True
    """Re-ask once, with a new seed, when fewer than topk documents come back."""
    cache_size: int = 10_000
    """LRU entries keyed by (query, quality, question); 0 disables the cache."""
    timeout: float = 60.0
    """Seconds per HTTP request."""
    retries: int = 3
    """HTTP retries after the first attempt (exponential backoff)."""
    backoff: float = 1.0
    concurrency: int = 16
    """HTTP requests in flight at most."""
    model: str | None = None
    """sim+http: the server's model name (--sim-model); default: GET /v1/models, first id."""
    backend: str = "hf"
    """sim:MODEL: hf, vllm or auto. hf by default so the simulator does not compete with a
    vLLM policy for GPU memory; for throughput serve it with `vllm serve` and use sim+http."""
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ZsearchError(f"unknown simulator mode {shown_name(str(self.mode))}: use sft or prompt")
        if self.max_tokens < 1:
            raise ZsearchError(f"simulator max_tokens must be >= 1, not {self.max_tokens}")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "SimConfig":
        """Build from strings or values; names may use dashes. Unknown names are an error."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for raw_name, value in options.items():
            name = _option_name(raw_name)
            if name not in known:
                raise ZsearchError(f"unknown simulator option {shown_name(raw_name)}: use {', '.join(known)}")
            values[name] = _coerce(name, known[name].default, value)
        return cls(**values)


def _coerce(name: str, default: Any, value: Any) -> Any:
    if value is None or not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes")
        return type(default)(value)
    except ValueError:
        raise ZsearchError(f"simulator option {name}: its value is not a {type(default).__name__}") from None


def _doc_id(text: str) -> str:
    return "sim-" + hashlib.blake2b(text.encode("utf-8"), digest_size=6).hexdigest()


class SimulatedSearch(SearchBackend):
    """A :class:`~zsearch_cli.search.base.SearchBackend` whose documents an LLM writes.

    ``target`` is a model id/folder, or an ``http(s)://`` OpenAI-compatible base URL.
    ``generator`` injects a ready :class:`GenerationBackend` (tests, or a model already loaded).
    """

    def __init__(self, target: str, config: SimConfig | None = None, generator: Any = None):
        self.config = cfg = config or SimConfig()
        self.curriculum = NoiseCurriculum(cfg.noise_start, cfg.noise_end, cfg.noise_base, cfg.noise_schedule, cfg.seed)
        self.client = None
        self.generator = generator
        self._chat = cfg.mode == "prompt" or SIM_CHAT_TEMPLATE
        """Prompts wrapped in the model's chat template (HTTP: /chat/completions) or sent raw."""
        if target.startswith(("http://", "https://")):
            from zsearch_cli.llm_client import LLMClient

            self.client = LLMClient(target, cfg.model, api="chat" if self._chat else "completions", label="simulator",
                                    timeout=cfg.timeout, retries=cfg.retries, backoff=cfg.backoff,
                                    concurrency=cfg.concurrency)
            self.name = f"sim+{self.client.base_url}:{cfg.mode}"
        else:
            if generator is None:
                from zsearch_cli.models.factory import load_backend

                self.generator = load_backend(target, backend=cfg.backend, device=cfg.device, dtype=cfg.dtype)
            self.name = f"sim:{target}:{cfg.mode}"
        self._cache: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
        self._batches = 0

    # ------------------------------------------------------------------ progress

    def progress(self, step: int, total: int) -> None:
        self.curriculum.set_progress(step, total)

    @property
    def noise_p(self) -> float:
        """p(t) at the current step (the trainer logs it as ``search/noise_p``)."""
        return self.curriculum.p

    def metrics(self) -> dict[str, float]:
        return {"noise_p": float(self.noise_p)}

    # ------------------------------------------------------------------ search

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        """One result per request, in order; qualities drawn from the curriculum."""
        return self.simulate(requests, topk)

    def simulate(
        self, requests: Sequence[SearchRequest], topk: int, qualities: Sequence[str] | None = None
    ) -> list[SearchResult]:
        """Like :meth:`search`; ``qualities`` forces each request's quality (``zsearch search``)."""
        if not requests:
            return []
        cfg = self.config
        if topk < 1:
            raise ZsearchError(f"topk must be >= 1, not {topk}")
        if cfg.mode == "sft" and topk > SFT_DOCS:
            raise ZsearchError(f"the ZeroSearch simulator prompt asks for {SFT_DOCS} documents: use topk <= "
                               f"{SFT_DOCS} with --search sim (or mode=prompt)")
        if qualities is not None and len(qualities) != len(requests):
            raise ZsearchError(f"{len(qualities)} qualities for {len(requests)} requests")
        logs = [self._draw(r, None if qualities is None else qualities[i]) for i, r in enumerate(requests)]
        prompts = []
        for r, log in zip(requests, logs):
            try:
                prompts.append(render_request_prompt(cfg.mode, log["quality"], r.question, r.golden_answers,
                                                     r.query, topk))
            except ValueError as err:
                raise ZsearchError(f"row {r.row_id!r}: simulated search: {err}") from None
        docs: list[list[str] | None] = [None] * len(requests)
        owner: dict[tuple[str, str, str], int] = {}  # key -> the request generating it this call
        todo: list[int] = []
        for i, (r, log) in enumerate(zip(requests, logs)):
            key = (r.query, log["quality"], r.question)
            cached = self._cache_get(key, topk)
            if cached is not None:
                docs[i], log["cache_hit"] = cached, True
            elif cfg.cache_size > 0 and key in owner:
                log["cache_hit"] = True  # same key earlier in this batch: reuse its documents
            else:
                owner.setdefault(key, i)
                todo.append(i)
        self._generate(todo, requests, prompts, logs, docs, topk)
        results = []
        for i, (r, log) in enumerate(zip(requests, logs)):
            got = docs[i] if docs[i] is not None else docs[owner[(r.query, log["quality"], r.question)]]
            assert got is not None
            log["prompt"] = prompts[i]
            log["n_docs"] = len(got)
            passages = [Passage(id=_doc_id(d), title="", text=d) for d in got[:topk]]
            passages += [Passage(id=_doc_id(PLACEHOLDER_DOC), title="", text=PLACEHOLDER_DOC)
                         for _ in range(topk - len(passages))]
            log["padded"] = len(got) < topk
            results.append(SearchResult(passages=passages, log=log))
        return results

    def _draw(self, r: SearchRequest, quality: str | None) -> dict[str, Any]:
        """The start of a call's log: t, p(t), the draw (u, quality) and its identity. ``t`` is
        eq. 1's: the training steps done before this one (training step t + 1, 1-based)."""
        cur = self.curriculum
        call_index = cur.next_call_index(r.row_id, r.sample_index, r.query)
        log: dict[str, Any] = {"simulator": self.name, "mode": self.config.mode, "t": cur.step,
                               "p": cur.p, "call_index": call_index}
        if quality is None:
            log["u"], log["quality"] = cur.draw(r.row_id, r.sample_index, r.query, call_index)
        else:
            if quality not in ("useful", "noisy"):
                raise ZsearchError(f"simulator quality must be useful or noisy, not {quality!r}")
            log["u"], log["quality"] = None, quality
        log.update(cache_hit=False, reasked=False, raw=None, seed=None)
        return log

    def _generate(self, todo: list[int], requests, prompts, logs, docs, topk: int) -> None:
        """Generate for the requests in ``todo``; re-ask the short ones once; cache the full ones."""
        if not todo:
            return
        cfg, step = self.config, self.curriculum.step
        self._batches += 1
        seeds = [derived_seed(cfg.seed, step, requests[i].row_id, requests[i].sample_index, requests[i].query,
                              logs[i]["call_index"]) for i in todo]
        raws, seeds = self._complete([prompts[i] for i in todo], seeds, attempt=0)
        for i, seed, raw in zip(todo, seeds, raws):
            logs[i]["raw"], logs[i]["seed"] = raw, seed
            docs[i] = parse_documents(raw, topk, cfg.max_doc_chars)
        short = [i for i in todo if len(docs[i]) < topk]
        if short and cfg.reask and cfg.temperature > 0:
            seeds = [derived_seed(logs[i]["seed"], "reask") for i in short]
            raws, _ = self._complete([prompts[i] for i in short], seeds, attempt=1)
            for i, raw in zip(short, raws):
                again = parse_documents(raw, topk, cfg.max_doc_chars)
                logs[i]["reasked"], logs[i]["raw_reask"] = True, raw
                if len(again) > len(docs[i]):
                    docs[i] = again
        for i in todo:
            if len(docs[i]) >= topk:
                r = requests[i]
                self._cache_put((r.query, logs[i]["quality"], r.question), docs[i])

    def _complete(self, prompts: list[str], seeds: list[int], attempt: int) -> tuple[list[str], list[int]]:
        """Raw simulator outputs for ``prompts`` and the seeds used: ``seeds`` (one per
        request) over HTTP; in-process, one batched generate call with one call seed."""
        cfg = self.config
        system = PROMPT_MODE_SYSTEM if cfg.mode == "prompt" else None
        if self.client is not None:
            try:
                return self.client.complete(prompts, cfg.max_tokens, cfg.temperature, top_p=cfg.top_p, seeds=seeds,
                                            system=system), seeds
            except ZsearchError as err:
                raise SearchBackendError(str(err)) from None
        from zsearch_cli.models.base import SamplingParams
        from zsearch_cli.models.loading import apply_chat

        tok = self.generator.tokenizer
        if self._chat:
            ids = [apply_chat(tok, p, system=system) for p in prompts]
        else:  # the raw Table 2 text, with the tokenizer's own special tokens (BOS where it has one)
            ids = [list(tok.encode(p)) for p in prompts]
        # HFBackend seeds row i of a call from (call seed, i): the sampled text depends on the
        # row's place in this turn's batch (the quality draw does not; it is hashed per call).
        call_seed = derived_seed(cfg.seed, self.curriculum.step, self._batches, attempt)
        params = SamplingParams(max_new_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=call_seed)
        outs = self.generator.generate(ids, params)
        return [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs], [call_seed] * len(prompts)

    # ------------------------------------------------------------------ cache

    def _cache_get(self, key: tuple[str, str, str], topk: int) -> list[str] | None:
        hit = self._cache.get(key)
        if hit is None or len(hit) < topk:
            return None
        self._cache.move_to_end(key)
        return hit[:topk]

    def _cache_put(self, key: tuple[str, str, str], docs: list[str]) -> None:
        """Only complete answers are cached, so a padded one is tried again next time."""
        if self.config.cache_size <= 0:
            return
        self._cache[key] = list(docs)
        self._cache.move_to_end(key)
        while len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)


def parse_sim_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``sim:TARGET[?k=v&…]`` or ``sim+http(s)://…[?k=v&…]`` → (target, options)."""
    if spec.startswith("sim+"):
        target = spec[len("sim+"):]
        if not target.startswith(("http://", "https://")):
            raise ZsearchError(f"--search {shown_kind(spec)}: use sim+http://host:port/v1")
    elif spec.startswith("sim:"):
        target = spec[len("sim:"):]
    else:
        raise ZsearchError(f"--search {shown_kind(spec)} is not a simulator spec (sim:MODEL or sim+http://host:port/v1)")
    options: dict[str, str] = {}
    if "?" in target:
        target, query = target.split("?", 1)
        for part in filter(None, query.split("&")):
            name, eq, value = part.partition("=")
            if not eq:
                raise ZsearchError(f"--search {shown_spec(spec)}: option {shown_name(part)} needs a value (name=value)")
            options[name.strip()] = value.strip()
    if not target:
        raise ZsearchError(f"--search {shown_spec(spec)}: name the simulator model, e.g. sim:smollm2")
    return target, options


def spec_option_names(spec: str) -> set[str]:
    """The :class:`SimConfig` fields a ``sim:…?k=v`` spec sets (dashes and ``sim_`` prefixes
    normalised as ``from_options`` reads them)."""
    return {_option_name(k) for k in parse_sim_spec(spec)[1]}


def _option_name(raw: str) -> str:
    return raw.replace("-", "_").removeprefix("sim_")


def make_simulated_search(spec: str, generator: Any = None, **options: Any) -> SimulatedSearch:
    """The backend for a ``sim:``/``sim+http`` spec; keyword options win over the spec's."""
    target, spec_options = parse_sim_spec(spec)
    config = SimConfig.from_options({**spec_options, **{k: v for k, v in options.items() if v is not None}})
    return SimulatedSearch(target, config, generator=generator)

