"""Reading the API reference's text (../shared/spec/messaging-api-reference.txt): what
the tests that hold the code to it share."""

from __future__ import annotations


def split_params(text: str) -> tuple[str, ...]:
    """A signature's parameters split at its top-level commas, so
    Callable[[Delivery], bool] or a default of (1, 2) stays one parameter."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[({"
        depth -= char in "])}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return tuple(p.strip() for p in [*parts, current] if p.strip())
