"""One registry shape for every name a config gives: advantages, losses, tasks, environments, engines, methods.

A :class:`Registry` is a read-only mapping of names to entries, filled by ``register`` (a decorator) or ``add``:

* a taken name is refused (a silent overwrite would hide a typo or a clash between two plug-ins);
* ``check``, when given, is called on every entry at registration and on every resolved ``module:Name`` (a
  family's signature) and raises on a bad one, the error prefixed with the kind and the entry's name;
* an unknown name raises :class:`UnknownNameError` (a KeyError and a ValueError), one line listing the known names;
* ``resolve``, when given, turns a ``module:Name`` of the user's own into an entry on lookup, so a plug-in needs no
  registration; a registry without one (SEED's tables, keyed by env name) knows only its registered names.

``name in registry``, iteration and ``len`` see the registered names only: looking a ``module:Name`` up imports
user code, which a membership test should not do.

This module imports nothing of tether's, so the pure layers (``tether.algos``) can build on it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. ``str(err)`` is the message (KeyError would print its repr)."""

    def __str__(self) -> str:
        return str(self.args[0])


def load_target(target: str) -> Any:
    """The object ``"package.module:Name"`` names, its module imported now (registries that store import paths, so
    an optional dependency is imported only when its entry is chosen)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _describe(entry: Any) -> str:
    """Who holds a taken name: ``by module.qualname`` for a function or class, ``as <repr>`` for a plain value."""
    if hasattr(entry, "__qualname__"):
        return f"by {entry.__module__}.{entry.__qualname__}"
    return f"as {entry!r}"


class Registry(Mapping[str, T]):
    """A read-only mapping of names to entries, plus ``register`` / ``add`` / ``unregister``.

    Args:
        kind: what the entries are, for error messages ("advantage", "task", "engine").
        check: called on every entry at registration and on every resolved ``module:Name``; raises TypeError on a
            bad signature (ValueError on a malformed value, such as a path), saying what is wrong with the entry:
            the registry prefixes which entry (``env 'my_env': ...``).
        tags: the optional inputs an entry may declare it needs (``register(name, needs=...)``).
        resolve: ``module:Name`` -> entry, for a lookup of a name with a colon; None when the registry takes none.
        own: how the unknown-name message spells a ``module:Name`` of the user's own ("module:Class").
    """

    def __init__(self, kind: str, check: Callable[[T], None] | None = None, tags: tuple[str, ...] = (), *,
                 resolve: Callable[[str], T] | None = None, own: str = "module:Name") -> None:
        self.kind = kind
        self._check = check
        self._tags = tags
        self._resolve = resolve
        self._own = own
        self._entries: dict[str, T] = {}
        self._needs: dict[str, frozenset[str]] = {}

    def add(self, name: str, entry: T, *, needs: tuple[str, ...] = ()) -> T:
        """Register ``entry`` under ``name`` and return it.

        Raises:
            ValueError: the name is taken (the message says by what).
            TypeError: ``check`` refuses the entry (or whatever it raises), or a need is not one of the registry's
                tags.
        """
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered ({_describe(self._entries[name])})")
        self._checked(name, entry)
        unknown = sorted(set(needs) - set(self._tags))
        if unknown:
            raise TypeError(f"{self.kind} '{name}' needs {unknown}; an entry may need: "
                            f"{', '.join(self._tags) or '(nothing)'}")
        self._entries[name] = entry
        self._needs[name] = frozenset(needs)
        return entry

    def _checked(self, name: str, entry: T) -> T:
        """``entry`` once ``check`` passes it; its TypeError or ValueError is prefixed with the kind and ``name``."""
        if self._check is not None:
            try:
                self._check(entry)
            except (TypeError, ValueError) as err:  # the same error, its message prefixed, its traceback kept
                err.args = (f"{self.kind} '{name}': {err}",)
                raise
        return entry

    def register(self, name: str, *, needs: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")``; :meth:`add` says what it refuses."""
        return lambda entry: self.add(name, entry, needs=needs)

    def unregister(self, name: str) -> T:
        """Remove and return an entry (for plug-ins that replace one, and for tests); KeyError if absent."""
        self._needs.pop(name, None)
        return self._entries.pop(name)

    @contextlib.contextmanager
    def restored(self) -> Iterator[Registry[T]]:
        """Within the block, register and unregister freely; afterwards the entries are what they were before."""
        entries, needs = dict(self._entries), dict(self._needs)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(entries)
            self._needs.clear()
            self._needs.update(needs)

    def needs(self, name: str) -> frozenset[str]:
        """The optional inputs the entry ``name`` needs (UnknownNameError for an unknown name); a ``module:Name``
        declares them as its ``needs`` attribute (a tuple of tags), if any."""
        entry = self[name]  # an unknown name raises here, listing the known ones
        return self._needs[name] if name in self._needs else frozenset(getattr(entry, "needs", ()))

    def unknown(self, name: str) -> UnknownNameError:
        """The error for a name that is not registered: one line listing the known names."""
        known = ", ".join(sorted(self._entries)) or "(none)"
        own = f", or {self._own} of your own" if self._resolve is not None else ""
        return UnknownNameError(f"unknown {self.kind} '{name}'; known: {known}{own}")

    def __getitem__(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if ":" in name and self._resolve is not None:
            return self._checked(name, self._resolve(name))
        raise self.unknown(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
