"""JSON documents from clients, with a nesting limit.

Python's ``json`` module recurses once per nesting level: a body nested ~1,000 levels deep raised
``RecursionError`` (a 500) in the parser, and a shallower one that parsed could still blow the
stack later (``json.dumps`` of the idempotency fingerprint, the JSONField, Pulser). Documents are
therefore parsed, then refused when deeper than ``MAX_JSON_DEPTH``; the parser's own
``RecursionError`` is refused the same way. Both the API's parser and the web forms use this.
"""

import json

# A Pulser abstract representation nests about ten levels; 64 leaves ample room for payloads.
MAX_JSON_DEPTH = 64


class TooDeep(ValueError):
    """The document nests deeper than ``MAX_JSON_DEPTH`` (a ``ValueError``, like a parse error)."""

    def __init__(self, limit: int = MAX_JSON_DEPTH):
        super().__init__(f"JSON nested deeper than {limit} levels.")
        self.limit = limit


def depth_exceeds(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects nest more than ``limit`` levels. Iterative: no recursion to blow."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_depth(value, limit: int = MAX_JSON_DEPTH):
    if depth_exceeds(value, limit):
        raise TooDeep(limit)
    return value


def loads(text, limit: int = MAX_JSON_DEPTH, **kwargs):
    """``json.loads`` that raises ``TooDeep`` (a ValueError) instead of recursing without bound."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise TooDeep(limit) from None
    return check_depth(value, limit)
