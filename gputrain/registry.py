"""A name -> builder table, filled by `@table.register(name)` in modules imported on first use.

Importing the member modules lazily keeps `import gputrain` cheap and lets a member that needs an
optional dependency fail only when it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, modules: list[str]) -> None:
        self._modules = modules
        """The modules whose `register` calls fill the table."""
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(item: T) -> T:
            self._items[name] = item
            return item

        return decorate

    def _load(self) -> None:
        if not self._loaded:
            for module in self._modules:
                importlib.import_module(module)
            self._loaded = True

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __getitem__(self, name: str) -> T:
        self._load()
        return self._items[name]
