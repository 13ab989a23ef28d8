"""A package face whose public names load their modules on first use (PEP 562).

The service, the command line and the collector import parts of `faultcast.model`, `.service` and
`.collector` whose callers must not pay for the rest (LightGBM, scikit-learn, pandas) on import;
each package's `__init__` names what users import and where it lives, and this gives it the module
`__getattr__` and `__dir__` that load a name the first time it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: MutableMapping[str, object]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose public names are `homes`' keys, each
    found in the module `homes[name]`; `namespace` is the package's `globals()`."""

    def __getattr__(name: str) -> object:  # noqa: N807 (the module hook's own name)
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value  # once loaded, an ordinary attribute
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
