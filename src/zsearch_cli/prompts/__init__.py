"""Every prompt zsearch sends to a model, as constants plus small render functions.

The templates come from the papers and their authors' code (docs/methods.md §2);
reconstructions are marked where the extracted paper text lost layout. Render functions
only substitute fields: they never reword, so a template change is always a visible diff
in this file.
"""

from __future__ import annotations

import json
from typing import Sequence

# --------------------------------------------------------------------------------------
# Search-R1 / ZeroSearch policy (docs/methods.md §2.1; Search-R1's code, verbatim).
#
# This is the Search-R1 *code*'s text (scripts/data_process/nq_search.py), which differs
# from the paper's Table 1 in small ways: no comma after "</search>", "as many times as
# your want" (sic), a comma before "without", and "<answer> Beijing </answer>" instead of
# "<answer> xxx </answer>". ZeroSearch's Table 1 reads like Search-R1's paper table. The
# Search-R1 code also appends "\n" after {question}; we do not.
# --------------------------------------------------------------------------------------
SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <search> query </search> and it will return "
    "the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can "
    "directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)

# The observation for a turn with neither a search nor an answer (docs/methods.md §2.2, verbatim,
# including the leading and trailing newline).
INVALID_ACTION_OBSERVATION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

# --------------------------------------------------------------------------------------
# ZeroSearch simulator prompt (Table 2; docs/methods.md §2.3). The paper's table omits the
# quotes around the question; ZeroSearch's code has them, and so do we. The code also
# ends the prompt with "\n" after "Output:"; we do not.
# --------------------------------------------------------------------------------------
SIMULATOR_TEMPLATE = (
    "You are the Google search engine.\n"
    "Given a query, you need to generate five {quality} documents for the query.\n"
    "\n"
    'The user is trying to answer the question: "{question}" whose answer is {answer}.\n'
    "Each document should contain about 30 words, and these documents should contain "
    "{quality} information.\n"
    "\n"
    "Query: {query}\n"
    "{Quality} Output:"
)
SIMULATOR_QUALITIES = ("useful", "noisy")

# --------------------------------------------------------------------------------------
# Dr. Zero (paper Figures 5 and 6).
#
# The "System" half of both figures is what Qwen2.5's chat template renders when it is
# given the search tool below; it is reproduced here for engines that build prompts
# without a tool-aware chat template. The line breaks, which the paper extraction lost,
# follow Qwen2.5's template ("\n\n# Tools\n\n…<tools>\n{json}\n</tools>…").
# --------------------------------------------------------------------------------------
SEARCH_TOOL_SCHEMA: dict = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the web for relevant information based on the given query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "description": (
                        "A list of fully-formed semantic queries. "
                        "The tool will return search results for each query."
                    ),
                    "enum": None,
                }
            },
            "required": ["query_list"],
        },
        "strict": False,
    },
}

DRZERO_SYSTEM_PROMPT = (
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n" + json.dumps(SEARCH_TOOL_SCHEMA, ensure_ascii=False) + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# Figure 5, the proposer's user message. The words are the paper's; the line layout (lost
# in extraction) and the leading/trailing newline are those of the authors' release
# (verl/prompts.py, DEFAULT_CHALLENGER_PREFIX), whose text matches the figure word for word.
# The figure writes the placeholder as {hop}; the release as {hops}.
DRZERO_PROPOSER_TEMPLATE = """
You are an expert in question generation. Craft one challenging, deterministic question and its single, unambiguous answer based on the provided source document. The logical path must start from the document and require exactly n hops (i.e., n-1 searches) to reach the final answer.

### Definitions
1. Hop: A node in the reasoning chain. Hop 1 is the starting entity found in the document. Hop n is the final answer.

### Inputs
1. n: the exact number of hops in the reasoning chain (requiring n-1 searches).
2. Source document: the full source text.

### Process & Tools
1. Analyze the Document and Select the Starting Point
  - Read and analyze the source document.
  - Select a specific entity, event or detail explicitly mentioned in the text. This entity becomes Hop 1 (the initial clue).
2. Design the Chain Forwards
  - From Hop 1 to Hop 2: Identify a factual attribute or relation of Hop 1 that is NOT in the text but can be found via search. The result is Hop 2.
  - Iterate: Continue connecting the current Hop i to the next Hop i+1 using deterministic, verifiable relation found via search.
  - Stop at Hop n: Continue this process until you have exactly n hops. Hop n must be a single, canonical final answer.
3. Reasoning & Search Protocol
  - Always reason inside `<think> ... </think>` when you plan connections or receive new information.
  - For each hop transition that requires external information, issue search query using `<tool_call> ... </tool_call>`.
  - Search results will be provided between `<tool_response> ... </tool_response>` by the system.
4. Output Format
  - Emit a numbered sequence of EXACTLY n-1 search steps. For each search i (1 to n-1), produce:
    `<think> Reasoning step i: Identify Hop i in document/search results, formulate query to reach Hop i+1 </think>`
    `<tool_call> Query to search Hop i+1 </tool_call>`
    `[Wait for search results in <tool_response> from system]`
  - After completing all searches and arriving at Hop n, output the question and final answer:
    `<think> Final reasoning step: Confirm the chain is complete with Hop n and formulate the question </think>`
    `<question> A challenging question that provides Hop 1 (the initial clue) and asks for the final answer (Hop n) </question>`
    `<answer> The single, concise final answer (Hop n) </answer>`

### Examples
1. Example template for Hop n = 1, i.e. no search:
  `<think> [Explain how Hop 1 is selected from the source document and how the question is formulated] </think>`
  `<question> [Question based solely on the text entity Hop 1] </question>`
  `<answer> [Answer (Hop 1)] </answer>`
2. Example template for Hop n = 3, i.e. 2 searches:
  `<think> [Reasoning step 1: Find Hop 1 in the source document, formulate the query to reach Hop 2] </think>`
  `<tool_call> [Search query to find Hop 2 based on Hop 1] </tool_call>`
  `[Wait for search results in <tool_response> from system]`
  `<think> [Reasoning step 2: Reason on search results to identify Hop 2 and write the next query to find Hop 3] </think>`
  `<tool_call> [Search query to find Hop 3 based on Hop 2] </tool_call>`
  `[Wait for search results in <tool_response> from system]`
  `<think> [Final reasoning step: Confirm Hop 3 in search results and formulate the question starting from Hop 1] </think>`
  `<question> [Question starting with Hop 1, requiring the solver to find Hop 2 to eventually reach the Answer (Hop 3)] </question>`
  `<answer> [Answer (Hop 3)] </answer>`

### Critical Rules
1. Start in Document: Hop 1 must be explicitly present in the source text. Every subsequent hop must be supported by the corresponding search results.
2. Search is mandatory for n > 1: Each link between hops beyond Hop 1 must use the search engine.
3. Exact search count: Emit exactly (n-1) `<tool_call>` entries, no more, no fewer.
4. No spoilers: The question must mention only Hop 1; do not include or hint at intermediate hops.
5. Clarity: The question is self-contained; the answer is concise and direct (no extra commentary, formatting or explanation).
6. Chain integrity: Each hop must depend strictly on the previous hop. No hop should be skippable or derivable without its immediate predecessor.

Now, generate a question and its answer with n = {hops} hops starting from the following source document: {document}
"""

# Figure 6, the solver's user message (verbatim; identical to the release's
# DEFAULT_SOLVER_PREFIX). It is the Search-R1 template with <search>/<information>
# swapped for <tool_call>/<tool_response>.
DRZERO_SOLVER_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <tool_call> query </tool_call> and it will "
    "return the top searched results between <tool_response> and </tool_response>. You can "
    "search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)


def render_policy_prompt(question: str) -> str:
    """The Search-R1/ZeroSearch user turn for ``question`` (inserted as given)."""
    return SEARCH_R1_TEMPLATE.format(question=question)


def render_simulator_prompt(quality: str, question: str, answer: str | Sequence[str], query: str) -> str:
    """ZeroSearch's Table 2 prompt for one simulated search call.

    ``question`` and ``answer`` must belong to the trajectory that issued ``query``
    (docs/methods.md §2.3: ZeroSearch's code mixes rows up). A list of gold answers is
    accepted; the prompt uses the first, as ZeroSearch does.
    """
    if quality not in SIMULATOR_QUALITIES:
        raise ValueError(f"simulator quality must be 'useful' or 'noisy', not {quality!r}")
    if not isinstance(answer, str):
        if not answer:
            raise ValueError("the simulator prompt needs at least one gold answer")
        answer = answer[0]
    return SIMULATOR_TEMPLATE.format(
        quality=quality, Quality=quality.capitalize(), question=question, answer=answer, query=query
    )


def format_source_document(title: str, text: str) -> str:
    """The proposer's source document as Dr. Zero's release builds it:
    ``(Title: "T")\\ntext\\n`` (wiki-18 titles keep their quotes, see Figure 7).

    Dr. Zero then truncates this string to 256 tokens; that needs a tokenizer, so the
    caller does it before :func:`render_proposer_prompt`.
    """
    return f'(Title: "{title}")\n{text}\n'


# Ours, not the paper's (`--proposer-prompt short`, stages/drzero-mini.sh): smollm2 (135M) given
# Figure 5's ~2,600 tokens of instructions wrote a <question> in none of 8 proposals; with this
# one worked example 8 of 8 passed the format gate (best of 2), without one it copied the format
# lines themselves. 1-hop only: the example asks for a fact of the document, with no search. Its
# facts are not in the bundled corpus, so a proposal copying it (7 of those 8 did) cannot be
# answered from it, and `--answer-reward grounded` pays its answer nothing (docs/drzero-mini.md).
DRZERO_SHORT_PROPOSER_TEMPLATE = """Write one question about the document below, and its short answer. The answer must be a name, a date or a number taken from the document, and it must not appear in the question. Use exactly this format:
<question> your question </question>
<answer> your answer </answer>

Example document: (Title: "Sydney Opera House") The Sydney Opera House is a performing arts centre in Sydney, Australia. It was designed by the Danish architect Jorn Utzon and opened in 1973.
<question> Which Danish architect designed the Sydney Opera House? </question>
<answer> Jorn Utzon </answer>

Document: {document}"""

PROPOSER_PROMPTS = {"figure5": DRZERO_PROPOSER_TEMPLATE, "short": DRZERO_SHORT_PROPOSER_TEMPLATE}
"""``--proposer-prompt``: the template of each choice, with ``{hops}`` and ``{document}``."""


def render_proposer_prompt(hops: int, document: str, style: str = "figure5") -> str:
    """The proposer prompt ``style`` (Figure 5 by default) with ``n`` = ``hops`` and the
    (already truncated) source document."""
    if not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be a positive integer, not {hops!r}")
    if style not in PROPOSER_PROMPTS:
        raise ValueError(f"unknown proposer prompt {style!r}: use one of {', '.join(PROPOSER_PROMPTS)}")
    return PROPOSER_PROMPTS[style].format(hops=hops, document=document)


def render_solver_prompt(question: str) -> str:
    """Figure 6's user message for ``question`` (inserted as given)."""
    return DRZERO_SOLVER_TEMPLATE.format(question=question)
