"""Turning validation failures into errors that name the field, for people and for programs."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def field_errors(exc: ValidationError) -> list[FieldError]:
    out = []
    for item in exc.errors(include_url=False):
        field = ".".join(str(p) for p in item["loc"]) or "body"
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        out.append(FieldError(field, message))
    return out


class TicketValidationError(ValueError):
    """A submission that cannot be accepted; `errors` names every bad field."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors
