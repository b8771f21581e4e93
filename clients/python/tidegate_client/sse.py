"""Server-sent events, read line by line (the WHATWG event-stream format), for both clients."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerEvent:
    event: str
    data: str
    id: str | None = None
    """The stream's last event id when this event was dispatched (what `Last-Event-ID` sends)."""


class SseDecoder:
    """Feed it the stream's lines; a blank line completes an event, which `feed` then returns."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> ServerEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            done = ServerEvent(self._event or "message", "\n".join(self._data), self._id)
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
        elif name == "id" and "\0" not in value:
            self._id = value
        return None
