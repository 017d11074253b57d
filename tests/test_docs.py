"""What the README tells a researcher holds: the default run's time is the one figure the
help quotes, and its Python and command-line examples name things that exist."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import causaldim
from causaldim import cli
from causaldim.api import Results
from causaldim.presets import DEFAULT_RUN_MINUTES, PRESETS
from causaldim.report.tables import TABLES

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_one_figure_for_the_default_runs_time(capsys):
    said = set(re.findall(r"about (\d+) min(?:utes)? on 2 CPU cores", README))
    assert said == {str(DEFAULT_RUN_MINUTES)}
    try:
        cli.main(["run", "--help"])
    except SystemExit:
        pass
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"about {DEFAULT_RUN_MINUTES} min on 2 CPU cores" in help_text


def test_the_readme_names_what_exists():
    for preset in re.findall(r"^\| `(\w+)` \|", README, re.M):
        assert preset in PRESETS or preset in ("hub", "ray", "dev"), preset
    for name in re.findall(r"res\.(\w+)", README):
        assert hasattr(Results, name) or name == "data", name
    for table in re.findall(r'to_dataframe\("(\w+)"\)|table\("(\w+)"\)', README):
        assert any(t in TABLES for t in table if t)
    assert callable(causaldim.measure) and callable(causaldim.load)
    code = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    commands = next(
        a.choices for a in cli._parser({})._actions if isinstance(a, argparse._SubParsersAction)
    )
    for verb in re.findall(r"^causaldim (\w+)", code, re.M):
        assert verb in commands, verb


def test_the_readme_memory_guide_is_what_the_memory_model_computes():
    """Generated, not typed: benchmarks/readme_memory.py rewrites the block; a change to
    causaldim.memory or the paper preset that leaves the README behind fails here."""
    spec = importlib.util.spec_from_file_location(
        "readme_memory", Path(__file__).parents[1] / "benchmarks" / "readme_memory.py"
    )
    guide = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guide)
    assert guide.in_readme(README) == guide.table(), "run python benchmarks/readme_memory.py"


def test_the_docs_atlases_are_what_their_atlas_json_renders():
    from causaldim.atlas import markdown_of
    from causaldim.fileio import read_sealed_json

    found = sorted((Path(__file__).parents[1] / "docs").glob("*/atlas.json"))
    assert found, "docs/ holds the claims' atlases with their atlas.json"
    for path in found:
        saved = read_sealed_json(path, "atlas")
        assert markdown_of(saved) == (path.parent / "atlas.md").read_text(), path
        assert saved["command"] in (path.parent / "atlas.md").read_text()
