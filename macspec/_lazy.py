"""Lazy package exports (PEP 562), so importing a light module never loads MLX by accident.

`from macspec.models import load_catalog` imports only `macspec.models.catalog`; the loader,
and mlx-lm with it, load when a name from it is first used. This keeps `macspec --help`,
`models` and `history` free of MLX.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """(`__getattr__`, `__all__`) for a package whose names live in submodules.

    `exports` maps each public name to the submodule (relative to `package`) defining it.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__, sorted(exports)
