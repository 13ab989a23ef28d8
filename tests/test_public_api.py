"""Each package's face: every name its `__all__` offers resolves, to the package's own object (so
`from ... import *` binds them all); importing the packages alone stays cheap (the names load their
modules on first use), as the command line, which imports parts of them, relies on."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ("faultcast.client", "faultcast.collector", "faultcast.model", "faultcast.service")
HEAVY = ("lightgbm", "sklearn", "pandas", "pyarrow", "torch")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_resolves_to_the_packages_own(package: str) -> None:
    module = importlib.import_module(package)
    names: list[str] = module.__all__
    assert names
    assert len(set(names)) == len(names)
    for name in names:
        value = getattr(module, name)
        assert value is not None, name
        assert getattr(value, "__module__", "").startswith(package + "."), (name, value)
        assert name in dir(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_name_not_offered_is_an_attribute_error(package: str) -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = importlib.import_module(package).no_such_name


def test_importing_the_packages_loads_no_model_stack_or_pytorch() -> None:
    probe = (
        f"import sys; import {', '.join(PACKAGES)}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
