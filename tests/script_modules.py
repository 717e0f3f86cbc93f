"""The files of `scripts/` as modules, for the tests of their pure parts (`scripts/` is not a package).

soak = load_script("soak")      # scripts/soak.py, a fresh module, registered as sys.modules["soak"]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py afresh. It is registered in `sys.modules` under `name` before it runs: dataclasses
    look their module up there, and a script that imports another (chaos_checkpoints imports chaos) finds it."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
