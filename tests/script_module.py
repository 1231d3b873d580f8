"""The repository's scripts/*.py as modules for the tests (scripts/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module, loaded once. It is registered in sys.modules (dataclasses resolve their
    annotations through it), and scripts/ is importable while it loads (a script may import a neighbour)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        sys.path.insert(0, str(SCRIPTS))
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        finally:
            sys.path.remove(str(SCRIPTS))
    return sys.modules[name]
