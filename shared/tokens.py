"""A cheap prompt-size estimate for admission and batch sizing before vLLM has tokenized anything.

About four characters per token is the usual figure for English BPE vocabularies; vLLM's real
counts (its `usage`) replace the estimate once a ticket has run.
"""

from __future__ import annotations

import math

CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0
