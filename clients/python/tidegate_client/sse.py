"""Server-sent events, read line by line (the WHATWG event-stream format), for both clients."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerEvent:
    event: str
    data: str


class SseDecoder:
    """Feed it the stream's lines; a blank line completes an event, which `feed` then returns."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> ServerEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            done = ServerEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return done
        if line.startswith(":"):  # a comment, e.g. a keep-alive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None
