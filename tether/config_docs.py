"""docs/config.md, written from the configuration schema itself, so the reference cannot drift from the code.

Every section of :class:`tether.config.Config` (and every method plug-in's settings class, under ``methods.<name>``,
and the sections of the ``tether sft`` and ``tether seed-sft`` schemas that ``tether train``'s lacks) becomes a
table of its fields: key, type, default, allowed values (a ``Literal``'s choices, a number's bounds) and the field's
``description``. ``tether config-docs`` prints it, ``--write`` writes the file;
``tests/test_config_docs.py`` fails when the checked-in file differs from what the schema gives.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tether.config import SCHEMAS, Config

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "config.md"

HEADER = """# Configuration reference

Generated from the schema (`tether/config/` and each method's settings class) by `tether config-docs --write`;
do not edit by hand: `tests/test_config_docs.py` fails when this file differs from what the schema gives. A config
is YAML whose sections are the headings below; any key can be overridden on the command line as `key.path=value`
(`tether train configs/quickstart.yaml optim.lr=1e-5`); a list is given whole, since the syntax has no index
(`task.rewards='[{fn: my_rewards:fmt, weight: 0.5}]'`, not `task.rewards[0].weight=0.5`). Unknown keys, wrong types
and values outside the allowed ones stop the run before any model loads (`tether validate CONFIG` checks only that).

`tether train` (and `tether eval`, `tether recipe`) read the sections below; `tether sft` and `tether seed-sft` read
schemas of their own, which share the top-level keys, `model`, `task` and `env`, `logging`, and take the sections
at the end of this page (a key of another command's config is refused, naming that command).

Values read as YAML 1.2's core schema, in a file and in an override alike (PyYAML alone reads YAML 1.1): `0123` is
123 (`0o17` octal, `0x1F` hexadecimal), `12:30`, `yes`, `no`, `on`, `off` and `2024-01-05` are strings, booleans are
`true`/`false` in any of the cases `true`, `True`, `TRUE`, nulls `null` (the same three cases) or `~`, `1e-6` is a
float, and `_` may separate digits (`10_000`). It matters in the free-form mappings (`task.kwargs`, `env.kwargs`,
`algorithm.advantage_kwargs`, `rollout.engine_kwargs`...), which pass on what YAML read; a typed key converts (a
boolean key takes `yes`). A run's `config.yaml` quotes every string that YAML 1.1 or 1.2 would read as something else,
so it reads back the same. A run started by a tether that read YAML 1.1 resumes as before, except where its config
file holds a free-form value that now reads otherwise (`{start: 0123}` gave 83): the resume is refused, naming the
key and both values; write the value the run had (`83`) to continue it.
"""

# pydantic keeps Field(ge=0, ...) as annotated_types objects: (class, its attribute, how it reads)
_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "<="),
           (annotated_types.Lt, "lt", "<"))


def model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a field typed ``Model`` or ``Model | None``; None for any other field."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def type_name(annotation: Any) -> str:
    """How a field's type reads in YAML terms.

    >>> type_name(int | None)
    'int | null'
    >>> type_name(dict[str, typing.Any])
    'dict[str, any]'
    >>> type_name(typing.Literal["a", "b"])
    'str'
    """
    if annotation is type(None):
        return "null"
    if annotation is typing.Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def yaml_value(value: Any) -> str:
    """A default as it would be written in a config file.

    >>> yaml_value(None), yaml_value(True), yaml_value((0.9, 0.999)), yaml_value("val/avg@k")
    ('null', 'true', '[0.9, 0.999]', 'val/avg@k')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def default_cell(field: FieldInfo) -> str:
    """The default as code, or *required* for a field without one."""
    if field.default_factory is not None:
        return f"`{cell(yaml_value(field.default_factory()))}`"
    if field.default is PydanticUndefined:
        return "*required*"
    return f"`{cell(yaml_value(field.default))}`"


def allowed_text(field: FieldInfo) -> str:
    """A ``Literal``'s choices, or a number's bounds (``>= 0, <= 1``); empty when anything of the type goes."""
    literals = _literal_args(field.annotation)
    if literals:
        return ", ".join(f"`{yaml_value(a)}`" for a in literals)
    bounds = []
    for meta in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                bounds.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(bounds)


def _literal_args(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        choices = [v for a in typing.get_args(annotation) for v in _literal_args(a)]
        # a bool beside choices (`true | false | auto`) is two more choices; alone it goes without saying
        booleans = [True, False] if choices and bool in typing.get_args(annotation) else []
        return booleans + choices
    return []


def _plain(docstring: str) -> str:
    """A docstring's first paragraph on one line, as Markdown: RST literals and Sphinx roles become code spans (a
    role's ``~`` keeps only the last name, as Sphinx shows it)."""
    first = " ".join(docstring.strip().split("\n\n")[0].split()).replace("``", "`")
    return re.sub(r":\w+:`(~?)\.?([^`]*)`", lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", first)


def cell(text: str) -> str:
    """Table-safe text: a ``|`` would end the cell."""
    return text.replace("|", "\\|")


def sections(model: type[BaseModel], prefix: str,
             description: str | None) -> Iterator[tuple[str, str | None, type[BaseModel]]]:
    """``(key path, description, model)`` of ``model`` and of every section nested in it, depth first."""
    yield prefix, description, model
    for name, field in model.model_fields.items():
        nested = model_class(field.annotation)
        if nested is not None:
            yield from sections(nested, f"{prefix}.{name}" if prefix else name, field.description)


def section_markdown(path: str, description: str | None, model: type[BaseModel],
                     commands: tuple[str, ...] = ()) -> str:
    """One section: its heading, what it is, and a table of its non-section fields; ``commands`` name the commands
    whose schema it belongs to when that is not ``tether train``'s."""
    title = f"`{path}`" if path else "Top level"
    if commands:
        names = " and ".join(f"`tether {c}`" for c in commands)
        title = f"{names}: top level" if not path else f"{title} of {names}"
    lines = [f"## {title}", ""]
    intro = _plain(model.__doc__ or "") or description  # the class says more than the field that holds it
    if intro:
        lines += [intro[0].upper() + intro[1:].rstrip(".") + ".", ""]
    rows = [(name, f) for name, f in model.model_fields.items() if model_class(f.annotation) is None]
    nested = [name for name, f in model.model_fields.items() if model_class(f.annotation) is not None]
    if rows:
        lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for name, f in rows:
            key = f"{path}.{name}" if path else name
            lines.append(f"| `{key}` | `{cell(type_name(f.annotation))}` | {default_cell(f)} | "
                         f"{cell(allowed_text(f))} | {cell(f.description or '')} |")
        lines.append("")
    if nested:
        subsections = ", ".join(f"`{path}.{n}`" if path else f"`{n}`" for n in nested)
        lines += [f"Sections: {subsections}.", ""]
    return "\n".join(lines)


def method_sections() -> Iterator[tuple[str, str | None, type[BaseModel]]]:
    """``methods.<name>`` for every registered method plug-in, by name."""
    from tether.methods import METHODS

    for name in sorted(METHODS):
        settings = METHODS[name].Settings
        yield from sections(settings, f"methods.{name}", f"method plug-in `{name}` ({METHODS[name].__module__})")


def command_sections() -> list[tuple[str, str | None, type[BaseModel], tuple[str, ...]]]:
    """The sections of the other commands' schemas (``tether sft``, ``tether seed-sft``) that ``tether train``'s
    lacks, each once, with the commands that read it."""
    train = {(path, model) for path, _, model in sections(Config, "", None)}
    found: dict[tuple[str, type[BaseModel]], tuple[str | None, list[str]]] = {}
    for command, schema in SCHEMAS.items():
        for path, description, model in sections(schema, "", None):
            if (path, model) not in train:
                found.setdefault((path, model), (description, []))[1].append(command)
    return [(path, description, model, tuple(commands)) for (path, model), (description, commands) in found.items()]


def render_config_docs() -> str:
    """The whole of docs/config.md."""
    parts = [HEADER]
    parts += [section_markdown(*s) for s in sections(Config, "", None)]
    parts += [section_markdown(*s) for s in method_sections()]
    parts += [section_markdown(*s) for s in command_sections()]
    return "\n".join(parts).rstrip("\n") + "\n"

