"""How deeply JSON is nested, measured without recursion.

A payload or a result is read back by Python's JSON decoder wherever a job is shown (the
admin, the API, the CLI), a few frames per level on top of the caller's own: a document
nested nearly a thousand levels deep, accepted at enqueue, ended the admin's job page in a
RecursionError. So both are bounded, by ``PGQUEUE["MAX_JSON_DEPTH"]``, when they are
written.
"""

from __future__ import annotations

from typing import Any


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (lists and dicts of JSON values) nests more than ``limit`` levels
    of arrays and objects; a walk with its own stack, stopping at the first such level."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
