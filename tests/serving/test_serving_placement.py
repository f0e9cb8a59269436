"""Groups split across workers, from SGLang's `request.received` log records (shape of a real 0.5.23 line)."""

import json

from sglang_feather.serving.placement import GROUP_KEY_CHARS, placement, received_texts


def record(text: str | None, input_ids=None) -> str:
    obj = {"rid": "r", "text": text, "input_ids": input_ids, "sampling_params": {"max_new_tokens": 32}}
    body = {"timestamp": "2026-12-01T18:37:47.682108", "event": "request.received", "rid": "r", "obj": obj}
    return f"[2026-12-01 18:37:47] {json.dumps(body)}"


def prompt(group: int, question: int) -> str:
    return f"system prompt of group {group} " * 40 + f"question {question}"


def test_texts_are_read_from_received_records_only():
    lines = [
        "[2026-12-01 18:37:40] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0,",
        record("The capital city of France is"),
        record(None, input_ids=[0]),
        record(prompt(1, 1)),
    ]
    assert received_texts(lines) == ["The capital city of France is", prompt(1, 1)]


def test_a_group_on_two_workers_is_split_and_short_prompts_are_not_groups():
    logs = {
        "a": [prompt(1, 1), prompt(1, 2), prompt(2, 1), "The capital city of France is"],
        "b": [prompt(2, 2), prompt(3, 1)],
    }
    where = placement(logs)
    assert where.requests == {"a": 3, "b": 2}
    assert (where.num_groups, where.split_groups) == (3, 1)
    assert where.split_share == 1 / 3


def test_the_group_key_is_the_prompt_head():
    head = "x" * GROUP_KEY_CHARS
    where = placement({"a": [head + "y" * 300], "b": [head + "z" * 300]})
    assert (where.num_groups, where.split_groups) == (1, 1)
