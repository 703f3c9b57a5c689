"""Protocol parsers and renderers against well-formed, malformed and adversarial turns,
plus the exact prompt templates."""

from __future__ import annotations

import json

import pytest

from zsearch_cli import prompts
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.rollout.protocols import (
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    PROTOCOLS,
    Action,
    Protocol,
    TagsProtocol,
    ToolCallProtocol,
    format_passages,
    get_protocol,
    render_observation_parts,
    tool_response_payload,
    truncate_at_stop,
    wrap_information,
)

TAGS = TagsProtocol()
TOOL = ToolCallProtocol()
P1 = Passage("1", "Paris", "Paris is the capital of France.", 0.9)
P2 = Passage("2", "Lyon", "Lyon is a city.", 0.5)
P3 = Passage("3", "Nice", "Nice is on the coast.", 0.1)


def call(queries: object, name: str = "search") -> str:
    body = json.dumps({"name": name, "arguments": {"query_list": queries}})
    return f"<think>t</think> <tool_call> {body} </tool_call>"


# ------------------------------------------------------------------ registry / interface


def test_registry_is_a_plain_dict_of_classes() -> None:
    assert type(PROTOCOLS) is dict
    assert PROTOCOLS == {"tags": TagsProtocol, "tool_call": ToolCallProtocol}
    assert isinstance(get_protocol("tags"), Protocol)
    with pytest.raises(ZsearchError, match="unknown --protocol 'xml': use one of tags, tool_call"):
        get_protocol("xml")


def test_stop_strings() -> None:
    assert TAGS.stop_strings == ["</search>", "</answer>"]
    assert TOOL.stop_strings == ["</tool_call>", "</answer>"]
    TAGS.stop_strings.append("x")  # a fresh list each time
    assert TAGS.stop_strings == ["</search>", "</answer>"]


def test_truncate_at_stop_earliest_wins() -> None:
    assert truncate_at_stop("a</answer>b</search>c", ["</search>", "</answer>"]) == "a</answer>"
    assert truncate_at_stop("no stop", ["</search>"]) == "no stop"


# ------------------------------------------------------------------ tags: parse


def test_tags_search_and_answer() -> None:
    assert TAGS.parse("<think>x</think>\n<search>  capital of France \n</search>") == Action(
        kind="search", queries=["capital of France"]
    )
    a = TAGS.parse("<think>x</think><answer> Paris </answer>")
    assert a == Action(kind="answer", answer="Paris")


def test_tags_neither_is_invalid() -> None:
    a = TAGS.parse("<think>I am not sure what to do</think>")
    assert a.kind == "invalid" and "no complete <search> or <answer>" in (a.error or "")


@pytest.mark.parametrize(
    "text",
    [
        "<think>x</think><search> unclosed query",  # ran out of tokens
        "<think>x</think><answer> Paris",  # unclosed answer
        "<think>x</think> capital </search>",  # closing without opening
        "<think>x</think><search>   </search>",  # empty query
        "",
    ],
)
def test_tags_malformed_is_invalid(text: str) -> None:
    assert TAGS.parse(text).kind == "invalid"


def test_tags_nested_search_takes_last_opening() -> None:
    # The model restarted its query; the text after the last <search> is the query.
    assert TAGS.parse("<search> draft <search> final query </search>").queries == ["final query"]


def test_tags_first_complete_action_in_text_order_wins() -> None:
    # Generation stops at the first closing stop string, so anything after it was
    # never really generated: answer first -> answer; search first -> search.
    assert TAGS.parse("<answer> Paris </answer> <search> q </search>").kind == "answer"
    a = TAGS.parse("<search> q </search> <answer> Paris </answer>")
    assert a.kind == "search" and a.queries == ["q"]


def test_tags_stop_inside_think_is_invalid() -> None:
    # Generation stopped at the literal "</search>" inside the reasoning.
    assert TAGS.parse("<think>I will use </search> later</think><search>q</search>").kind == "invalid"


def test_tags_huge_query_is_capped() -> None:
    a = TAGS.parse("<search>" + "x" * 10_000 + "</search>")
    assert a.kind == "search" and len(a.queries[0]) == MAX_QUERY_CHARS


def test_tags_empty_answer_is_an_answer() -> None:
    # Like Search-R1: the trajectory ends; the empty prediction earns no reward.
    assert TAGS.parse("<answer></answer>") == Action(kind="answer", answer="")


# ------------------------------------------------------------------ tags: render


def test_tags_observation_exact() -> None:
    # docs/methods.md §2.2:
    # "\n\n<information>Doc 1(Title: …) …\nDoc 2(Title: …) …</information>\n\n"
    obs = TAGS.render_observation([[P1, P2]], Action(kind="search", queries=["q"]))
    assert obs == (
        '\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.\n'
        'Doc 2(Title: "Lyon") Lyon is a city.</information>\n\n'
    )


def test_tags_parts_let_the_engine_cut_whole_passages() -> None:
    parts = render_observation_parts([P1, P2, P3])
    assert parts[2] == 'Doc 3(Title: "Nice") Nice is on the coast.\n'
    assert wrap_information(parts[:1]) == (
        '\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.</information>\n\n'
    )
    assert format_passages([P1]) == 'Doc 1(Title: "Paris") Paris is the capital of France.'


def test_tags_titleless_passage_uses_zerosearch_form() -> None:
    assert format_passages([Passage("s1", "", "simulated text")]) == "Doc 1: simulated text"


def test_tags_no_results_and_fixed_texts() -> None:
    assert TAGS.render_observation(None) == "\n\n<information></information>\n\n"
    assert TAGS.render_invalid(Action(kind="invalid", error="x")) == prompts.INVALID_ACTION_OBSERVATION
    assert TAGS.render_no_search_left().startswith("\n\n<information>")
    assert TAGS.render_no_search_left().endswith("</information>\n\n")


def test_tags_build_prompt_like_search_r1_data_scripts() -> None:
    p = TAGS.build_prompt("  who wrote hamlet ")
    assert p.endswith("Question: who wrote hamlet?")
    assert TAGS.build_prompt("Who?").endswith("Question: Who?")
    assert TAGS.system_prompt is None and TAGS.end_on_invalid is False


# ------------------------------------------------------------------ tool_call: parse


def test_tool_call_well_formed_multi_query() -> None:
    a = TOOL.parse(call(["who founded X", " when was X founded "]))
    assert a == Action(kind="search", queries=["who founded X", "when was X founded"])


def test_tool_call_answer() -> None:
    assert TOOL.parse("<think>t</think><answer> Robert Harvey </answer>").answer == "Robert Harvey"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("<tool_call> {name: search} </tool_call>", "not valid JSON"),
        ("<tool_call> search('x') </tool_call>", "not valid JSON"),
        ("<tool_call> __import__('os').system('rm -rf /') </tool_call>", "not valid JSON"),
        ('<tool_call> ["search"] </tool_call>', "JSON object"),
        (call(["q"], name="browse"), "unknown tool 'browse'"),
        ('<tool_call> {"arguments": {"query_list": ["q"]}} </tool_call>', "unknown tool 'None'"),
        ('<tool_call> {"name": "search", "arguments": "{}"} </tool_call>', "'arguments'"),
        ('<tool_call> {"name": "search", "arguments": {}} </tool_call>', "query_list"),
        (call([]), "non-empty list"),
        (call("just a string"), "non-empty list"),
        (call(["ok", 3]), "query 2"),
        (call(["ok", "  "]), "query 2 in 'query_list' is empty"),
        (call(["q"] * (MAX_QUERIES + 1)), "too many queries (9 > 8)"),
        # a recursion bomb, then an unclosed call
        ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", "not valid JSON"),
        ('<tool_call> {"name": "search", "arguments": {"query_list": ["q"]}}', "no complete"),
    ],
)
def test_tool_call_malformed(text: str, needle: str) -> None:
    a = TOOL.parse(text)
    assert a.kind == "invalid" and needle in (a.error or ""), a.error


def test_tool_call_unknown_tool_name_is_truncated_in_error() -> None:
    a = TOOL.parse(call(["q"], name="x" * 1000))
    assert a.kind == "invalid" and len(a.error or "") < 200


def test_tool_call_huge_query_capped() -> None:
    a = TOOL.parse(call(["y" * 5000]))
    assert a.kind == "search" and len(a.queries[0]) == MAX_QUERY_CHARS


def test_tool_call_multiple_calls_first_wins() -> None:
    # Generation stops at the first </tool_call>; the second call was never generated.
    a = TOOL.parse(call(["first"]) + call(["second"]))
    assert a.queries == ["first"]


def test_tool_call_answer_before_call_wins() -> None:
    assert TOOL.parse("<answer>A</answer>" + call(["q"])).kind == "answer"


def test_tool_call_never_evaluates() -> None:
    # Python literals that eval() would accept are not JSON.
    a = TOOL.parse("<tool_call> {'name': 'search', 'arguments': {'query_list': ['q']}} </tool_call>")
    assert a.kind == "invalid"


# ------------------------------------------------------------------ tool_call: render


def test_tool_response_payload_format() -> None:
    # verl search_r1_like_utils: "Doc i (Title: T)\ntext" joined by "\n\n"; queries by "\n---\n"
    payload = json.loads(tool_response_payload([[P1, P2], [P3]]))
    assert payload == {
        "result": 'Doc 1 (Title: "Paris")\nParis is the capital of France.\n\n'
        'Doc 2 (Title: "Lyon")\nLyon is a city.\n---\n'
        'Doc 1 (Title: "Nice")\nNice is on the coast.'
    }
    assert json.loads(tool_response_payload(None)) == {"result": "No search results found."}


def test_tool_observation_framing() -> None:
    obs = TOOL.render_observation([[P1]])
    assert obs.startswith("\n<tool_response>\n{") and obs.endswith("}\n</tool_response>\n")
    inv = TOOL.render_invalid(Action(kind="invalid", error="tool call is not valid JSON"))
    assert "Error: tool call is not valid JSON." in json.loads(inv.split("\n")[2])["result"]
    assert "<tool_response>" in TOOL.render_no_search_left()


def test_tool_call_prompt_and_flags() -> None:
    assert TOOL.build_prompt("  Who? ") == prompts.DRZERO_SOLVER_TEMPLATE.format(question="Who?")
    assert TOOL.system_prompt == prompts.DRZERO_SYSTEM_PROMPT
    assert TOOL.end_on_invalid is True


def test_assistant_segments_strip_chat_scaffolding() -> None:
    resp = (
        "<think>a</think>" + call(["q"])[16:] + "<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>b</think>"
    )
    segs = TOOL.assistant_segments(resp)
    assert len(segs) == 2 and segs[1].strip() == "<think>b</think>"
    # a truncated (unclosed) observation is dropped as well
    segs = TAGS.assistant_segments("<search>q</search>\n\n<information>Doc 1 …")
    assert segs == ["<search>q</search>\n\n"]


# ------------------------------------------------------------------ prompts


def test_search_r1_template_verbatim() -> None:
    p = prompts.render_policy_prompt("Who wrote Hamlet?")
    assert p == (
        "Answer the given question. You must conduct reasoning inside <think> and </think> first "
        "every time you get new information. After reasoning, if you find you lack some knowledge, "
        "you can call a search engine by <search> query </search> and it will return the top "
        "searched results between <information> and </information>. You can search as many times "
        "as your want. If you find no further external knowledge needed, you can directly provide "
        "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
        "<answer> Beijing </answer>. Question: Who wrote Hamlet?"
    )


def test_invalid_observation_verbatim() -> None:
    assert prompts.INVALID_ACTION_OBSERVATION == (
        "\nMy previous action is invalid. If I want to search, I should put the query between "
        "<search> and </search>. If I want to give the final answer, I should put the answer "
        "between <answer> and </answer>. Let me try again.\n"
    )


def test_simulator_prompt_verbatim() -> None:
    golds = ["Geraint Thomas", "G. Thomas"]  # the first gold goes into the prompt
    p = prompts.render_simulator_prompt("noisy", "Who won?", golds, "2018 tour winner")
    assert p == (
        "You are the Google search engine.\n"
        "Given a query, you need to generate five noisy documents for the query.\n\n"
        'The user is trying to answer the question: "Who won?" whose answer is Geraint Thomas.\n'
        "Each document should contain about 30 words, and these documents should contain noisy "
        "information.\n\nQuery: 2018 tour winner\nNoisy Output:"
    )
    assert prompts.render_simulator_prompt("useful", "q", "a", "x").endswith("\nUseful Output:")
    with pytest.raises(ValueError):
        prompts.render_simulator_prompt("random", "q", "a", "x")


def test_drzero_prompts() -> None:
    doc = prompts.format_source_document("Robert Holmes à Court", "Holmes à Court studied forestry")
    assert doc == '(Title: "Robert Holmes à Court")\nHolmes à Court studied forestry\n'
    p = prompts.render_proposer_prompt(3, doc)
    assert p.startswith("\nYou are an expert in question generation.")
    assert p.endswith(
        "Now, generate a question and its answer with n = 3 hops starting from the following "
        'source document: (Title: "Robert Holmes à Court")\nHolmes à Court studied forestry\n\n'
    )
    assert "{" not in p.replace('{"name"', "")  # every placeholder filled
    with pytest.raises(ValueError):
        prompts.render_proposer_prompt(0, doc)
    s = prompts.render_solver_prompt("Where was X born?")
    assert "<tool_call> query </tool_call>" in s and s.endswith("Question: Where was X born?")


def test_drzero_system_prompt_has_tool_schema() -> None:
    sp = prompts.DRZERO_SYSTEM_PROMPT
    schema_line = sp.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(schema_line) == prompts.SEARCH_TOOL_SCHEMA
    head = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
    assert sp.startswith(head)
    assert '"enum": null' in sp and '"strict": false' in sp
