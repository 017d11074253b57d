"""Each kind of artifact, damaged three ways, is named in a one-line error (exit 2) and
never used; --repair recomputes it and the numbers come back."""

from __future__ import annotations

import json
import shutil

import pytest
from test_faults import args_for, numbers

from causaldim import cli
from causaldim.faults import ENV, InjectedFault

ARTIFACTS = {
    "store shard": "stores/*/train-00000.safetensors",
    "store manifest": "stores/L?-????????????/manifest.json",  # the run's, not its extension's
    "SAE weights": "saes/topk-w16/sae.safetensors",
    "SAE config": "saes/topk-w16/cfg.json",
}


def damage(path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("finished") / "run"
    args = args_for(tiny_model("llama"), text_corpus, out)
    assert cli.main(args) == 0
    return out, json.loads((out / "results.json").read_text())


def _copy(finished, tmp_path, tiny_model, text_corpus):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out, args_for(tiny_model("llama"), text_corpus, out)


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("kind", list(ARTIFACTS))
def test_damage_is_named_and_repaired(
    kind, how, finished, tmp_path, tiny_model, text_corpus, capsys
):
    out, args = _copy(finished, tmp_path, tiny_model, text_corpus)
    (path,) = out.glob(ARTIFACTS[kind])
    damage(path, how)
    before = (out / "results.json").read_bytes()
    capsys.readouterr()
    if (kind, how) == ("store manifest", "delete"):
        # A store without its manifest is one whose pass never finished (it is written
        # last): it is harvested again, and the run says so.
        assert cli.main(args) == 0
        assert f"{path.parent.name} is unfinished" in capsys.readouterr().err
    else:
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and path.name in err and "--repair" in err
        assert (out / "results.json").read_bytes() == before  # nothing rewritten
        assert cli.main([*args, "--repair"]) == 0
        if kind == "store shard":  # the note says why the store is harvested again
            note = capsys.readouterr().err
            assert "is damaged (" in note and path.name in note and "unfinished" not in note
    assert numbers(json.loads((out / "results.json").read_text())) == numbers(finished[1])


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_damaged_checkpoint_is_named_and_repaired(
    how, finished, tmp_path, tiny_model, text_corpus, capsys, monkeypatch
):
    out = tmp_path / "run"
    args = args_for(tiny_model("llama"), text_corpus, out)
    monkeypatch.setenv(ENV, "train.step:12")
    with pytest.raises(InjectedFault):
        cli.main(args)
    monkeypatch.delenv(ENV)
    folder = out / "saes" / ".partial-topk-w16"
    (tensors,) = folder.glob("state-*.safetensors")
    damage(tensors if how == "flip" else folder / "state.json", how)
    capsys.readouterr()
    if how == "delete":  # no state.json: no checkpoint was finished, training restarts
        assert cli.main(args) == 0
    else:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert ".partial-topk-w16" in err and "--repair" in err
        assert cli.main([*args, "--repair"]) == 0
    assert numbers(json.loads((out / "results.json").read_text())) == numbers(finished[1])


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_damaged_results_are_named_by_report(how, finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    damage(out / "results.json", how)
    assert cli.main(["report", str(out / "results.json")]) == 2
    assert "results.json" in capsys.readouterr().err


def test_written_files_are_plain_files_others_can_read(tmp_path):
    import os
    import stat

    from causaldim.fileio import UMASK, atomic_write_bytes

    path = tmp_path / "results.json"
    atomic_write_bytes(path, b"{}")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~UMASK  # 0644 under umask 022


def test_a_saved_sae_is_a_plain_folder_others_can_read(tmp_path):
    import os
    import stat

    from causaldim.fileio import UMASK
    from causaldim.sae import SAEConfig, build
    from causaldim.sae.formats import save

    folder = save(build(SAEConfig("topk", 8, 16, k=2)), tmp_path / "sae")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o777 & ~UMASK  # 0755 under umask 022
    for f in folder.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o666 & ~UMASK, f.name
