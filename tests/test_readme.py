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


def _shown(begin: str, end: str) -> str:
    """The README's block between two markers."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), readme, re.S)
    assert found is not None, f"README.md has lost its markers {begin}"
    return found.group(1)


def test_the_readme_example_is_rendered_from_the_run_it_names():
    script = _script()
    shown = _shown(script.BEGIN, script.END)
    commit = re.search(r"from a fresh clone at (\w+)", shown)
    assert commit is not None
    assert shown == script.block(ROOT / "docs/default-run", commit.group(1))


def test_the_readme_figures_are_rendered_from_the_two_runs():
    script = _script()
    made = script.figures_block(Path("docs/default-run"), Path("docs/replicate"))
    assert _shown(script.FIGURES_BEGIN, script.FIGURES_END) == made
