"""Registries keyed by name, so YAML can name pluggable parts (policies, routers, cost models)."""

from __future__ import annotations

import re
from typing import Callable, Generic, TypeVar

from .errors import UnknownNameError

T = TypeVar("T")


def name_key(name: str) -> str:
    """The one spelling rule for names a user types (registries, catalogs, host links): case,
    spaces, hyphens and underscores do not matter, so "swap-tail" is `swap_tail`, "PCIe 4 x16"
    is "pcie-4x16" and "Llama_2_7B" is "llama-2-7b"."""
    return re.sub(r"[\s_\-]+", "", str(name).lower())


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}  # by name_key
        self._names: dict[str, str] = {}  # name_key -> the registered spelling

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self._items[name_key(name)] = obj
            self._names[name_key(name)] = name
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Remove a registration (a test's temporary entry, so it does not leak into others)."""
        self._items.pop(name_key(name), None)
        self._names.pop(name_key(name), None)

    def get(self, name: str) -> T:
        key = name_key(name)
        if key not in self._items:
            raise UnknownNameError(self.kind, name, list(self._names.values()))
        return self._items[key]

    def names(self) -> list[str]:
        return sorted(self._names.values())

    def in_order(self) -> list[str]:
        """Names in registration order (for lookups where the first match wins)."""
        return list(self._names.values())
