"""Every Parquet artifact zsearch reads or writes, declared in one place.

Each artifact is an :class:`~zsearch_cli.artifacts.Artifact`: a pyarrow schema plus the checks
its rows must pass. Stages never call ``pq.read_table``/``pq.write_table`` themselves; they use
``artifacts.read_artifact`` (which validates and names file, column and row on error) and
``artifacts.write_artifact`` / ``ArtifactWriter`` (atomic, with the resolved config and the
zsearch version in the Parquet key-value metadata). This module only declares the tables; it is
long because it holds every one of them.
"""

from __future__ import annotations

import pyarrow as pa

from zsearch_cli.artifacts import Artifact

_str = pa.string()
_strs = pa.list_(pa.string())
_i32s = pa.list_(pa.int32())
_f32s = pa.list_(pa.float32())

CORPUS = Artifact(
    "corpus",
    pa.schema([("id", _str), ("title", _str), ("text", _str)]),
    unique="id",
    text=("title", "text"),
)

QA = Artifact(
    "qa",
    pa.schema([
        ("id", _str),
        ("question", _str),
        ("golden_answers", _strs),
        ("metadata", _str),  # JSON object as text; free-form (type, supporting ids, hop, ...)
    ]),
    unique="id",
    nonempty=("question",),
    optional=frozenset({"metadata"}),
    text=("question",),
)

_i8s = pa.list_(pa.int8())

TRAJECTORY = Artifact(
    "trajectory",
    pa.schema([
        ("id", _str),               # "{row_id}#{sample_index}"
        ("row_id", _str),
        ("sample_index", pa.int32()),
        ("group_id", _str),         # unique per prompt (and per step), never a per-source index
        ("question", _str),
        ("golden_answers", _strs),
        ("prompt_ids", _i32s),      # the chat-templated prompt, exactly as fed to the model
        ("response_ids", _i32s),    # sampled ids (mask 1) and observation ids (mask 0)
        ("loss_mask", _i8s),        # 1 where the policy sampled the token
        ("logprobs", _f32s),        # sampler logprob per response token; 0.0 where mask is 0
        ("policy_version", _i32s),  # policy version that sampled each response token; -1 where mask is 0
        ("turns", _str),            # JSON list: per turn text, action, queries, doc ids, search log
        ("response_text", _str),    # decoded response, for humans only (never re-tokenized)
        ("prediction", _str),       # content of the last <answer>, null if none
        ("finish_reason", _str),    # answer | eos | length | max_turns | context | invalid
        ("num_turns", pa.int32()),
        ("num_searches", pa.int32()),
        ("num_invalid", pa.int32()),
        ("prompt_tokens", pa.int32()),
        ("response_tokens", pa.int32()),
        ("policy_tokens", pa.int32()),
    ]),
    unique="id",
    optional=frozenset({"policy_version"}),  # files written before the column existed lack it
)

PROTOCOL_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    # The protocol behind a number (zsearch_cli/protocol.py builds it; the names must match
    # protocol.PROTOCOL_FIELDS): on every EVAL_SUMMARY row and every METRICS row.
    ("model", _str),                # --model as given
    ("model_revision", _str),       # hub commit, or sha256s:… of a local folder's weights
    ("adapter", _str),              # LoRA adapter (eval: its folder@fingerprint; train: lora r=…)
    ("corpus_fingerprint", _str),
    ("corpus_size", pa.int64()),
    ("retriever", _str),            # bm25 | dense | hybrid | http:URL | serpapi | sim:… | none
    ("bm25_k1", pa.float64()),
    ("bm25_b", pa.float64()),
    ("bm25_analyzer", _str),
    ("encoder", _str),
    ("topk", pa.int32()),
    ("max_turns", pa.int32()),
    ("max_turn_tokens", pa.int32()),
    ("max_obs_tokens", pa.int32()),
    ("prompt", _str),               # protocol/method:hash of the prompt text
    ("metric_version", _str),
    ("decoding", _str),             # greedy | sampling
    ("temperature", pa.float64()),
    ("top_p", pa.float64()),
    ("seed", pa.int64()),
    ("dataset", _str),              # the dataset key
    ("dataset_fingerprint", _str),  # sha256 of the QA file(s)
    ("split", _str),
    ("limit", pa.int64()),          # --limit; null = the full set
    ("full_set", pa.bool_()),
)
_PROTOCOL_NAMES = frozenset(name for name, _ in PROTOCOL_COLUMNS)
"""Columns holding a protocol value: an artifact with one declares them ``stored`` (no key of a
--search URL in a row, as in the metadata; tests/test_schemas.py checks every artifact)."""

EVAL_EXAMPLE = Artifact(
    "eval_example",
    pa.schema([
        ("dataset", _str),
        ("method", _str),
        ("id", _str),
        ("question", _str),
        ("golden_answers", _strs),
        ("prediction", _str),       # null when the model gave no <answer>
        ("em", pa.float32()),
        ("f1", pa.float32()),
        ("subem", pa.float32()),
        ("searches", pa.int32()),
        ("turns", pa.int32()),
        ("tokens", pa.int32()),     # response tokens (sampled + observation)
        ("finish_reason", _str),
        ("trajectory", _str),       # the decoded response, observations included
        ("turn_log", _str),         # JSON per-turn log from the engine
    ]),
    unique="id",
    stored=_PROTOCOL_NAMES,
)

EVAL_SUMMARY = Artifact(
    "eval_summary",
    pa.schema([
        ("dataset", _str),
        ("method", _str),
        ("model", _str),
        ("n", pa.int32()),
        ("missing", pa.int32()),     # --predictions: questions without a prediction (scored 0)
        ("em", pa.float64()),
        ("f1", pa.float64()),
        ("subem", pa.float64()),
        ("answered", pa.float64()),  # fraction with an extractable <answer>
        ("avg_searches", pa.float64()),
        ("avg_turns", pa.float64()),
        ("avg_tokens", pa.float64()),
        *[c for c in PROTOCOL_COLUMNS if c[0] not in ("dataset", "model")],
        # The corpus ceiling (`zsearch audit` of the same corpus and QA file, over the same
        # questions): the share answerable, and answer recall@topk of the same retriever; null
        # without a matching audit.
        ("audit_answerable", pa.float64()),
        ("audit_recall", pa.float64()),
        # Averages over datasets (zsearch_cli/averages.py): a row with `average` set ("plain" or
        # "weighted by n"; dataset = its label, "avg (plain)") averages `datasets`, whose scored
        # counts (the weights) and EMs are `sizes` and `dataset_em`, in that order; n is their
        # sum. null on a dataset's own row.
        ("average", _str),
        ("standard_n", pa.int64()),  # the standard test-set size of the benchmark(s); null for other data
        ("datasets", _strs),
        ("sizes", pa.list_(pa.int64())),
        ("dataset_em", pa.list_(pa.float64())),
    ]),
    # summaries written before these existed
    optional=_PROTOCOL_NAMES | {"missing", "audit_answerable", "audit_recall", "average", "standard_n", "datasets",
                                "sizes", "dataset_em"},
    stored=_PROTOCOL_NAMES,
)

PREDICTIONS = Artifact(
    "predictions",
    pa.schema([("id", _str), ("prediction", _str), ("golden_answers", _strs)]),
    unique="id",
    optional=frozenset({"golden_answers"}),
)

ROLLOUT_PROPOSER_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    # Dr. Zero proposer runs (`zsearch propose`, HRPO): what the batch reward measured; null otherwise.
    ("hops", pa.int32()),             # the hop count the prompt asked for (HRPO's group)
    ("solver_k", pa.int32()),         # solver answers that matched the proposed answer, of n
    ("gate_pass", pa.bool_()),        # the integrity gate: a question and an answer not inside it
    ("difficulty", pa.float32()),     # I(0<k<n)(n-k)/(n-1)
    ("format_reward", pa.float32()),  # r_f, the four format components
    ("proposed_question", _str),
    ("proposed_answer", _str),
    ("solver_answers", _strs),        # the n solver predictions ("" = no <answer>)
)

ROLLOUT = Artifact(
    "rollout",
    pa.schema([
        *TRAJECTORY.schema,
        ("step", pa.int32()),        # training step that sampled it
        ("gen_batch", pa.int32()),   # generation batch within the step (DSPO samples several)
        ("reward", pa.float32()),    # the training reward (metric + optional format bonus)
        ("em", pa.float32()),
        ("f1", pa.float32()),
        ("subem", pa.float32()),
        ("advantage", pa.float32()),  # A_i; PPO: mean of A_t over the policy tokens; null if not trained on
        ("kept", pa.bool_()),         # used for the update (DSPO drops uniform-reward groups)
        *ROLLOUT_PROPOSER_COLUMNS,
    ]),
    unique="id",
    optional=TRAJECTORY.optional | {"advantage"} | frozenset(name for name, _ in ROLLOUT_PROPOSER_COLUMNS),
)

_f64 = pa.float64()
METRIC_COLUMNS: tuple[str, ...] = (
    # rollout/: every trajectory the step generated (kept or not), so they describe the policy.
    # logp_mismatch: mean |sampler - training forward| logprob over the policy tokens;
    # sync_mismatch (--backend vllm): max |engine - policy| logprob on a fixed probe after the sync.
    # staleness (--rollout-overlap): policy versions between the sampler and the trained weights,
    # mean over the trained policy tokens.
    "rollout/reward_mean", "rollout/reward_std", "rollout/em", "rollout/f1", "rollout/subem",
    "rollout/response_length", "rollout/policy_tokens", "rollout/turns", "rollout/searches", "rollout/invalid",
    "rollout/answered", "rollout/logp_mismatch", "rollout/sync_mismatch", "rollout/staleness",
    # truncated_frac: samples whose last turn hit the token cap (or the context budget) without an
    # answer or EOS; garbage_frac / repeat_frac: the policy's own text (train/guard.py).
    "rollout/truncated_frac", "rollout/garbage_frac", "rollout/repeat_frac",
    # Search behaviour (zsearch_cli/audit/behaviour.py; searches per sample is rollout/searches):
    # no_search_rate: samples that answered without searching; answer_in_context: samples whose
    # retrieved text held a gold answer; repeated_query_rate: queries repeating one of the same
    # sample; answer_tokens: words of the normalised answer (F1's tokens), over samples with one.
    "rollout/no_search_rate", "rollout/answer_in_context", "rollout/repeated_query_rate", "rollout/answer_tokens",
    # offpolicy/: rollout correction between the sampler (pi_rollout) and the trainer's pi_old
    # (docs/methods.md §4.8), over the policy tokens: k3 KL(rollout||old), chi2 per token and per
    # sequence, the IS weights' mean and max and the share capped at C, the share rejected.
    "offpolicy/k3_kl", "offpolicy/chi2_token", "offpolicy/chi2_seq", "offpolicy/weight_mean",
    "offpolicy/weight_max", "offpolicy/capped_frac", "offpolicy/rejected_frac", "offpolicy/rejected_seq_frac",
    # guard/: the collapse guard (train/guard.py): events this step, and rollbacks so far.
    "guard/events", "guard/rollbacks",
    # actor/: the policy update. Every statistic a policy loss returns (algos/__init__.py lists
    # them), averaged over the step's optimizer steps; samples = sequences trained on.
    "actor/loss", "actor/pg_loss", "actor/clipfrac", "actor/approx_kl", "actor/ratio_mean", "actor/ratio_max",
    "actor/token_ratio_mean", "actor/token_ratio_max", "actor/kl_ref", "actor/entropy", "actor/seq_logp_mean",
    "actor/grad_norm", "actor/lr", "actor/samples",
    # critic/: PPO's value update, every statistic its value loss returns.
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr",
    # filter/: DSPO's dynamic filter (gen_batches is logged for every algorithm).
    "filter/kept_groups", "filter/kept_frac", "filter/gen_batches", "filter/tokens_wasted",
    # search/: what the search backend reports (the simulator's noise probability p(t)).
    "search/noise_p",
    # proposer/: Dr. Zero proposer runs (HRPO): mean difficulty I(0<k<n)(n-k)/(n-1) and format
    # reward over the step's proposals, mean solver k over the questions that pass the gate,
    # how many pass, and how many proposals of each hop count the step drew.
    "proposer/difficulty", "proposer/format_reward", "proposer/solver_k", "proposer/gate_pass",
    "proposer/hops_1", "proposer/hops_2", "proposer/hops_3", "proposer/hops_4",
    # val/: --val-data, greedy validation of the policy after this step, on a real search engine;
    # over several data_source values val/em is the pooled mean, avg (weighted by n), and
    # em_plain avg (plain), each source once (zsearch_cli/averages.py).
    "val/em", "val/f1", "val/subem", "val/em_plain",
    # time/: seconds; sync (--backend vllm, inside update) pushes the weights into the engine.
    "time/rollout", "time/reward", "time/update", "time/sync", "time/val", "time/step",
)  # fmt: skip
"""Per-step training metrics, all float64 (null when a metric does not apply to the run),
named ``namespace/name``; ``step`` counts from 1, as the console and the checkpoints do."""

METRICS = Artifact(
    "metrics",
    pa.schema([("step", pa.int32()), *[(c, _f64) for c in METRIC_COLUMNS], *PROTOCOL_COLUMNS]),
    unique="step",
    optional=frozenset(METRIC_COLUMNS) | _PROTOCOL_NAMES,
    stored=_PROTOCOL_NAMES,
)

PROPOSED_QA = Artifact(
    "proposed_qa",
    pa.schema([
        # The QA columns first: a proposed set is a valid QA file for `zsearch solve`.
        ("id", _str),
        ("question", _str),
        ("golden_answers", _strs),      # [the proposer's answer]
        ("metadata", _str),             # JSON: hops, source_id
        ("hops", pa.int32()),
        ("source_id", _str),            # the corpus passage the proposal started from
        ("proposer_answer", _str),
        ("solver_answers", _strs),      # the n solver predictions ("" = no <answer>)
        ("k", pa.int32()),              # EM-correct solver answers
        ("n", pa.int32()),
        ("difficulty", pa.float64()),   # I(0<k<n)(n-k)/(n-1)
        ("fmt_think", pa.float64()),
        ("fmt_tool", pa.float64()),
        ("fmt_question", pa.float64()),
        ("fmt_answer", pa.float64()),
        ("format_total", pa.float64()),
        ("reward", pa.float64()),       # difficulty + format_total (0 when the gate fails)
    ]),
    unique="id",
    nonempty=("question",),
)

COLLECTED_QUERY = Artifact(
    "collected_query",
    pa.schema([
        # One row per search a trajectory ran against a real engine (`zsearch collect`):
        # the query-document pairs ZeroSearch's simulator is fine-tuned on (paper §3.3).
        ("id", _str),               # "{trajectory_id}/t{turn}/q{query_index}"
        ("row_id", _str),           # the QA row
        ("trajectory_id", _str),    # TRAJECTORY.id, "{row_id}#{sample_index}"
        ("sample_index", pa.int32()),
        ("turn", pa.int32()),       # 0-based turn of the trajectory that issued the query
        ("query_index", pa.int32()),  # position within the turn (tool calls may carry several)
        ("question", _str),
        ("golden_answers", _strs),
        ("query", _str),
        ("doc_ids", _strs),         # as returned, best first
        ("documents", _strs),       # one per doc id: "title\ntext"
        ("prediction", _str),       # the trajectory's final answer, null without one
        ("correct", pa.bool_()),    # EM of that answer against the golds
    ]),
    unique="id",
    nonempty=("query",),
)

JUDGMENT = Artifact(
    "judgment",
    pa.schema([
        *COLLECTED_QUERY.schema,
        ("label", _str),            # useful | noisy | null (the judge's output did not parse)
        ("parse_ok", pa.bool_()),
        ("parse_error", _str),      # why it did not parse; null when parse_ok
        ("judge_output", _str),     # the judge's raw text
        ("judge_model", _str),
    ]),
    unique="id",
)

SFT_EXAMPLE = Artifact(
    "sft_example",
    pa.schema([
        # One supervised example for `zsearch sft`: the loss covers the completion only.
        ("id", _str),               # optional; kept for tracing a row back to its source
        ("prompt", _str),           # raw text (chat-templated by `sft --chat-template`)
        ("completion", _str),       # the target text; EOS is appended by the trainer
        ("metadata", _str),         # optional JSON object as text (label, source, ...)
    ]),
    nonempty=("completion",),
    optional=frozenset({"id", "metadata"}),
    stored=_PROTOCOL_NAMES,
)

AUDIT_STAMP: tuple[tuple[str, pa.DataType], ...] = (
    # What an audit was computed from (`zsearch audit`, zsearch_cli/audit/): `zsearch eval` shows
    # the ceiling beside EM only when these equal its own corpus and QA file.
    ("audit_version", _str),
    ("corpus_fingerprint", _str),
    ("corpus_size", pa.int64()),
    ("index", _str),                # SearchIndex.name: corpus, kinds and a hash of the index parameters
    ("retriever", _str),            # the method recall@k was measured with: bm25 | dense | hybrid
    ("bm25_k1", pa.float64()),      # and its settings, as the eval protocol records them
    ("bm25_b", pa.float64()),
    ("bm25_analyzer", _str),
    ("encoder", _str),
    ("dataset_fingerprint", _str),  # sha256 of the QA file (protocol.file_fingerprint)
    ("split", _str),
    ("limit", pa.int64()),          # --limit; null = the full set
)

AUDIT_EXAMPLE = Artifact(
    "audit_example",
    pa.schema([
        # One question of `zsearch audit`: where its gold answers occur in the corpus.
        ("dataset", _str),
        ("id", _str),
        ("question", _str),
        ("golden_answers", _strs),
        ("answerable", pa.bool_()),         # some gold occurs in some passage (FlashRAG normalisation, token sequence)
        ("answers_found", _strs),           # the golds that occur somewhere
        ("answer_passage_ids", _strs),      # for each of those, a passage holding it
        ("gold_passage_id", _str),          # the passage the gold probe puts first: best-ranked holder, else the first
        ("answer_rank", pa.int32()),        # 1-based rank of the first retrieved passage holding a gold; null past depth 10
        ("retrieved_ids", _strs),           # the retriever's top 10 for the question itself
        ("support_kind", _str),             # title | id | null (the data names no support)
        ("support", _strs),                 # the supporting titles (ids) the data names
        ("support_missing", _strs),         # those not in the corpus
        ("support_covered", pa.bool_()),    # all of them are in the corpus; null without support
    ]),
    unique="id",
    stored=_PROTOCOL_NAMES,
)

AUDIT_SUMMARY = Artifact(
    "audit_summary",
    pa.schema([
        ("dataset", _str),
        ("n", pa.int32()),
        ("answerable", pa.float64()),
        *[(f"recall_at_{k}", pa.float64()) for k in (1, 3, 5, 10)],  # audit.corpus.RECALL_AT
        ("support_n", pa.int32()),          # questions whose data names supporting titles (ids)
        ("support_coverage", pa.float64()),  # the share of those whose titles all exist; null when support_n is 0
        ("seconds", pa.float64()),
        *AUDIT_STAMP,
    ]),
    stored=_PROTOCOL_NAMES,
)

PROBE_SUMMARY = Artifact(
    "probe_summary",
    pa.schema([
        # `zsearch eval --probe` (zsearch_cli/audit/probe_eval.py): one row per dataset and probe.
        ("dataset", _str),
        ("method", _str),                    # agent, or agent+PROBE: the method of the probe's eval files
        ("probe", _str),                     # real | empty | random | shuffled | gold
        ("n", pa.int32()),
        ("em", pa.float64()),
        ("f1", pa.float64()),
        ("subem", pa.float64()),
        ("avg_searches", pa.float64()),
        ("avg_turns", pa.float64()),
        ("answer_attribution", pa.float64()),  # correct answers whose string appeared in retrieved text, of the correct
        ("over_search", pa.float64()),         # searches run after a gold answer appeared, of all searches
        ("under_search", pa.float64()),        # wrong answers given without any search, of all questions
        ("answer_in_context", pa.float64()),   # questions whose retrieved text held a gold answer
        ("subem_em_gap", pa.float64()),
        ("candidate_lists", pa.float64()),     # answers hedging between candidates ("A or B"), of all questions
        ("reliance", pa.float64()),            # EM(real) - EM(empty); null without both probes
        ("gold_headroom", pa.float64()),       # EM(gold) - EM(real); null without both probes
    ]),
    stored=_PROTOCOL_NAMES,
)

SIM_CONTROL = Artifact(
    "sim_control",
    pa.schema([
        # The simulator's controllability (zsearch_cli/audit/controllability.py): one row per
        # held-out query and forced quality, the documents it wrote and which hold a gold answer.
        ("id", _str),                   # ROW_ID/QUALITY
        ("row_id", _str),               # the held-out question
        ("quality", _str),              # useful | noisy: the word the prompt carried
        ("question", _str),
        ("golden_answers", _strs),
        ("query", _str),
        ("documents", _strs),           # the topk documents the policy would see (padding included)
        ("has_answer", pa.list_(pa.bool_())),  # per document: a gold answer in it (audit.answers)
        ("padded", pa.bool_()),         # fewer documents parsed than topk: the rest are the placeholder
        ("raw", _str),                  # the simulator's text
        ("simulator", _str),
    ]),
    unique="id",
)

ALL_ARTIFACTS: dict[str, Artifact] = {
    a.name: a for a in (CORPUS, QA, TRAJECTORY, EVAL_EXAMPLE, EVAL_SUMMARY, PREDICTIONS, ROLLOUT, METRICS, PROPOSED_QA,
              COLLECTED_QUERY, JUDGMENT, SFT_EXAMPLE, AUDIT_EXAMPLE, AUDIT_SUMMARY,
              PROBE_SUMMARY, SIM_CONTROL)
}
