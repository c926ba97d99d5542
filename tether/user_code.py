"""User code named by a config: the ``imports:`` list, and ``module:Name`` wherever a registry name is accepted.

A config's ``imports:`` names Python modules (``my_rewards``, ``my_pkg.tasks``) or ``.py`` files (relative to the
config file's folder; set on the command line, to the working directory); :func:`import_user_modules` imports them
before any check, so whatever they register (tasks, environments, reward functions, advantage estimators, policy
losses, methods) is known to every command.
:func:`resolve_target` turns ``"module:Name"`` into the object it names. Each failure is one
:class:`~tether.config.ConfigError` line naming the key, the value and what was expected; a mistyped name gets a
did-you-mean from the module's names.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

from tether.config import ConfigError, anchoring_rule, did_you_mean
from tether.files import sibling_paths


def is_target(name: str) -> bool:
    """Whether a registry name is a ``module:Name`` reference rather than a registered name."""
    return ":" in name


def _import_error(key: str, value: str, module: str, error: BaseException) -> ConfigError:
    """One line: what failed to import, and the last frame of the user's code that raised, if any."""
    frames = traceback.extract_tb(error.__traceback__)
    user_frames = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    where = f" at {user_frames[-1].filename}:{user_frames[-1].lineno}" if user_frames else ""
    return ConfigError(f"{key}: {value!r}: module {module!r} does not import ({type(error).__name__}: "
                       f"{error}{where}){_not_found_hint(module, error)}")


def _not_found_hint(module: str, error: BaseException) -> str:
    """Where a module that is not found could come from (not for a module that its own imports fail in): a loaded
    module of a close name (a typo of one ``imports:`` brought in), else the ways to make it importable."""
    if not (isinstance(error, ModuleNotFoundError) and error.name == module):
        return ""
    close = difflib.get_close_matches(module, [name for name in sys.modules if "." not in name], n=1, cutoff=0.8)
    if close:
        return f"; did you mean {close[0]!r}?"
    return "; list its file under imports: (a .py path relative to the config file) or put its folder on PYTHONPATH"


def import_module(key: str, value: str, module: str) -> Any:
    """``importlib.import_module(module)``, its failure a :class:`ConfigError` naming ``key`` and ``value``."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # any failure of user code at import time is the config's problem to report
        raise _import_error(key, value, module, error) from None


def _import_file(key: str, file: Path) -> None:
    """Import ``file`` as the top-level module named by its stem, its directory put first on ``sys.path`` (so its
    ``module:Name`` references and its imports of sibling files work, here and in the processes a run starts)."""
    if not file.is_file():
        # the entry is absolute by now, so the guess compares names: the .py files of the folder it points into
        files = [Path(path).name for path in sibling_paths(str(file)) if path.endswith(".py")]
        guess = did_you_mean(file.name, files).rstrip()
        raise ConfigError(f"{key}: {str(file)!r} is not a file ({anchoring_rule()}){f'; {guess}' if guess else ''}")
    name = file.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        if origin is not None and Path(origin).resolve() == file.resolve():
            return
        raise ConfigError(f"{key}: {str(file)!r} would be imported as module {name!r}, which is already "
                          f"{origin or 'a built-in module'}; rename the file")
    directory = str(file.parent.resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    import_module(key, str(file), name)


def import_user_modules(imports: list[str]) -> None:
    """Import each entry of a config's ``imports:``: a module name, or a ``.py`` file (already made absolute by
    :func:`tether.config.load_config`). Importing twice is harmless: Python keeps the first import.

    Raises:
        ConfigError: ``imports[i]: ...`` for an entry that is not a file, does not import, or clashes with a
            module of the same name.
    """
    for index, entry in enumerate(imports):
        key = f"imports[{index}]"
        if entry.endswith(".py"):
            _import_file(key, Path(entry))
        else:
            import_module(key, entry, entry)


def _did_you_mean(name: str, module: Any) -> str:
    public = [n for n in dir(module) if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; it has: {', '.join(public[:20]) or '(nothing public)'}"


def resolve_target(key: str, value: str, *, callable_: bool = True) -> Any:
    """The object ``value`` (``"package.module:Name"``, ``Name`` may be dotted: ``module:Class.method``) names.

    Args:
        key: the config key, for the error line (``task.name``, ``task.rewards[0].fn``).
        value: the reference.
        callable_: the object must be callable (a function or a class).

    Raises:
        ConfigError: not of the form ``module:Name``, the module does not import, it has no such name (with a
            did-you-mean), or the object is not callable.
    """
    module_name, _, attr = value.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{key}: {value!r} is not of the form 'module:Name'")
    obj = import_module(key, value, module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}: {value!r}: {getattr(obj, '__name__', module_name)!r} has no {part!r}"
                              f"{_did_you_mean(part, obj)}")
        obj = getattr(obj, part)
    if callable_ and not callable(obj):
        raise ConfigError(f"{key}: {value!r} is a {type(obj).__name__}, not a function or class")
    return obj
