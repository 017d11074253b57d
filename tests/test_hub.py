"""The hub as a user meets it: switched off, out of reach, gated, or without the name;
each said in one line, at once, with nothing written; and a dry run of the paper preset
planned from the model's known shape with no network."""

from __future__ import annotations

import pytest
from conftest import hub_http_error, snapshot
from huggingface_hub import errors

from causaldim import cli, hub
from causaldim.errors import UsageError
from causaldim.model.load import KNOWN_SHAPES, resolve_model


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_the_paper_preset_plans_offline_from_the_models_known_shape(tmp_path, capsys, monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the offline dry run tried to reach the network")

    # no retries against a hub out of reach: not one connection is attempted
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    out = tmp_path / "paper"
    assert cli.main(["run", "--preset", "paper", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "google/gemma-2-2b (gemma2, 26 layers, d=2304), layer 12" in printed
    assert "planned from its known shape" in printed
    assert "dry run: nothing written" in printed
    assert not out.exists()


def test_a_run_of_a_hub_model_offline_stops_in_one_line(tmp_path, capsys, no_model_work):
    out = tmp_path / "paper"
    assert cli.main(["run", "--preset", "paper", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert "cannot be reached (HF_HUB_OFFLINE is set)" in err
    assert "'google/gemma-2-2b' is not in the HF cache" in err and "local model folder" in err
    assert not out.exists()


def test_no_network_is_said_at_once(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: False)
    out = tmp_path / "run"
    (out / "saes").mkdir(parents=True)
    before = snapshot(out)
    assert cli.main(["run", "--model", "someone/model", "--out", str(out)]) == 2
    assert "cannot be reached (no network) and model 'someone/model'" in _one_line(capsys)
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "error, said",
    [
        (errors.GatedRepoError, "is gated: accept its terms on its hub page"),
        (errors.RepositoryNotFoundError, "is not on the Hugging Face Hub"),
        (errors.RevisionNotFoundError, "has no such revision"),
    ],
)
def test_hub_refusals_name_the_fix(monkeypatch, tmp_path, capsys, error, said):
    import transformers

    def from_pretrained(name, **kw):
        if kw.get("local_files_only"):
            raise OSError("not in the cache")
        raise OSError("the client's own words") from hub_http_error(error)

    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    assert cli.main(["run", "--model", "someone/model", "--out", str(tmp_path / "x")]) == 2
    err = _one_line(capsys)
    assert f"model 'someone/model' {said}" in err
    assert not (tmp_path / "x").exists()


def test_known_shapes_are_used_only_when_planning_and_unreachable():
    for name, (family, _) in KNOWN_SHAPES.items():
        source = resolve_model(name, shape_only=True)
        assert source.kind == "known-shape" and source.family == family
        assert source.n_layers > 0 and source.d_model > 0
        with pytest.raises(UsageError, match="cannot be reached"):
            resolve_model(name)  # a run needs the real config
    with pytest.raises(UsageError, match="cannot be reached"):
        resolve_model("someone/unknown", shape_only=True)
