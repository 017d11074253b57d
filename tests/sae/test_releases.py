"""Pretrained SAEs by name (--sae-release, --sae-ids), and imported SAEs checked against
the run's layer. Nothing is downloaded: a fake release is written into a temp folder laid
out as the Hugging Face cache, and the download and listing seams serve from it or raise
huggingface_hub's own errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import gemma_scope_npz, hub_http_error, snapshot
from huggingface_hub import errors
from safetensors.torch import save_file
from test_pipeline import run_args

from causaldim import checks, cli
from causaldim import hub as hf
from causaldim.errors import UsageError
from causaldim.measures.diagnose import imported_l0_spread
from causaldim.sae import SAEConfig, build, releases
from causaldim.sae.formats import export_saelens
from causaldim.sweep_config import SweepConfig

D = 32  # the tiny Llama's d; its 4 blocks make layer 2 the default
SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "test-org/tiny-saes"


def saelens_folder(folder: Path, hook_name: str, d: int = D, m: int = 48) -> None:
    sae = build(SAEConfig("relu", d, m))
    sae.reset(torch.Generator().manual_seed(0))
    export_saelens(sae, folder, hook_name=hook_name)


class FakeHub:
    """Repos in a temp folder laid out as the HF cache (snapshots/<commit>/...), served by
    the seams; other repos answer as the hub would."""

    def __init__(self, root: Path):
        self.snapshot = root / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
        self.downloads: list[str] = []

    def _refuse(self, repo: str) -> None:
        if repo == "test-org/gated":
            raise hub_http_error(errors.GatedRepoError, f"Access to model {repo} is restricted")
        if repo == "test-org/unreachable":
            raise errors.LocalEntryNotFoundError("cannot find the requested files")
        if repo != REPO:
            raise hub_http_error(errors.RepositoryNotFoundError, f"Repository Not Found: {repo}")

    def download(self, repo: str, filename: str, revision: str | None = None) -> str:
        self._refuse(repo)
        assert revision in (None, SHA)
        path = self.snapshot / filename
        if not path.is_file():
            raise hub_http_error(errors.RemoteEntryNotFoundError, f"404: {filename}")
        self.downloads.append(filename)
        return str(path)

    def list_folder(self, repo: str, folder: str) -> list[str]:
        self._refuse(repo)
        path = self.snapshot / folder
        if not path.is_dir():
            raise hub_http_error(errors.RemoteEntryNotFoundError, f"404: {folder}")
        return sorted(p.name for p in path.iterdir() if p.is_file())


@pytest.fixture
def fake_hub(tmp_path, monkeypatch) -> FakeHub:
    fake = FakeHub(tmp_path / "hub")
    s = fake.snapshot
    gemma_scope_npz(s / "layer_2/width_64/average_l0_8/params.npz", D, 64, 1)
    gemma_scope_npz(s / "layer_2/width_128/average_l0_8/params.npz", D, 128, 2)
    gemma_scope_npz(s / "layer_1/width_64/average_l0_8/params.npz", D, 64, 3)  # block 1
    gemma_scope_npz(s / "layer_2/width_64/d16/params.npz", 16, 64, 4)  # another model's d
    saelens_folder(s / "blocks.3.hook_resid_pre", "blocks.3.hook_resid_pre")  # block 2
    saelens_folder(s / "blocks.2.hook_resid_pre", "blocks.2.hook_resid_pre")  # block 1
    saelens_folder(s / "blocks.2.hook_mlp_out", "blocks.2.hook_mlp_out")  # not the stream
    (s / "blocks.3.hook_resid_pre" / "sparsity.safetensors").write_bytes(b"not fetched")
    sparsify = s / "layers.2"
    sparsify.mkdir()
    gen = torch.Generator().manual_seed(0)
    save_file(
        {
            "encoder.weight": torch.randn(64, D, generator=gen),
            "encoder.bias": torch.zeros(64),
            "W_dec": torch.randn(64, D, generator=gen),
            "b_dec": torch.zeros(D),
        },
        sparsify / "sae.safetensors",
    )
    (sparsify / "cfg.json").write_text(json.dumps({"d_in": D, "num_latents": 64, "k": 4}))
    (s / "pickled").mkdir()
    (s / "pickled" / "sae.pt").write_bytes(b"\x80\x04 not unpickled")
    monkeypatch.setattr(releases, "download", fake.download)
    monkeypatch.setattr(releases, "list_folder", fake.list_folder)
    example = "layer_2/width_64/average_l0_8"
    monkeypatch.setitem(
        releases.RELEASES, "tiny-scope-res", releases.Release(REPO, "gemma-scope", "tiny", example)
    )
    monkeypatch.setitem(
        releases.RELEASES,
        "tiny-unreachable",
        releases.Release("test-org/unreachable", "gemma-scope", "tiny", example),
    )
    return fake


IDS = ["layer_2/width_128/average_l0_8", "layer_2/width_64/average_l0_8"]


def test_a_release_resolves_to_the_files_of_each_id_and_only_those_are_fetched(fake_hub):
    wanted = releases.resolve("tiny-scope-res", IDS)
    assert [w.files for w in wanted] == [(f"{i}/params.npz",) for i in IDS]
    fetched = releases.fetch(wanted)
    assert fake_hub.downloads == [f"{i}/params.npz" for i in IDS]
    assert fetched[1] == {
        "release": "tiny-scope-res",
        "id": IDS[1],
        "repo": REPO,
        "revision": SHA,
        "path": str(fake_hub.snapshot / IDS[1] / "params.npz"),
        "layout": "gemma-scope",
        "model": "tiny",
    }


def test_a_hub_repo_by_name_has_each_folders_layout_read_from_its_files(fake_hub):
    wanted = releases.resolve(REPO, ["blocks.3.hook_resid_pre", "layers.2", IDS[0]])
    assert [w.layout for w in wanted] == ["saelens", "sparsify", "gemma-scope"]
    fetched = releases.fetch(wanted)
    assert "blocks.3.hook_resid_pre/sparsity.safetensors" not in fake_hub.downloads
    assert fake_hub.downloads[:2] == [
        "blocks.3.hook_resid_pre/cfg.json",
        "blocks.3.hook_resid_pre/sae_weights.safetensors",
    ]
    assert fetched[0]["path"] == str(fake_hub.snapshot / "blocks.3.hook_resid_pre")
    assert fetched[1]["path"] == str(fake_hub.snapshot / "layers.2")
    with pytest.raises(UsageError, match="sae.pt is pickled"):
        releases.resolve(REPO, ["pickled"])
    with pytest.raises(UsageError, match="is pickled"):
        releases.resolve("tiny-scope-res", ["layer_2/sae.pth"])


def test_the_check_reads_each_imports_site_before_any_weights(
    fake_hub, harvest_config, no_model_work
):
    sweep = SweepConfig(sae_release=REPO, sae_ids=["blocks.3.hook_resid_pre", "layers.2"])
    plans = checks.check(harvest_config(), sweep)
    assert [(i["format"], i["site"], i["block"]) for i in plans.imports] == [
        ("saelens", "blocks.3.hook_resid_pre", 2),
        ("sparsify", "layers.2", 2),
    ]
    assert plans.sweep.sae_paths == [i["path"] for i in plans.imports]
    assert all(i["revision"] == SHA and i["release"] == REPO for i in plans.imports)


def test_an_sae_whose_metadata_names_nothing_passes_as_site_unknown(
    tmp_path, harvest_config, no_model_work
):
    sae = build(SAEConfig("relu", D, 48))
    sae.reset(torch.Generator().manual_seed(0))  # built weights are uninitialised memory
    export_saelens(sae, tmp_path / "unnamed")
    plans = checks.check(harvest_config(), SweepConfig(sae_paths=[str(tmp_path / "unnamed")]))
    assert plans.imports[0]["site"] == "unknown" and plans.imports[0]["block"] is None


def test_an_export_of_the_layer_passes_and_of_another_is_refused(
    tmp_path, harvest_config, no_model_work
):
    sae = build(SAEConfig("relu", D, 48))
    sae.reset(torch.Generator().manual_seed(0))  # built weights are uninitialised memory
    export_saelens(sae, tmp_path / "here", layer=2)
    export_saelens(sae, tmp_path / "there", layer=3)
    plans = checks.check(harvest_config(), SweepConfig(sae_paths=[str(tmp_path / "here")]))
    assert plans.imports[0]["site"] == "blocks.2.hook_resid_post"
    with pytest.raises(UsageError, match=r"names blocks.3.hook_resid_post \(the output of block 3"):
        checks.check(harvest_config(), SweepConfig(sae_paths=[str(tmp_path / "there")]))


def test_a_run_of_a_release_records_each_saes_provenance_and_flags_their_l0s(
    tmp_path, fake_hub, tiny_model, text_corpus, capsys
):
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--sae-release", "tiny-scope-res"]
    args += ["--sae-ids", *IDS]
    assert cli.main([*args, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "layer 2 is the output of block 2, named elsewhere TransformerLens/SAELens " in printed
    assert "blocks.2.hook_resid_post = blocks.3.hook_resid_pre, Hugging Face hidden_states[3]," in (
        printed
    )
    assert f"SAEs: {len(IDS)} imported, none trained: {IDS[0]} (layer_2)" in printed
    assert not out.exists()

    assert cli.main(args) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["config"]["sweep"]["sae_release"] == "tiny-scope-res"
    assert r["config"]["sweep"]["sae_ids"] == IDS and r["config"]["sweep"]["sae_paths"] == []
    assert [row["width"] for row in r["sweep"]["jumprelu"]["per_width"]] == [64, 128]
    source = r["saes"]["jumprelu-w64"]["source"]
    assert source == {
        "release": "tiny-scope-res",
        "id": IDS[1],
        "repo": REPO,
        "revision": SHA,
        "path": str(fake_hub.snapshot / IDS[1] / "params.npz"),
        "layout": "gemma-scope",
        "model": "tiny",
        "format": "gemma-scope",
        "site": "layer_2",
        "block": 2,
    }
    assert json.loads((out / "saes" / "jumprelu-w64" / "cfg.json").read_text())["source"] == source
    # Gemma Scope-like SAEs of one threshold fire about in proportion to their width.
    spread = r["sweep"]["jumprelu"]["l0_spread"]
    assert spread["flagged"] and spread["max"] > 1.1 * spread["min"]
    assert any("eval L0s differ by more than 10%" in w for w in r["sweep"]["jumprelu"]["warnings"])
    md = (out / "report.md").read_text()
    assert "eval L0s differ by more than 10%" in md
    assert f"imported SAE jumprelu-w64: tiny-scope-res {IDS[1]} (hub {REPO}, revision {SHA})" in md
    assert "named elsewhere TransformerLens/SAELens blocks.2.hook_resid_post = blocks.3." in md


def test_l0s_within_ten_percent_are_not_flagged():
    near = imported_l0_spread({"jumprelu": {64: {"l0": 40.0}, 128: {"l0": 43.9}}})
    assert not near["flagged"] and near["warning"] is None
    far = imported_l0_spread({"jumprelu": {64: {"l0": 40.0}}, "topk": {64: {"l0": 44.1}}})
    assert far["flagged"] and "40.0 (jumprelu-w64) to 44.1 (topk-w64)" in far["warning"]
    dead = imported_l0_spread({"relu": {64: {"l0": 0.0}, 128: {"l0": 3.0}}})
    assert dead["flagged"] and dead["ratio"] is None


def refusal_cases(tmp_path) -> dict[str, tuple[list[str], str]]:
    here = tmp_path / "local-saelens"
    saelens_folder(here, "blocks.2.hook_resid_pre")
    release = ["--sae-release", "tiny-scope-res", "--sae-ids"]
    return {
        "unknown release": (
            ["--sae-release", "nope-res", "--sae-ids", "a"],
            "--sae-release nope-res: unknown release; known: gemma-scope-2b-pt-res",
        ),
        "unknown id": (
            [*release, "layer_2/width_99/average_l0_1"],
            f"{REPO} has no layer_2/width_99/average_l0_1/params.npz; check the id (e.g. "
            "layer_2/width_64/average_l0_8)",
        ),
        "unknown repo": (
            ["--sae-release", "test-org/nothing", "--sae-ids", "x"],
            "the hub has no repository test-org/nothing",
        ),
        "gated repo": (
            ["--sae-release", "test-org/gated", "--sae-ids", "x"],
            "test-org/gated is gated; accept its terms on https://huggingface.co/test-org/gated, "
            "then log in (huggingface-cli login, or set HF_TOKEN)",
        ),
        "offline, not cached": (
            ["--sae-release", "tiny-unreachable", "--sae-ids", IDS[0]],
            "is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it",
        ),
        "release and paths": (
            [*release, IDS[0], "--sae-paths", str(here)],
            "--sae-release and --sae-paths both name the sweep's SAEs",
        ),
        "ids without release": (["--sae-ids", IDS[0]], "pass the release with --sae-release"),
        "release without ids": (
            ["--sae-release", "tiny-scope-res"],
            "name its SAEs with --sae-ids",
        ),
        "seeds": ([*release, IDS[0], "--sae-seeds", "2"], "with --sae-release nothing is"),
        "a gemma scope id of another layer": (
            [*release, "layer_1/width_64/average_l0_8"],
            "--sae-release tiny-scope-res --sae-ids layer_1/width_64/average_l0_8: its metadata "
            "names layer_1 (the output of block 1); this run measures --layer 2 "
            "(blocks.2.hook_resid_post); pass SAEs of layer 2, or --layer 1",
        ),
        "a saelens hook of another layer": (
            ["--sae-release", REPO, "--sae-ids", "blocks.2.hook_resid_pre"],
            "its metadata names blocks.2.hook_resid_pre (the output of block 1)",
        ),
        "a saelens hook off the stream": (
            ["--sae-release", REPO, "--sae-ids", "blocks.2.hook_mlp_out"],
            "blocks.2.hook_mlp_out is a site inside block 2, not the residual stream after a "
            "block (named by its metadata)",
        ),
        "another model's d": (
            [*release, "layer_2/width_64/d16"],
            "the SAE reads d = 16, layer 2 of",
        ),
        "pickled": (["--sae-release", REPO, "--sae-ids", "pickled"], "sae.pt is pickled"),
        "a local folder of another layer": (
            ["--sae-paths", str(here)],
            f"--sae-paths {here}: its metadata names blocks.2.hook_resid_pre (the output of "
            "block 1); this run measures --layer 2 (blocks.2.hook_resid_post); pass SAEs of "
            "layer 2, or --layer 1",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown release",
        "unknown id",
        "unknown repo",
        "gated repo",
        "offline, not cached",
        "release and paths",
        "ids without release",
        "release without ids",
        "seeds",
        "a gemma scope id of another layer",
        "a saelens hook of another layer",
        "a saelens hook off the stream",
        "another model's d",
        "pickled",
        "a local folder of another layer",
    ],
)
def test_refusals_are_one_line_before_any_work(
    tmp_path, fake_hub, tiny_model, text_corpus, capsys, no_model_work, case
):
    flags, message = refusal_cases(tmp_path)[case]
    out = tmp_path / "out"
    base = ["--quiet", "run", "--model", tiny_model("llama"), "--corpus", str(text_corpus)]
    base += ["--seq-len", "32", "--out", str(out)]
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([*base, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1 and err.startswith("causaldim: error: ")
    assert snapshot(tmp_path) == before and not out.exists()


def test_no_network_says_what_to_do_instead(fake_hub, monkeypatch):
    monkeypatch.setattr(hf, "offline", lambda: False)
    with pytest.raises(UsageError, match="the hub cannot be reached") as caught:
        releases.fetch(releases.resolve("tiny-unreachable", [IDS[0]]))
    assert "use local files with --sae-paths, or HF_HUB_OFFLINE=1 with a filled cache" in str(
        caught.value
    )


def test_the_table_names_the_releases_asked_for():
    for name in ("gemma-scope-2b-pt-res", "gemma-scope-9b-pt-res", "gpt2-small-res-jb"):
        assert name in releases.RELEASES
    assert releases.RELEASES["gemma-scope-2b-pt-res"].repo == "google/gemma-scope-2b-pt-res"
    assert releases.RELEASES["gpt2-small-res-jb"].repo == "jbloom/GPT2-Small-SAEs-Reformatted"
    assert any(
        r.layout == "sparsify" and r.repo.startswith("EleutherAI/")
        for r in releases.RELEASES.values()
    )
    for r in releases.RELEASES.values():
        assert r.layout in releases.LAYOUTS and r.example


def test_a_trained_sae_records_its_site_and_is_refused_at_another_layer(
    tmp_path, tiny_lm_store, harvest_config
):
    from causaldim.measures.sweep import run_sweep

    _, store = tiny_lm_store(1024)
    cfg = SweepConfig(widths=[16], k=4, epochs=1, batch_tokens=256, checkpoint_steps=0)
    (entry,) = run_sweep(store, tmp_path / "trained", cfg, progress=False)
    assert entry.meta["hook_name"] == "blocks.2.hook_resid_post"
    assert "hook_name" not in entry.meta["request"]  # earlier SAEs stay reusable
    with pytest.raises(UsageError, match=r"names blocks.2.hook_resid_post \(the output of block 2"):
        checks.check(harvest_config(layer=1), SweepConfig(sae_paths=[str(entry.folder)]))


def test_train_imports_a_release_as_run_does(tmp_path, fake_hub, tiny_model, text_corpus):
    out = tmp_path / "out"
    argv = ["--quiet", "train", "--model", tiny_model("llama"), "--corpus", str(text_corpus)]
    argv += ["--tokens", "2048", "--seq-len", "32", "--ce-sequences", "0", "--out", str(out)]
    assert cli.main([*argv, "--sae-release", "tiny-scope-res", "--sae-ids", IDS[1]]) == 0
    meta = json.loads((out / "saes" / "jumprelu-w64" / "cfg.json").read_text())
    assert meta["source"]["release"] == "tiny-scope-res" and meta["source"]["id"] == IDS[1]
    assert meta["hook_name"] == "blocks.2.hook_resid_post"
    assert sorted(p.name for p in (out / "saes").iterdir()) == ["jumprelu-w64"]


def test_releases_beyond_the_table_come_from_saelens_where_it_is_installed(fake_hub, monkeypatch):
    import sys
    import types

    lookups = {
        "lens-only-res": types.SimpleNamespace(
            repo_id=REPO,
            model="tiny",
            conversion_func=None,
            saes_map={"b3": "blocks.3.hook_resid_pre"},
        ),
        "lens-converted": types.SimpleNamespace(
            repo_id=REPO, model="tiny", conversion_func="gemma_3", saes_map={"x": "x"}
        ),
    }
    module = types.ModuleType("sae_lens.loading.pretrained_saes_directory")
    module.get_pretrained_saes_directory = lambda: lookups
    for name in ("sae_lens", "sae_lens.loading"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (wanted,) = releases.resolve("lens-only-res", ["b3"])  # SAELens' id, its folder in the repo
    assert wanted.layout == "saelens" and wanted.id == "b3"
    assert wanted.files == (
        "blocks.3.hook_resid_pre/cfg.json",
        "blocks.3.hook_resid_pre/sae_weights.safetensors",
    )
    assert releases.fetch([wanted])[0]["path"] == str(fake_hub.snapshot / "blocks.3.hook_resid_pre")
    with pytest.raises(UsageError, match=r"its own conversion \(gemma_3\)"):
        releases.resolve("lens-converted", ["x"])
    with pytest.raises(UsageError, match="unknown release"):
        releases.resolve("in-neither", ["x"])


def test_a_release_goes_through_the_same_reader_as_sae_paths(
    fake_hub, harvest_config, no_model_work
):
    from test_imports import draw, inputs, saelens_folder, saelens_forward, sparsify_folder

    from causaldim.sae.formats import load_any

    # A SAELens TopK trainer checkpoint (norms not folded) reads as SAELens runs it ...
    folder = saelens_folder(
        fake_hub.snapshot / "blocks.2.hook_resid_post", "topk", rescale_acts_by_decoder_norm=True
    )
    plans = checks.check(
        harvest_config(), SweepConfig(sae_release=REPO, sae_ids=["blocks.2.hook_resid_post"])
    )
    cfg = json.loads((folder / "cfg.json").read_text())
    f, x_hat = saelens_forward(draw(), cfg, inputs())
    sae = load_any(plans.imports[0]["path"])
    assert torch.equal(sae.encode(inputs()) != 0, f != 0)
    assert (sae.decode(sae.encode(inputs())) - x_hat).abs().max() < 1e-5
    # ... and a sparsify transcoder is refused by the check, in one line.
    sparsify_folder(fake_hub.snapshot / "layers.2.transcoder", transcode=True)
    sweep = SweepConfig(sae_release=REPO, sae_ids=["layers.2.transcoder"])
    with pytest.raises(UsageError, match="sparsify transcode: true is a transcoder"):
        checks.check(harvest_config(), sweep)
