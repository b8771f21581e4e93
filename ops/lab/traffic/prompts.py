"""Prompt text of a chosen size: a short request line, then filler up to the token count.

Filler words are three letters and a space, four characters each, so both the queue's estimate
(about four characters per token) and the simulator's count (at least one token per word) read the
prompt as the number of tokens asked for.
"""

from __future__ import annotations

from functools import lru_cache

FILLER = ("acc", "bal", "dep", "fee", "int", "pay", "sum", "tax", "due", "net", "rep", "doc")

OPENERS = {
    "loan_approval": "Assess the attached loan application and give a decision with reasons.",
    "complaint": "Draft a reply to the customer complaint below and propose a resolution.",
    "archive_query": "Summarise the archived records below for the branch file.",
}


@lru_cache(maxsize=64)
def _filler(words: int) -> str:
    return "".join(FILLER[i % len(FILLER)] + " " for i in range(words))


def prompt_text(ticket_type: str, branch_id: str, index: int, tokens: int) -> str:
    """About `tokens` tokens of prompt for ticket `index` of `branch_id`."""
    head = f"[{branch_id} #{index}] {OPENERS.get(ticket_type, 'Handle the request below.')} "
    head_tokens = len(head) // 4 + 1
    return head + _filler(max(tokens - head_tokens, 1)).rstrip()
