"""`tidegate worker`'s options and the supervisor's child arguments, both derived from `WorkerConfig`.

Each option takes the setting's name with dashes (or its `Flag`), its help from the field's
description with its variable and default, and no default of its own: a flag left out leaves the
environment's value (or the field's default) in place. Pydantic alone judges values; a bad one
exits 2 with a message naming the setting, the value, the option and the variable.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shared.cli_support import EXIT_BAD_INPUT, fail
from shared.config import Settings
from shared.policy import PolicyError
from worker.config import SHARED_FLAGS, Flag, WorkerConfig

PER_CHILD = frozenset({"gpus", "gpu", "vllm_url", "worker_id", "worker_metrics_port"})
"""Settings the supervisor gives each child itself, so `child_args` leaves them out."""


def _flag_of(name: str, field: FieldInfo) -> Flag | None:
    if name in Settings.model_fields:
        return SHARED_FLAGS.get(name)
    return next((m for m in field.metadata if isinstance(m, Flag)), Flag())


@cache
def options() -> dict[str, Flag]:
    """Every setting with an option of its own, by field name, in declaration order."""
    found = {}
    for name, field in WorkerConfig.model_fields.items():
        flag = _flag_of(name, field)
        if flag is not None and flag.via is None:
            found[name] = flag
    return found


def option_name(name: str) -> str:
    """The option that sets `name` (a field given through another's option: that option)."""
    flag = _flag_of(name, WorkerConfig.model_fields[name]) or Flag()
    if flag.via is not None:
        return option_name(flag.via)
    return flag.name or "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return f"{WorkerConfig.model_config.get('env_prefix', '')}{name}".upper()


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        return next(arg for arg in get_args(annotation) if arg is not type(None))
    return annotation


def _scalar(annotation: Any) -> Any:
    """The command-line type of a field: its type without None; a Literal's values are strings."""
    annotation = _without_none(annotation)
    return str if get_origin(annotation) is Literal else annotation


def option_help(name: str) -> str:
    """What the setting does, its accepted values where a choice, its variable and default."""
    field = WorkerConfig.model_fields[name]
    flag = options()[name]
    words = field.description or name
    default = "" if field.default in (None, PydanticUndefined) else f", default {field.default}"
    kind = _without_none(field.annotation)
    choices = get_args(kind) if get_origin(kind) is Literal else ()
    one_of = f" One of {', '.join(choices)}." if choices else ""
    more = f" {flag.more_help}" if flag.more_help else ""
    return f"{words[:1].upper()}{words[1:]} [{env_name(name)}{default}].{one_of}{more}"


def parameters() -> list[inspect.Parameter]:
    """Typer parameters, one per option, for a command whose body reads them as keywords."""
    found = []
    for name, flag in options().items():
        kind = _scalar(WorkerConfig.model_fields[name].annotation)
        option = option_name(name)
        if flag.many:
            annotation: Any = Annotated[
                list[str] | None, typer.Option(option, metavar="LIST", help=option_help(name))
            ]
        elif kind is bool:
            declared = f"{option}/--no-{option.removeprefix('--')}"
            annotation = Annotated[bool | None, typer.Option(declared, help=option_help(name))]
        else:
            annotation = Annotated[kind | None, typer.Option(option, help=option_help(name))]
        found.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        )
    return found


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the command line gave (a repeated option's values joined as one comma list)."""
    settings = {}
    for name, flag in options().items():
        value = values.get(name)
        if flag.many and value is not None:
            value = ",".join(piece.strip() for item in value for piece in item.split(",") if piece.strip())
        if value is not None and value != "":
            settings[name] = value
    return settings


def config_from_options(values: Mapping[str, Any]) -> WorkerConfig:
    """The worker's settings: the command line over the environment; ValidationError if refused."""
    return WorkerConfig(**given(values))


def load_config(values: Mapping[str, Any]) -> WorkerConfig:
    """The settings from the options over the environment; a refused value or policy exits 2."""
    try:
        config = config_from_options(values)
        config.policy  # noqa: B018 - load the policy now so a bad file fails at start
    except ValidationError as exc:
        fail(refusal(exc), EXIT_BAD_INPUT)
    except PolicyError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    return config


def refusal(exc: ValidationError) -> str:
    """One line naming the setting, the value, the option and the variable of a refused value."""
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if not first["loc"]:
        return message
    name = str(first["loc"][0])
    where = ".".join(str(part) for part in first["loc"])
    if name not in WorkerConfig.model_fields:
        return f"{where}: {message}"
    flag = _flag_of(name, WorkerConfig.model_fields[name]) or Flag()
    variable = env_name(flag.via or name)
    return f"{where}={first.get('input')!r} is not accepted: {message} ({option_name(name)}, {variable})"


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def child_args(config: WorkerConfig) -> list[str]:
    """The options that make a child's settings equal `config` (the per-child ones left to the caller).

    Every resolved value is passed, so a child does not depend on reading the environment the same way.
    """
    args: list[str] = []
    for name, flag in options().items():
        if name in PER_CHILD:
            continue
        args += option_args(config, name, flag)
    return args


def option_args(config: WorkerConfig, name: str, flag: Flag | None = None) -> list[str]:
    """`name`'s option and value as `config` holds it; nothing for an unset optional setting."""
    flag = flag or options()[name]
    value = getattr(config, name)
    option = option_name(name)
    if isinstance(value, bool):
        return [option if value else f"--no-{option.removeprefix('--')}"]
    if value is None:
        return []
    if flag.many:
        carried = [getattr(config, other) for other in _via(name)]
        value = ",".join([str(value), *(str(item) for items in carried for item in items)])
    return [option, _text(value)]


def _via(name: str) -> list[str]:
    """Fields whose values travel in `name`'s option (the extra queues in `--queue`)."""
    return [
        other
        for other, field in WorkerConfig.model_fields.items()
        if (flag := _flag_of(other, field)) is not None and flag.via == name
    ]
