"""``apps.core.jsonlimits``: client JSON deeper than the limit is refused as a ValueError (a
400), never a ``RecursionError`` (a 500)."""

import pytest

from apps.core.jsonlimits import MAX_JSON_DEPTH, TooDeep, check_depth, depth_exceeds, loads


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_document_at_the_limit_is_parsed():
    assert loads(nested(MAX_JSON_DEPTH)) is not None


def test_a_document_one_level_deeper_than_the_limit_is_too_deep():
    with pytest.raises(TooDeep):
        loads(nested(MAX_JSON_DEPTH + 1))


def test_a_document_deep_enough_to_exhaust_the_parser_is_too_deep_not_a_recursion_error():
    with pytest.raises(TooDeep) as caught:
        loads(nested(100_000))
    assert isinstance(caught.value, ValueError)


def test_objects_count_as_levels_like_arrays():
    assert depth_exceeds({"a": {"b": [1]}}, limit=2)
    assert not depth_exceeds({"a": {"b": 1}}, limit=2)


def test_scalars_have_no_depth():
    assert not depth_exceeds("text", limit=0)


def test_a_value_within_the_limit_is_returned_unchanged():
    value = {"a": [1, 2]}
    assert check_depth(value) is value


def test_the_refusal_names_the_limit():
    assert "3 levels" in str(TooDeep(3))
