"""`EmulatedTokenizer`: a deterministic stand-in for a BPE tokenizer and a chat template, so the emulated
backend's token counts differ from the gateway's characters / 4 estimate the way a real model's do.

Rules (documented, not learned): one BOS token; a run of ASCII letters is ``1 + (len - 1) // 5`` tokens
(with its leading space); every digit, punctuation mark and non-ASCII character is one token; a run of
two or more whitespace characters is one token. A chat prompt adds 4 tokens per message (role header and
end marker) and 3 for the generation prompt, as ChatML-style templates do. Token ids are a stable hash
of the piece. Invariant: ``count(x) == len(encode(x))``.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

_PIECES = re.compile(r" ?[A-Za-z]+|\s{2,}|\s|.", re.DOTALL)
BOS_ID = 1
VOCAB = 151_000
PER_MESSAGE = 4
GENERATION_PROMPT = 3
PIECE_CACHE = 65_536


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list (images etc. count nothing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class EmulatedTokenizer:
    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, ...]] = {}
        """Piece -> its token ids (bounded; the same few thousand words recur)."""

    def _piece(self, piece: str) -> tuple[int, ...]:
        letters = piece.lstrip(" ")
        if letters.isascii() and letters.isalpha():
            n = 1 + (len(letters) - 1) // 5
            h = zlib.crc32(piece.encode())
            return tuple(2 + (h + i) % VOCAB for i in range(n))
        if piece == " ":
            return ()  # a lone space joins the next piece
        return (2 + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % VOCAB,)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        out = [BOS_ID] if add_special_tokens else []
        ids = self._ids
        for piece in _PIECES.findall(text):
            got = ids.get(piece)
            if got is None:
                got = self._piece(piece)
                if len(ids) < PIECE_CACHE:
                    ids[piece] = got
            out.extend(got)
        return out

    def count(self, text: str, *, add_special_tokens: bool = True) -> int:
        return len(self.encode(text, add_special_tokens=add_special_tokens))

    def encode_chat(self, messages: list[Any], *, add_generation_prompt: bool = True) -> list[int]:
        out = [BOS_ID]
        for m in messages:
            if not isinstance(m, dict):
                continue
            out.extend([3, 4 + len(str(m.get("role", ""))) % 7, 5])
            out.extend(self.encode(_text_of(m.get("content")), add_special_tokens=False))
            out.append(6)
        if add_generation_prompt:
            out.extend([3, 7, 5])
        return out
