"""Analytic tests for zsearch_cli.rewards: every expected value is worked out by hand."""

from __future__ import annotations

import pytest

from zsearch_cli.rewards import (
    FORMAT_REWARD,
    answer_in_question,
    difficulty_reward,
    em,
    extract_answer,
    extract_question_answer,
    f1,
    format_reward,
    is_well_formed,
    normalize_answer,
    outcome_reward,
    proposer_format_reward,
    proposer_reward,
    score_answer,
    subem,
)

# ------------------------------------------------------------------ normalize


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("Beijing", "beijing"),  # lowercase
        ("U.S.A.!", "usa"),  # punctuation deleted, not replaced by spaces
        ("The Beatles", "beatles"),  # article -> " ", then stripped
        ("a  cat\tand\nan   owl", "cat and owl"),  # articles and whitespace collapse
        ("Theory of the Atom", "theory of atom"),  # "the" inside "theory" is not a word
        ("rock-n-roll", "rocknroll"),  # '-' is in string.punctuation
        ("  ", ""),
    ],
)
def test_normalize_answer(raw: str, norm: str) -> None:
    assert normalize_answer(raw) == norm


def test_normalize_order_punctuation_before_articles() -> None:
    # Step 2 runs before step 3: "the." -> "the" -> removed. Were articles removed first,
    # r"\bthe\b" would still match "the." and the result would be the same; but "a.b" ->
    # "ab" (one word, kept) proves punctuation is deleted, not spaced, before step 3.
    assert normalize_answer("the.") == ""
    assert normalize_answer("a.b") == "ab"


# ------------------------------------------------------------------ extraction


def test_last_answer_tag_wins() -> None:
    resp = "<think>x</think><answer> Paris </answer> wait <answer>Lyon</answer>"
    assert extract_answer(resp) == "Lyon"


def test_no_answer_tag_is_none_and_scores_zero() -> None:
    assert extract_answer("<think>I think it is Paris</think>") is None
    assert score_answer(None, ["Paris"]) == {"em": 0.0, "f1": 0.0, "subem": 0.0}
    assert outcome_reward("Paris", ["Paris"], "em") == 0.0


def test_answer_inside_retrieved_text_is_ignored() -> None:
    # An <answer> tag inside an inserted observation is not the model's.
    resp = (
        "<search> q </search>\n\n<information>Doc 1: <answer> Lyon </answer></information>\n\n"
        "<think>ok</think>"
    )
    assert extract_answer(resp) is None


def test_extract_answer_keeps_inner_whitespace_strips_outer() -> None:
    assert extract_answer("<answer>\n New  York \n</answer>") == "New  York"


# ------------------------------------------------------------------ EM / subEM / F1


def test_em_multiple_golds_and_normalization() -> None:
    assert em("the Eiffel Tower.", ["Tour Eiffel", "Eiffel Tower"]) == 1.0  # 2nd gold
    assert em("Eiffel", ["Eiffel Tower"]) == 0.0
    assert em("Paris", "paris") == 1.0  # a single gold string is accepted


def test_subem() -> None:
    # "eiffel tower" is a substring of "it is eiffel tower in paris"
    assert subem("It is the Eiffel Tower, in Paris", ["Eiffel Tower"]) == 1.0
    assert subem("Eiffel", ["Eiffel Tower"]) == 0.0  # gold longer than the prediction


def test_empty_gold_never_matches() -> None:
    # gold "The" normalizes to "" which would be a substring of anything
    assert subem("anything", ["The"]) == 0.0
    assert em("a", ["The"]) == 0.0


def test_f1_partial_overlap() -> None:
    # pred "the big red apple"  -> [big, red, apple]           PN = 3
    # gold "a red apple pie"    -> [red, apple, pie]           RN = 3
    # IN = |{red, apple}| = 2; P = 2/3, R = 2/3; F1 = 2*2/(3+3) = 2/3
    assert f1("the big red apple", ["a red apple pie"]) == pytest.approx(2 / 3)


def test_f1_counter_intersection_counts_multiplicity() -> None:
    # pred [new, new, york] PN=3; gold [new, york] RN=2
    # Counter& = {new: min(2,1)=1, york: 1} -> IN = 2; F1 = 2*2/(3+2) = 0.8
    assert f1("New New York", ["New York"]) == pytest.approx(0.8)


def test_f1_max_over_golds() -> None:
    # gold 1: IN=1 (york), PN=2, RN=3 -> 2/5 = 0.4 ; gold 2 exact -> 1.0
    assert f1("New York", ["York City Hall", "new york"]) == 1.0
    assert f1("New York", ["York City Hall"]) == pytest.approx(0.4)


def test_f1_no_overlap_is_zero() -> None:
    assert f1("London", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("yes", "no", 0.0),
        ("yes", "yes", 1.0),
        ("no", "no answer", 0.0),  # pred "no" is special and differs from "no answer"
        ("Yes, it is", "yes", 0.0),  # gold is "yes", pred differs -> 0 (would be 0.5)
        ("noanswer", "no answer given", 0.0),  # pred is special and differs
        ("no answer given", "no answer", 0.8),  # neither side special: 2*2/(3+2)
    ],
)
def test_f1_yes_no_noanswer_rule(pred: str, gold: str, expected: float) -> None:
    assert f1(pred, [gold]) == pytest.approx(expected)


def test_score_answer_all_three() -> None:
    # pred "Eiffel Tower Paris" vs gold "Eiffel Tower": EM 0, subEM 1,
    # F1: IN=2, PN=3, RN=2 -> 4/5
    s = score_answer("Eiffel Tower Paris", ["Eiffel Tower"])
    assert s == {"em": 0.0, "f1": pytest.approx(0.8), "subem": 1.0}


def test_outcome_reward_metrics() -> None:
    resp = "<think>t</think><answer> Eiffel Tower Paris </answer>"
    assert outcome_reward(resp, ["Eiffel Tower"], "em") == 0.0
    assert outcome_reward(resp, ["Eiffel Tower"], "subem") == 1.0
    assert outcome_reward(resp, ["Eiffel Tower"], "f1") == pytest.approx(0.8)
    with pytest.raises(ValueError):
        outcome_reward(resp, ["x"], "bleu")


# ------------------------------------------------------------------ policy format reward

GOOD_TAGS = (
    "<think>need info</think>\n<search> capital of France </search>"
    "\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital.</information>\n\n"
    "<think>found it</think>\n<answer> Paris </answer>"
)


def test_well_formed_tags() -> None:
    assert is_well_formed(GOOD_TAGS, "tags")
    assert format_reward(GOOD_TAGS) == FORMAT_REWARD
    # outcome 1 (EM) + bonus 0.1 when asked for; none by default
    assert outcome_reward(GOOD_TAGS, ["Paris"], "em", format_bonus=0.1) == pytest.approx(1.1)
    assert outcome_reward(GOOD_TAGS, ["Paris"], "em") == 1.0


def test_direct_answer_is_well_formed() -> None:
    assert is_well_formed("<think>easy</think> <answer>Paris</answer><|im_end|>", "tags")


@pytest.mark.parametrize(
    "resp",
    [
        "<answer> Paris </answer>",  # no think
        "<think>a</think><answer>Paris</answer><answer>Lyon</answer>",  # two answers
        "<think>a</think><answer> </answer>",  # empty answer
        "<think>a <think>b</think></think><answer>x</answer>",  # nested think
        "<think>a</think><answer>x</answer> and more text",  # text after the answer
        "<think>a</think><search> q </search>",  # never answered
        # searched without thinking first
        "<search> q </search>\n\n<information>d</information>\n\n<think>t</think><answer>x</answer>",
        # an invalid turn got the invalid-action observation
        "<think>a</think>hmm\nMy previous action is invalid. If I want to search, I should put the "
        "query between <search> and </search>. If I want to give the final answer, I should put the "
        "answer between <answer> and </answer>. Let me try again.\n<think>b</think><answer>x</answer>",
    ],
)
def test_malformed_tags(resp: str) -> None:
    assert not is_well_formed(resp, "tags")
    assert format_reward(resp) == 0.0


def test_well_formed_tool_call_with_chat_scaffolding() -> None:
    resp = (
        '<think>t</think> <tool_call> {"name": "search", "arguments": {"query_list": ["q"]}} '
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"result\": \"...\"}\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>t2</think><answer>x</answer>"
    )
    assert is_well_formed(resp, "tool_call")
    bad = resp.replace('"search"', '"browse"')  # wrong tool name
    assert not is_well_formed(bad, "tool_call")


# ------------------------------------------------------------------ Dr. Zero difficulty


@pytest.mark.parametrize(
    ("k", "expected"),
    # n = 5: (n-k)/(n-1) = (5-k)/4 for 0<k<5, else 0
    [(0, 0.0), (1, 1.0), (2, 0.75), (3, 0.5), (4, 0.25), (5, 0.0)],
)
def test_difficulty_reward(k: int, expected: float) -> None:
    assert difficulty_reward(k, 5) == pytest.approx(expected)


def test_difficulty_reward_bounds() -> None:
    assert difficulty_reward(0, 1) == 0.0 and difficulty_reward(1, 1) == 0.0  # no 0<k<1
    with pytest.raises(ValueError):
        difficulty_reward(6, 5)


# ------------------------------------------------------------------ Dr. Zero proposer format

SEARCH = '<tool_call> {"name": "search", "arguments": {"query_list": ["%s"]}} </tool_call>'
RESULT = '\n<tool_response>\n{"result": "Doc 1 (Title: \\"X\\")\\n..."}\n</tool_response>\n'


def _proposer(*turns: str) -> str:
    return RESULT.join(turns)


WELL_FORMED_3HOP = _proposer(
    "<think>step 1</think>" + SEARCH % "Steven Febey teammates",
    "<think>step 2</think>" + SEARCH % "Robert Harvey grand finals",
    "<think>final</think><question>Which Demons player played both finals with Febey?</question>"
    "<answer>Robert Harvey</answer>",
)


def test_proposer_well_formed_full_marks() -> None:
    r = proposer_format_reward(WELL_FORMED_3HOP, hops=3)
    # 3/3 turns open with think; 2 valid searches = hops-1; question and answer present
    assert r["think"] == r["tool"] == r["question"] == r["answer"] == 0.125
    assert r["integrity"] is True and r["searches"] == 2
    assert r["total"] == pytest.approx(0.5)
    # k = 1 of n = 5 right: difficulty 1.0 + format 0.5
    assert proposer_reward(1, 5, r) == pytest.approx(1.5)


def test_proposer_partial_searches_and_think() -> None:
    # hops = 4 expects 3 searches; 1 valid search -> (1+1)/4 = 0.5 of 0.125 = 0.0625.
    # 1 of 2 turns opens with think -> 0.0625.
    resp = _proposer(
        "I will search. " + SEARCH % "q1",
        "<think>done</think><question>Who founded X?</question><answer>Jane Doe</answer>",
    )
    r = proposer_format_reward(resp, hops=4)
    assert r["tool"] == pytest.approx(0.0625)
    assert r["think"] == pytest.approx(0.0625)
    assert r["total"] == pytest.approx(0.0625 + 0.0625 + 0.125 + 0.125)


def test_proposer_too_many_searches() -> None:
    # hops = 1 expects no search; 1 search: min(2,1)/max(2,1) = 1/2 -> 0.0625
    resp = _proposer(
        "<think>a</think>" + SEARCH % "q",
        "<think>b</think><question>Where did he graduate?</question><answer>Massey University</answer>",
    )
    assert proposer_format_reward(resp, hops=1)["tool"] == pytest.approx(0.0625)


def test_proposer_no_search_when_required() -> None:
    resp = "<think>a</think><question>Where did he study?</question><answer>Massey</answer>"
    assert proposer_format_reward(resp, hops=2)["tool"] == 0.0  # search is mandatory for n>1
    assert proposer_format_reward(resp, hops=1)["tool"] == 0.125  # 0 searches = hops-1


def test_proposer_wrong_tool_name_scores_no_tool_credit() -> None:
    bad = '<tool_call> {"name": "browse", "arguments": {"query_list": ["q"]}} </tool_call>'
    resp = _proposer(
        "<think>a</think>" + bad,
        "<think>b</think><question>Who wrote Y?</question><answer>Ann Lee</answer>",
    )
    r = proposer_format_reward(resp, hops=2)
    assert r["tool"] == 0.0 and r["invalid_calls"] == 1 and r["searches"] == 0
    assert r["total"] == pytest.approx(0.125 + 0.125 + 0.125)  # think, question, answer


def test_proposer_query_list_not_strings() -> None:
    bad = '<tool_call> {"name": "search", "arguments": {"query_list": "q"}} </tool_call>'
    resp = _proposer("<think>a</think>" + bad, "<think>b</think><question>Q?</question><answer>A</answer>")
    r = proposer_format_reward(resp, 2)
    assert r["tool"] == 0.0 and r["invalid_calls"] == 1


def test_proposer_answer_in_question_is_zeroed() -> None:
    resp = (
        "<think>a</think><question>Did Robert Holmes graduate from Massey University in 1962?</question>"
        "<answer>Massey University</answer>"
    )
    r = proposer_format_reward(resp, hops=1)
    assert r["integrity"] is False and r["total"] == 0.0
    assert r["question"] == 0.125  # components are still reported for logging
    assert proposer_reward(1, 5, r) == 0.0  # the whole reward, difficulty included


@pytest.mark.parametrize(
    "resp",
    [
        "<think>a</think><question> </question><answer>Paris</answer>",  # empty question
        "<think>a</think><question>Which city?</question><answer></answer>",  # empty answer
        "<think>a</think><question>Which city?</question>",  # no answer
        "<think>a</think><answer>Paris</answer><question>Which city?</question>",  # wrong order
        "<think>a</think><question>Which city?</question><answer>The</answer>",  # normalizes to ""
    ],
)
def test_proposer_integrity_gate(resp: str) -> None:
    r = proposer_format_reward(resp, hops=1)
    assert r["integrity"] is False and r["total"] == 0.0


def test_answer_in_question_is_whole_words() -> None:
    assert answer_in_question("Rome", "Who wrote Romeo and Juliet?") is False  # not a word
    assert answer_in_question("the Rome", "Is Rome in Italy?") is True
    assert answer_in_question("New York", "Which borough of New York is largest?") is True


def test_extract_question_answer_last_pair() -> None:
    resp = (
        "<question>draft?</question><answer>d</answer> <think>revise</think>"
        "<question> Final question? </question>\n<answer> Final </answer>"
    )
    assert extract_question_answer(resp) == ("Final question?", "Final")
    assert extract_question_answer("nothing here") == (None, None)


def test_proposer_hops_validation() -> None:
    with pytest.raises(ValueError):
        proposer_format_reward("x", hops=0)
