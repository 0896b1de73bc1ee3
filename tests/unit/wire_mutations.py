"""Byte-level mutations of valid envelopes, shared by the wire fuzz and differential
tests: a mutated envelope is the likeliest shape of a corrupted or hostile input."""

from __future__ import annotations

from hypothesis import strategies as st

MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "truncate", "insert", "delete"]),
        st.integers(min_value=0, max_value=10_000),
        st.integers(min_value=0, max_value=255),
    ),
    min_size=1,
    max_size=6,
)
"""(operation, position, byte) edits; a position wraps around the data's length."""


def mutate(seed: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    """seed with the edits applied in order."""
    data = bytearray(seed)
    for op, position, byte in mutations:
        at = position % (len(data) + 1)
        if op == "flip" and data:
            data[at % len(data)] ^= byte or 1
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data.insert(at, byte)
        elif op == "delete" and data:
            del data[at % len(data)]
    return bytes(data)
