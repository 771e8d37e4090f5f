"""Registries keyed by name, so YAML can name pluggable parts (policies, routers, cost models)."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from .errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self._items[name] = obj
            return obj
        return deco

    def get(self, name: str) -> T:
        key = name.strip().lower().replace("-", "_")
        if key not in self._items:
            raise UnknownNameError(self.kind, name, list(self._items))
        return self._items[key]

    def names(self) -> list[str]:
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """Names in registration order (for lookups where the first match wins)."""
        return list(self._items)
