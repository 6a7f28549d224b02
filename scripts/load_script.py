"""Loads a script of this folder as a module: gen-fixtures.py (the fixture recipes, their
specs and writers) and gen-shapes.py are named for the command line, so `import` cannot
name them. Used by the scripts that build on the fixture generator (gemma4-configs.py,
gen-vision-fixtures.py, gap-probe.py)."""

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(file, name):
    """scripts/`file`, run once as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gen_fixtures():
    """scripts/gen-fixtures.py as the module gen_fixtures."""
    return load("gen-fixtures.py", "gen_fixtures")
