"""The README's example output is what benchmarks/readme_example.py renders from the run
it names (docs/default-run/results.json: `make run` from a fresh clone), so the block
cannot drift from the code that prints it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_example", ROOT / "benchmarks/readme_example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_example_is_rendered_from_the_run_it_names():
    script = _script()
    readme = (ROOT / "README.md").read_text()
    pattern = re.escape(script.BEGIN) + r"\n(.*?)\n" + re.escape(script.END)
    shown = re.search(pattern, readme, re.S)
    assert shown is not None, "README.md has lost its example-output markers"
    commit = re.search(r"from a fresh clone at (\w+)", shown.group(1))
    assert commit is not None
    assert shown.group(1) == script.block(ROOT / "docs/default-run", commit.group(1))


def test_the_readme_figures_are_rendered_from_the_two_runs():
    script = _script()
    readme = (ROOT / "README.md").read_text()
    pattern = re.escape(script.FIGURES_BEGIN) + r"\n(.*?)\n" + re.escape(script.FIGURES_END)
    shown = re.search(pattern, readme, re.S)
    assert shown is not None, "README.md has lost its figures markers"
    made = script.figures_block(Path("docs/default-run"), Path("docs/replicate"))
    assert shown.group(1) == made
