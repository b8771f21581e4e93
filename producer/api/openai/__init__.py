"""The OpenAI-compatible front door: every call a ticket, its answer relayed from the live stream."""
