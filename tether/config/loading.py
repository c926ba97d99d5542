"""Reading a config: YAML plus dotted ``key.path=value`` overrides, validated against the schema of the command
that reads it, every error one line naming the key path; the first line of a file names its command."""

from __future__ import annotations

import copy
import difflib
import json
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined, to_jsonable_python

from tether.config.base import ConfigError
from tether.config.schemas import SCHEMAS, Config, RunConfig

# The values a config's plain scalars read as: YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
# and, as in Python, `_` between digits. PyYAML implements YAML 1.1, which in a free-form mapping (env.kwargs,
# algorithm.advantage_kwargs, rollout.engine_kwargs) handed the function 0123 as 83 (octal), 12:30 as 750 (base 60),
# yes/no/on/off as booleans, 2024-01-05 as a date and 1e-6 as a string; YAML 1.2 reads 123, "12:30", "yes", the
# string "2024-01-05" and 1e-06 (typed fields convert either way: a bool field takes yes).
DIGITS = r"[0-9](?:_?[0-9])*"
CORE_SCHEMA = (  # (tag, pattern, the characters a match can start with), in the order they are tried
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("tag:yaml.org,2002:int", rf"[-+]?{DIGITS}|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
    ("tag:yaml.org,2002:float", rf"[-+]?(?:\.{DIGITS}|{DIGITS}(?:\.(?:{DIGITS})?)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", list("-+0123456789.")),
    ("tag:yaml.org,2002:merge", r"<<", ["<"]),  # not YAML 1.2's, but PyYAML's `<<: *anchor` merge key, kept
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A core-schema int: decimal (a leading 0 is not octal), ``0o`` octal or ``0x`` hexadecimal."""
    text = loader.construct_scalar(node)
    return int(text, 0) if text.startswith(("0o", "0x")) else int(text)


class ConfigLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader with the implicit types of :data:`CORE_SCHEMA` instead of YAML 1.1's."""

    yaml_implicit_resolvers: ClassVar[dict] = {}  # its own table, not a copy of SafeLoader's


class ConfigDumper(yaml.SafeDumper):
    """``yaml.safe_dump``'s dumper that also quotes a string :class:`ConfigLoader` would read as another type
    (``0o17``, ``+.5``): a string that YAML 1.1 or :data:`CORE_SCHEMA` reads as a number, boolean, null or date is
    quoted, so ``config.yaml`` reads back the same here and in a tether that read YAML 1.1."""


for _tag, _pattern, _first in CORE_SCHEMA:
    for _yaml_class in (ConfigLoader, ConfigDumper):
        _yaml_class.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), _first)
ConfigLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def read_yaml(text: str) -> Any:
    """YAML text as a config reads it (:class:`ConfigLoader`)."""
    return yaml.load(text, Loader=ConfigLoader)


def _format_loc(loc: tuple) -> str:
    """A pydantic error location as the key path tether's lines write: ``task.rewards[0].fn`` (a list index in
    brackets, as the checks after the schema write it)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).removeprefix(".") or "<root>"


def _section_class(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section class at ``loc`` under ``model`` (``("optim",)`` -> OptimConfig; ``("task", "rewards", 0)`` ->
    RewardTermConfig), or None when ``loc`` leaves the typed sections (a free-form dict such as ``task.kwargs``)."""
    for part in loc:
        if isinstance(part, int):  # an item of a list of sections: the list's field already gave its class
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        sections = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not sections:
            return None
        model = sections[0]
    return model


# The YAML an override's value needs, by the type pydantic expected: `logging.wandb=true` wants a mapping.
SYNTAX_HINTS = {
    "dict_type": "a mapping: in YAML `key: {a: 1, b: x}`, on the command line key='{a: 1, b: x}' ({} for the "
                 "defaults)",
    "list_type": "a list: in YAML `key: [a, b]`, on the command line key='[a, b]'",
    "tuple_type": "a list: in YAML `key: [0.9, 0.999]`, on the command line key='[0.9, 0.999]'",
}


# Values another framework names differently, by key path: (the framework, its settings that take them, {theirs:
# tether's, or None for a value tether has no counterpart of}). A config ported from verl writes its names; the error
# says which to write.
OTHER_NAMES: dict[str, tuple[str, str, dict[str, str | None]]] = {
    "algorithm.kl.estimator": ("verl", "kl_loss_type and kl_penalty",
                               {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "abs": None, "full": None}),
}


def _other_name_hint(key: str, value: Any) -> str:
    """``; low_var_kl is verl's name for k3: write ...`` where ``value`` is another framework's name of a value of
    ``key`` (:data:`OTHER_NAMES`); else empty."""
    framework, settings, names = OTHER_NAMES.get(key, ("", "", {}))
    if not isinstance(value, str) or value not in names:
        return ""
    table = f"{framework}'s {settings}: " + ", ".join(f"{theirs} = {ours}" for theirs, ours in names.items() if ours)
    if names[value] is None:
        return f"; {value} is {framework}'s name of an estimator tether does not have ({table})"
    return f"; {value} is {framework}'s name for {names[value]}: write {key}={names[value]} ({table})"


def _close_keys(key: str, allowed: list[str]) -> list[str]:
    """Allowed keys ``key`` may have meant: spelled alike, or abbreviated by its words' initials
    (``learning_rate`` -> ``lr``)."""
    initials = "".join(word[:1] for word in key.split("_"))
    close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
    return [*close, *(k for k in allowed if k == initials and k not in close)]


def did_you_mean(key: str, allowed: Iterable[str]) -> str:
    """``"did you mean a or b? "`` naming the allowed keys ``key`` may have meant, else ``""``: the same guess for a
    config key, a task's or env's argument and a reward class's keyword, so a misspelt key reads alike wherever it
    is written."""
    close = _close_keys(key, list(allowed))
    return f"did you mean {' or '.join(close)}? " if close else ""


def validation_lines(err: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per error of ``err`` (validating ``model``): the key path, what is wrong, the value; an unknown key
    gets the closest allowed keys (did you mean) and every key its section allows; a wrong container type gets the
    YAML syntax it needs."""
    lines = []
    for e in err.errors():
        loc = _format_loc(e["loc"])
        key = f"{prefix}.{loc}" if prefix else loc
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            section = _section_class(model, e["loc"][:-1])
            allowed = sorted(section.model_fields) if section is not None else []
            parent = ((prefix,) if prefix else ()) + tuple(e["loc"][:-1])
            where = _format_loc(parent) if parent else "the top level"
            guess = did_you_mean(str(e["loc"][-1]), allowed)
            lines.append(f"  {key}: unknown key; {guess}{where} allows: {', '.join(allowed)}")
            continue
        # a validator's own message, without pydantic's "Value error, "; a whole-config validator's names its keys
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:
            lines.append(f"  {prefix + ': ' if prefix else ''}{msg}")
            continue
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        hint = f"; write {SYNTAX_HINTS[e['type']]}" if e["type"] in SYNTAX_HINTS else _other_name_hint(key, value)
        lines.append(f"  {key}: {msg}{shown}{hint}")
    return lines


def other_command(key: tuple, command: str) -> str | None:
    """The command whose schema has the key path ``key`` that ``command``'s schema lacks (``("sft",)`` under
    ``train`` -> ``sft``), or None."""
    for other, schema in SCHEMAS.items():
        parent = _section_class(schema, key[:-1])
        if other != command and parent is not None and str(key[-1]) in parent.model_fields:
            return other
    return None


class MovedKey(NamedTuple):
    """A key that left a section for another command's config: ``old`` (dotted), where it is now (``new``, a key
    path of ``command``'s schema) and the page that says so."""

    old: str
    new: str
    command: str
    doc: str

    def line(self, command: str) -> str:
        """The error line of ``old`` in a config of ``command``."""
        where = f"the top-level {self.new} section" if "." not in self.new else self.new
        what = ("write its keys there" if command == self.command else
                f"`tether {command}` does not read it: drop it here")
        return f"  {self.old}: moved to {where} of the `tether {self.command}` config ({self.doc}); {what}"


# Keys that moved to another command's config; a config that still writes one is refused, naming the new place.
MOVED_KEYS = (MovedKey("methods.seed.sft", "sft", "seed-sft", "docs/methods/seed.md"),)


def pop_moved_keys(data: dict[str, Any]) -> list[MovedKey]:
    """Take out of ``data`` (a config before validation) the keys of :data:`MOVED_KEYS` it still writes, so the
    schema says nothing more about them; return them."""
    moved = []
    for m in MOVED_KEYS:
        *parents, key = m.old.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            del node[key]
            moved.append(m)
    return moved


def move_saved_keys(data: dict[str, Any], command: str) -> dict[str, Any]:
    """A run's saved settings (its ``config.yaml``, written by an older tether) as this tether names them: the keys
    of :func:`migrate_advantage_keys` rewritten and each of :data:`MOVED_KEYS` moved to its new place (dropped from
    another command's config), quietly, since nobody is to edit that file. A section the move leaves empty goes
    (``methods.seed`` that held only ``sft``). A copy; ``data`` is left as it is."""
    data = copy.deepcopy(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        migrate_advantage_keys(data)
    for m in MOVED_KEYS:
        *parents, key = m.old.split(".")
        path: list[tuple[dict[str, Any], str]] = []
        node: Any = data
        for part in parents:
            path.append((node, part))
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node:
            continue
        value = node.pop(key)
        for parent, part in reversed(path):
            if parent[part] == {}:
                del parent[part]
        if m.command != command:
            continue
        *new_parents, new_key = m.new.split(".")
        target = data
        for part in new_parents:
            target = target.setdefault(part, {})
        target.setdefault(new_key, value)
    return data


def schema_defaults(schema: type[BaseModel]) -> dict[str, Any]:
    """What a config of ``schema`` holds where it does not write a key, as JSON values: each field's default, and
    for a section that has none (a required one), its own fields' defaults. A setting added to the schema after a
    run started is absent from its ``config.yaml``; its default is what the older tether did without it."""
    out: dict[str, Any] = {}
    for name, field in schema.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if default is not PydanticUndefined:
            out[name] = to_jsonable_python(default)
        elif (section := _section_class(schema, (name,))) is not None:
            out[name] = schema_defaults(section)
    return out


def _invalid_config(command: str, moved: list[MovedKey], err: ValidationError | None = None) -> ConfigError:
    """One error for the moved keys and the schema's errors: a moved key is named with its new place (and that
    place's absence goes unsaid), an unknown key of another command's schema with that command."""
    lines = validation_lines(err, SCHEMAS[command]) if err is not None else []
    for e in err.errors() if err is not None else ():  # a key of another command's config: say whose
        other = other_command(e["loc"], command) if e["type"] == "extra_forbidden" else None
        if other is not None:
            key = _format_loc(e["loc"])
            lines = [line for line in lines if not line.startswith(f"  {key}: unknown key")]
            lines.append(f"  {key}: a setting of `tether {other}`, which `tether {command}` does not read (its "
                         f"config: docs/config.md; drop the key, or run `tether {other}` with this config)")
    unsaid = {f"  {m.new}: Field required" for m in moved if m.command == command}
    lines = [m.line(command) for m in moved] + [line for line in lines if line not in unsaid]
    return ConfigError("invalid configuration:\n" + "\n".join(lines))


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key segment")
    if raw == "":
        return key.split("."), ""
    try:
        return key.split("."), read_yaml(raw)
    except yaml.YAMLError as err:  # the shell took the quotes: {question} x, a: b
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem}); to set a string, quote it "
                          f"for YAML inside the shell's quotes: {string_override(key, raw)!r}") from None


def string_override(key: str, value: str | Path) -> str:
    """``key="value"``: an override that sets ``value`` as a string, whatever YAML would read in it unquoted (a path
    ``runs/exp #3`` is ``runs/exp`` and a comment, ``runs/a: b`` a mapping, ``2024`` a number). A JSON string is a
    YAML double-quoted scalar."""
    return f"{key}={json.dumps(str(value))}"


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        _refuse_list_item(item, path, value, data)
        _set_path(data, path, value, item)
    return data


def _set_path(data: dict, path: list[str], value: Any, item: str) -> dict:
    """``data`` with ``value`` at the key ``path``, sections made where missing (``item``: the override, named in
    the error where a key on the way is not a section)."""
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: '{part}' is {child!r}, not a section")
        node = child
    node[path[-1]] = value
    return data


LIST_ITEM = re.compile(r"(.+)\[(-?\d+)\]")  # rewards[0]


def _list_item(path: list[str], data: dict) -> tuple[list[str], int, list[str]] | None:
    """``(the list's key path, the index, the key path inside the item)`` when ``path`` goes into a list item,
    as ``task.rewards[0].weight`` or ``task.rewards.0.weight`` (where ``task.rewards`` is a list); else None."""
    node: Any = data
    for i, part in enumerate(path):
        indexed = LIST_ITEM.fullmatch(part)
        if indexed is not None:
            return [*path[:i], indexed[1]], int(indexed[2]), path[i + 1:]
        if isinstance(node, list) and re.fullmatch(r"-?\d+", part):
            return path[:i], int(part), path[i + 1:]
        node = node.get(part) if isinstance(node, dict) else None
    return None


def _refuse_list_item(item: str, path: list[str], value: Any, data: dict) -> None:
    """An override cannot set one item of a list (the dotted syntax has no index): say to give the whole list, with
    the config's own list and the change made in it as the example where there is one.

    Raises:
        ConfigError: ``path`` goes into a list item.
    """
    found = _list_item(path, data)
    if found is None:
        return
    keys, index, inner = found
    node: Any = data
    for part in keys:
        node = node.get(part) if isinstance(node, dict) else None
    example = _whole_list(node, index, inner, value, item)
    quote = "'" if "'" not in example else '"'
    key = ".".join(keys)
    raise ConfigError(f"override {item!r}: {key} is a list, and the command line cannot set one item of it: give the "
                      f"whole list, e.g. {key}={quote}{example}{quote}")


def _flow(value: Any) -> str:
    return yaml.dump(value, Dumper=ConfigDumper, default_flow_style=True, sort_keys=False,
                     width=10**6).strip().removesuffix("\n...")


def _whole_list(current: Any, index: int, inner: list[str], value: Any, item: str) -> str:
    """The list to give, in YAML flow style: ``current`` (the config's) with item ``index`` changed at ``inner``
    (as :func:`apply_overrides` sets a key), or, where the config has no such item, the changed part and ``...`` for
    the rest."""
    if isinstance(current, list) and -len(current) <= index < len(current):
        changed = copy.deepcopy(current)
        entry = changed[index]
        changed[index] = _set_path(entry if isinstance(entry, dict) else {}, inner, value, item) if inner else value
        return _flow(changed)
    change: Any = value
    for part in reversed(inner):
        change = {part: change}
    flow = _flow(change)
    return f"[{flow[:-1]}, ...}}, ...]" if isinstance(change, dict) else f"[{flow}, ...]"


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """``file:line:column: problem``, as compilers say it (the mark is 0-based)."""
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: YAML syntax error: {getattr(err, 'problem', None) or err}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None) -> Config:
    """Read YAML (or take ``data``), apply ``key.path=value`` overrides, validate the schema of ``tether train``.

    ``data`` is copied first: the overrides never change the caller's dict. What needs tether's registries
    (component names and settings, methods, the workload) and the machine is :mod:`tether.checks`.
    """
    return load_command_config("train", path, overrides, data)


def load_command_config(command: str, path: str | Path | None = None, overrides: list[str] | None = None,
                        data: dict | None = None) -> RunConfig:
    """:func:`load_config` against the schema of ``command`` (:data:`SCHEMAS`): a :class:`Config`, an
    :class:`SFTRunConfig` or a :class:`SeedSFTRunConfig`. A key of another command's schema is named with that
    command, a key that moved (:data:`MOVED_KEYS`) with its new place."""
    data = copy.deepcopy(data) if data is not None else {}
    text = None
    if path is not None:
        path = Path(path)
        text = _config_text(path)
        try:
            loaded = read_yaml(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(_yaml_error(path, err)) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = {**loaded, **data}
        _anchor_import_files(data, path.parent)
    data = apply_overrides(data, overrides or [])
    _anchor_import_files(data, Path.cwd())
    migrate_advantage_keys(data)
    moved = pop_moved_keys(data)
    try:
        cfg = SCHEMAS[command].model_validate(data)
    except ValidationError as err:
        whose = config_for_another_command(path, data, command) if path is not None and schema_mismatch(err) else None
        if whose is not None:  # one line, not one per top-level key of another schema
            raise ConfigError(whose) from None
        raise _invalid_config(command, moved, err) from None
    if moved:
        raise _invalid_config(command, moved)
    cfg._written_by = written_by_lines(text) if text is not None else []
    cfg._config_dir = path.parent.resolve() if path is not None else None
    return cfg


def _config_text(path: Path) -> str:
    if path.is_dir():  # a run directory: its settings are its config.yaml
        saved = path / "config.yaml"
        hint = f"; did you mean {saved}?" if saved.is_file() else ""
        raise ConfigError(f"config file {str(path)!r} is a directory, not a YAML file{hint}")
    if not path.is_file():
        # a protocol's arm configs, a recipe's stages: relative paths are the working directory's, not the folder of
        # the file that names them
        where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        raise ConfigError(f"config file {str(path)!r} does not exist{where}")
    return path.read_text()


COMMAND_LINE = re.compile(r"^#\s*tether\s+([a-z-]+)\s")


def first_line_command(path: str | Path) -> str | None:
    """The command the file's first line names (``# tether experiment PROTOCOL.yaml`` -> ``experiment``), any
    command, or None."""
    named = COMMAND_LINE.match(_config_text(Path(path)).split("\n", 1)[0] + " ")
    return named[1] if named is not None else None


def schema_mismatch(err: ValidationError) -> bool:
    """Whether the errors include a key the schema does not have or lacks one it needs: a file of another command,
    as opposed to a bad value in the right kind of file (said as it is)."""
    return any(e["type"] in ("extra_forbidden", "missing") for e in err.errors())


def config_for_another_command(path: Path, data: dict[str, Any], command: str) -> str | None:
    """The line for a file of another command given to ``command``, which its schema refuses: an experiment's
    protocol (its first line ``# tether experiment``, or ``arms:`` and ``seeds:``) to a run command, a run config
    to ``tether experiment`` (``command="experiment"``), or a config whose first line names another run command.
    None when the file says nothing of whose it is."""
    named = first_line_command(path)
    if named is None and {"arms", "seeds"} <= data.keys():
        named = "experiment"
    elif named is None and command == "experiment" and "arms" not in data and \
            data.keys() & {"model", "task", "env", "rollout", "sft"}:
        named = config_command(path)
    if named is None or named == command or (named not in SCHEMAS and named != "experiment"):
        return None
    what = "an experiment's protocol" if named == "experiment" else f"a `tether {named}` config"
    return f"{path} is {what}, which `tether {command}` does not read: run `tether {named} {path}`"


def config_command(path: str | Path) -> str:
    """The command a config file is for: the one its first line names (``# tether sft CONFIG``, the repository's
    convention) when it has a schema here (:data:`SCHEMAS`; an experiment's protocol has its own,
    :mod:`tether.lab.protocol`), else ``sft`` when it has an ``sft:`` section, else ``train``."""
    named = first_line_command(path)
    if named in SCHEMAS:
        return named
    return "sft" if re.search(r"^sft:", _config_text(Path(path)), re.MULTILINE) else "train"


def anchoring_rule() -> str:
    """How a relative ``.py`` entry of ``imports:`` or ``model.chat_template`` was made absolute (by
    :func:`_anchor_import_files`, which keeps no record of which base it used): for the message about a file that is
    not there, which shows the absolute path."""
    return ("a relative path is read from the folder of the config file that sets it, or from the working directory "
            f"{Path.cwd()} when set on the command line")


def _anchor_import_files(data: dict[str, Any], base: Path) -> None:
    """Make each relative ``.py`` entry of ``imports:`` and a relative ``model.chat_template`` file absolute against
    ``base`` (the config file's directory, or the working directory for an override), so the run directory's copy
    of the config names the same files."""
    def anchored(entry: Any) -> Any:
        return str((base / entry).resolve()) if isinstance(entry, str) and not Path(entry).is_absolute() else entry

    imports = data.get("imports")
    if isinstance(imports, list):
        data["imports"] = [anchored(e) if isinstance(e, str) and e.endswith(".py") else e for e in imports]
    model = data.get("model")
    if isinstance(model, dict) and model.get("chat_template") is not None:
        model["chat_template"] = anchored(model["chat_template"])


WRITTEN_BY = re.compile(r"^\s*#\s*written by:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


def written_by_lines(text: str) -> list[str]:
    """The commands of a config file's ``# written by: COMMAND`` comment lines, in order: what writes the
    checkpoints or data the config reads (named when they are missing, :mod:`tether.checks.startup`)."""
    return WRITTEN_BY.findall(text)


def migrate_advantage_keys(data: dict[str, Any]) -> None:
    """Rewrite, in place, the keys that chose advantages before there was one estimator per run, with a
    FutureWarning (they are removed in tether 0.2.0); the advantages and the run are the same as before:

    * ``env.step_grouping: true`` (with ``algorithm.advantage: episode``) -> ``algorithm.advantage: gigpo``, and
      ``env.step_advantage_w`` -> ``algorithm.advantage_kwargs.step_weight``;
    * ``methods.eapo.advantage_grouping: non_injected`` (with ``grpo`` or ``dr_grpo``) -> ``algorithm.advantage:
      clean_baseline`` (``advantage_kwargs.scale: false`` for ``dr_grpo``); ``all`` -> nothing.

    Raises:
        ConfigError: an old key with an estimator it never worked with (each replaces the estimator).
    """
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    eapo = (data.get("methods") or {}).get("eapo")
    eapo = eapo if isinstance(eapo, dict) else {}
    old = [f"env.{k}" for k in ("step_grouping", "step_advantage_w") if k in env]
    old += ["methods.eapo.advantage_grouping"] if "advantage_grouping" in eapo else []
    if not old:
        return
    algorithm = data.setdefault("algorithm", {})
    kwargs = dict(algorithm.get("advantage_kwargs") or {})
    weight = env.pop("step_advantage_w", None)
    if env.pop("step_grouping", False):
        _replace_estimator(algorithm, "env.step_grouping=true", "gigpo", ("episode",))
        kwargs.update({} if weight is None else {"step_weight": weight})
    grouping = eapo.pop("advantage_grouping", "all")
    if grouping == "non_injected":
        scale = algorithm.get("advantage", "grpo") == "grpo"
        _replace_estimator(algorithm, "methods.eapo.advantage_grouping=non_injected", "clean_baseline",
                           ("grpo", "dr_grpo"))
        kwargs.update({} if scale else {"scale": False})
    elif grouping != "all":
        raise ConfigError(f"methods.eapo.advantage_grouping={grouping!r}: must be all or non_injected")
    algorithm["advantage_kwargs"] = kwargs
    warnings.warn(f"{', '.join(old)}: moved to algorithm.advantage (gigpo: the episode advantage plus GiGPO's step "
                  "term, advantage_kwargs.step_weight; clean_baseline: EAPO's non-injected baseline); read as "
                  f"algorithm.advantage={algorithm.get('advantage', 'grpo')}, advantage_kwargs={kwargs}; the old "
                  "keys are removed in tether 0.2.0", FutureWarning, stacklevel=3)


def _replace_estimator(algorithm: dict[str, Any], old: str, new: str, allowed: tuple[str, ...]) -> None:
    """Set ``algorithm.advantage`` to ``new`` if the config's estimator is one ``old`` worked with."""
    current = algorithm.get("advantage", "grpo")
    if current not in allowed:
        raise ConfigError(f"{old} goes with algorithm.advantage {' or '.join(allowed)}, got {current}; it now means "
                          f"algorithm.advantage={new}, one estimator for the run, so set that instead")
    algorithm["advantage"] = new


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML that loads back to the same config (``config.yaml`` of a run: ``tether eval --config``,
    resume). The first line names the command whose schema it is (:func:`config_command` reads it). JSON-mode
    values (paths, enums and tuples as YAML knows them), with the keys of every mapping as the config holds them:
    JSON would write ``task.kwargs.carries: {0: 0.5}`` as ``{'0': 0.5}``, which a task whose argument is a
    ``dict[int, float]`` refuses."""
    command = next(name for name, schema in SCHEMAS.items() if type(cfg) is schema)
    body = yaml.dump(_python_keys(cfg.model_dump(), cfg.model_dump(mode="json")), Dumper=ConfigDumper,
                     sort_keys=False)
    return f"# tether {command} (the settings this run started with)\n{body}"


def _python_keys(python: Any, json_mode: Any) -> Any:
    """``json_mode`` with each mapping's keys taken from ``python`` where YAML can hold them (ints, floats, bools);
    both are dumps of one model, so their mappings list the same keys in the same order."""
    if isinstance(json_mode, dict) and isinstance(python, dict) and len(python) == len(json_mode):
        return {(pk if isinstance(pk, int | float | bool) else jk): _python_keys(pv, jv)
                for (pk, pv), (jk, jv) in zip(python.items(), json_mode.items(), strict=True)}
    if isinstance(json_mode, list) and isinstance(python, list | tuple) and len(python) == len(json_mode):
        return [_python_keys(pv, jv) for pv, jv in zip(python, json_mode, strict=True)]
    return json_mode
