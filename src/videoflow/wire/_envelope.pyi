from collections.abc import Callable, Iterable
from typing import Any

DECODER_KIND: str
MAX_DEPTH: int
LAYOUT: tuple[str, ...]

class EnvelopeDecoder:
    def __init__(
        self,
        fields: tuple[str, ...],
        defaults: tuple[Any, ...],
        ext_hook: Callable[[int, memoryview], Any],
        ext_codes: Iterable[int] = ...,
    ) -> None: ...
    def decode(self, data: bytes | bytearray | memoryview) -> dict[str, Any] | None: ...

def compose_decode_envelope(
    decoder: EnvelopeDecoder,
    reference: Callable[[bytes | bytearray | memoryview], dict[str, Any]],
) -> Callable[[bytes | bytearray | memoryview], dict[str, Any]]: ...
