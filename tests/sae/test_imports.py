"""Other tools' SAE files, written here by hand as each library writes them (cfg.json and
safetensors key for key, a Gemma Scope npz), each read by causaldim and held to a
reference forward written below from the library's documented maths; every variant
causaldim cannot represent, and every damaged or unsafe file, refused in one line before
any work. Neither SAELens nor sparsify is needed (benchmarks/saelens_import.py holds the
same readings to the real libraries)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import gemma_scope_npz
from safetensors.torch import save_file
from test_pipeline import run_args

import causaldim
from causaldim import cli
from causaldim.errors import UsageError
from causaldim.sae.formats import check_weights, load_any, peek_d_in, peek_source

D, M, K = 32, 64, 6  # d: the tiny Llama's, whose layer 2 the CLI tests run


def draw(seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights with random biases, thresholds and decoder row norms (in [0.2, 3])."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(M, D, generator=g)
    norms = torch.rand(M, 1, generator=g) * 2.8 + 0.2
    return {
        "W_enc": torch.randn(D, M, generator=g) / D**0.5,
        "b_enc": torch.randn(M, generator=g) * 0.5,
        "W_dec": rows / rows.norm(dim=1, keepdim=True) * norms,
        "b_dec": torch.randn(D, generator=g) * 0.5,
        "threshold": torch.rand(M, generator=g) * 1.2 + 0.3,
    }


def inputs() -> torch.Tensor:
    return torch.randn(300, D, generator=torch.Generator().manual_seed(9))


# ------------------------------------------------------------------------------- SAELens


def saelens_folder(folder: Path, arch: str = "standard", t=None, **fields) -> Path:
    """cfg.json and sae_weights.safetensors as SAELens 6's save_model writes them."""
    t = dict(draw() if t is None else t)
    if arch != "jumprelu":
        t.pop("threshold", None)
    cfg = {
        "d_in": D,
        "d_sae": M,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {
            "sae_lens_version": "6.54.12",
            "hook_name": "blocks.2.hook_resid_post",
            "hook_head_index": None,
            "model_name": "tiny",
        },
        "architecture": arch,
        **({"k": K, "rescale_acts_by_decoder_norm": False} if arch == "topk" else {}),
        **fields,
    }
    folder.mkdir(parents=True)
    save_file(t, folder / "sae_weights.safetensors")
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def topk(pre: torch.Tensor, k: int) -> torch.Tensor:
    vals, idx = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter_(-1, idx, vals.relu())


def saelens_forward(t, cfg: dict, x: torch.Tensor):
    """SAELens 6: pre = (x - b_dec [apply_b_dec_to_input]) W_enc + b_enc; standard relu,
    jumprelu relu(pre) [pre > threshold], topk the k largest (of pre times the decoder
    norms with rescale_acts_by_decoder_norm) relu'd; x_hat = f (/ norms) W_dec + b_dec."""
    arch = cfg.get("architecture", "standard")
    pre = (x - t["b_dec"] * cfg.get("apply_b_dec_to_input", True)) @ t["W_enc"] + t["b_enc"]
    norms = t["W_dec"].norm(dim=-1)
    rescale = arch == "topk" and cfg.get("rescale_acts_by_decoder_norm", False)
    if arch == "jumprelu":
        f = pre.relu() * (pre > t["threshold"])
    elif arch == "topk":
        f = topk(pre * norms if rescale else pre, cfg["k"])
    else:
        f = pre.relu()
    return f, (f / norms if rescale else f) @ t["W_dec"] + t["b_dec"]


def assert_reads_as(sae, f_ref: torch.Tensor, x_hat_ref: torch.Tensor, x: torch.Tensor):
    f = sae.encode(x)
    assert torch.equal(f != 0, f_ref != 0), "another set of active features"
    assert (f - f_ref).abs().max() < 1e-5
    assert (sae.decode(f) - x_hat_ref).abs().max() < 1e-5
    assert (f != 0).any()


EXACT = {
    "standard": ("standard", {}),
    "standard, b_dec not subtracted": ("standard", {"apply_b_dec_to_input": False}),
    "topk": ("topk", {}),
    "topk, b_dec not subtracted": ("topk", {"apply_b_dec_to_input": False}),
    "jumprelu": ("jumprelu", {}),
    "jumprelu, b_dec not subtracted": ("jumprelu", {"apply_b_dec_to_input": False}),
    # The trainer's save_model of a TopK SAE: its config, norms not folded.
    "topk trainer checkpoint, rescaled by decoder norms": (
        "topk",
        {
            "rescale_acts_by_decoder_norm": True,
            "use_sparse_activations": False,
            "aux_loss_coefficient": 1.0,
            "decoder_init_norm": 0.1,
        },
    ),
    "topk rescaled, b_dec not subtracted": (
        "topk",
        {"rescale_acts_by_decoder_norm": True, "apply_b_dec_to_input": False},
    ),
    "bfloat16 config": ("standard", {"dtype": "bfloat16"}),
}


@pytest.mark.parametrize("case", EXACT)
def test_saelens_folders_encode_and_decode_as_saelens_does(tmp_path, case):
    arch, fields = EXACT[case]
    folder = saelens_folder(tmp_path / "sae", arch, **fields)
    cfg = json.loads((folder / "cfg.json").read_text())
    t = draw()
    if cfg["dtype"] == "bfloat16":  # SAELens holds the weights in its config's dtype
        t = {k: v.bfloat16().float() for k, v in t.items()}
    assert_reads_as(load_any(folder), *saelens_forward(t, cfg, inputs()), inputs())


def test_saelens_jumprelu_with_zero_thresholds_is_relu(tmp_path):
    t = {**draw(), "threshold": torch.zeros(M)}
    folder = saelens_folder(tmp_path / "sae", "jumprelu", t)
    cfg = json.loads((folder / "cfg.json").read_text())
    assert_reads_as(load_any(folder), *saelens_forward(t, cfg, inputs()), inputs())


def test_a_pre_6_topk_config_reads_its_k_from_the_activation_kwargs(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    t = {k: v for k, v in draw().items() if k != "threshold"}
    save_file(t, folder / "sae_weights.safetensors")
    cfg = {
        "d_in": D,
        "d_sae": M,
        "hook_point": "blocks.3.hook_resid_pre",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": K},
        "normalize_activations": False,
        "metadata": {"hook_name": "blocks.0.hook_resid_post"},  # SAELens drops it pre-6.0
    }
    (folder / "cfg.json").write_text(json.dumps(cfg))
    ref = saelens_forward(t, {"architecture": "topk", "k": K}, inputs())
    assert_reads_as(load_any(folder), *ref, inputs())
    assert peek_source(folder) == {"format": "saelens", "site": "blocks.3.hook_resid_pre"}


def test_a_scaling_factor_of_ones_is_dropped_as_saelens_drops_it(tmp_path):
    t = {**draw(), "scaling_factor": torch.ones(M)}
    folder = saelens_folder(tmp_path / "ones", "standard", t)
    cfg = json.loads((folder / "cfg.json").read_text())
    assert_reads_as(load_any(folder), *saelens_forward(draw(), cfg, inputs()), inputs())


# ------------------------------------------------------------------------------ sparsify


def sparsify_folder(folder: Path, t=None, weights: dict | None = None, **fields) -> Path:
    """cfg.json (SparseCoderConfig's fields and d_in) and sae.safetensors (save_model of
    the module: encoder.weight [m, d], encoder.bias, W_dec, b_dec) as sparsify writes."""
    t = draw() if t is None else t
    cfg = {
        "activation": "topk",
        "expansion_factor": 32,
        "normalize_decoder": True,
        "num_latents": M,
        "k": K,
        "multi_topk": False,
        "skip_connection": False,
        "transcode": False,
        "d_in": D,
        **fields,
    }
    folder.mkdir(parents=True)
    tensors = {
        "encoder.weight": t["W_enc"].T.contiguous(),
        "encoder.bias": t["b_enc"],
        "W_dec": t["W_dec"],
        "b_dec": t["b_dec"],
    }
    save_file(weights if weights is not None else tensors, folder / "sae.safetensors")
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def sparsify_forward(t, k: int, x: torch.Tensor):
    """sparsify: the k largest of relu((x - b_dec) encoder.weight^T + encoder.bias);
    x_hat = f W_dec + b_dec."""
    f = topk(((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu(), k)
    return f, f @ t["W_dec"] + t["b_dec"]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"normalize_decoder": False},
        {"multi_topk": True},
        {"num_latents": 0, "expansion_factor": 2},
    ],
)
def test_sparsify_folders_encode_and_decode_as_sparsify_does(tmp_path, fields):
    folder = sparsify_folder(tmp_path / "layers.2", **fields)
    assert_reads_as(load_any(folder), *sparsify_forward(draw(), K, inputs()), inputs())
    assert peek_source(folder) == {"format": "sparsify", "site": "layers.2"}


# --------------------------------------------------------------------------- Gemma Scope


def test_gemma_scope_keys_in_lower_case_read_as_saelens_loader_renames_them(tmp_path):
    t = draw()
    np.savez(
        tmp_path / "params.npz",
        w_enc=t["W_enc"].numpy(),
        w_dec=t["W_dec"].numpy(),
        b_enc=t["b_enc"].numpy(),
        b_dec=t["b_dec"].numpy(),
        threshold=t["threshold"].numpy(),
    )
    x = inputs()
    pre = x @ t["W_enc"] + t["b_enc"]  # Gemma Scope: no b_dec subtracted
    f = pre.relu() * (pre > t["threshold"])
    assert_reads_as(load_any(tmp_path / "params.npz"), f, f @ t["W_dec"] + t["b_dec"], x)


# ------------------------------------------------------------------------------ refusals


def edit_cfg(folder: Path, **fields) -> Path:
    cfg = json.loads((folder / "cfg.json").read_text())
    for key, value in fields.items():
        (cfg["metadata"] if key == "hook_head_index" else cfg)[key] = value
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def npz(path: Path, **arrays) -> Path:
    t = {k: v.numpy() for k, v in draw().items()}
    np.savez(path, **{k: v for k, v in {**t, **arrays}.items() if v is not None})
    return path


def truncated(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    return path


# name -> (make(folder) -> path, the refusal's words); every one is refused from the
# metadata alone (peek_d_in: no weights read) unless marked "weights".
REFUSED = {
    "saelens gated": (lambda p: saelens_folder(p, "gated"), "architecture 'gated' is a gated SAE"),
    "saelens abstopk": (lambda p: saelens_folder(p, "abstopk"), "'abstopk' is an AbsTopK SAE"),
    "saelens transcoder": (
        lambda p: saelens_folder(p, "jumprelu_transcoder"),
        "'jumprelu_transcoder' is a transcoder, not an SAE of the residual stream",
    ),
    "saelens batchtopk checkpoint": (
        lambda p: saelens_folder(p, "batchtopk"),
        "BatchTopK training checkpoint; save it with SAELens' save_inference_model",
    ),
    "saelens layer_norm": (
        lambda p: saelens_folder(p, normalize_activations="layer_norm"),
        "normalize_activations: 'layer_norm'",
    ),
    "saelens pre-6 normalised": (
        lambda p: edit_cfg(
            saelens_folder(p), metadata={}, normalize_activations=True, hook_point="x"
        ),
        "normalize_activations: 'expected_average_only_in'",
    ),
    "saelens hook_z": (
        lambda p: saelens_folder(p, reshape_activations="hook_z"),
        "reshape_activations: 'hook_z'",
    ),
    "saelens head": (
        lambda p: edit_cfg(saelens_folder(p), hook_head_index=3),
        "hook_head_index: 3 reads one attention head",
    ),
    "saelens k 0": (lambda p: saelens_folder(p, "topk", k=0), r"k = 0 is outside 1\.\.64"),
    "saelens k over width": (
        lambda p: saelens_folder(p, "topk", k=M + 1),
        r"k = 65 is outside 1\.\.64",
    ),
    "saelens k not an integer": (
        lambda p: saelens_folder(p, "topk", k="6"),
        r"k = '6' is outside 1\.\.64",
    ),
    "saelens W_dec against d_sae": (
        lambda p: saelens_folder(p, d_sae=M // 2),
        r"W_enc is \[32, 64\], its config says \[32, 32\]",
    ),
    "saelens d_in against W_dec": (
        lambda p: saelens_folder(p, d_in=D + 1),
        r"W_enc is \[32, 64\], its config says \[33, 64\]",
    ),
    "saelens missing b_enc": (
        lambda p: saelens_folder(p, t={k: v for k, v in draw().items() if k != "b_enc"}),
        "has no b_enc; SAELens' standard needs it",
    ),
    "saelens extra W_skip": (
        lambda p: saelens_folder(p, t={**draw(), "W_skip": torch.zeros(D, D)}),
        "holds W_skip, which SAELens' standard does not load",
    ),
    "saelens scaling_factor": (
        lambda p: saelens_folder(p, t={**draw(), "scaling_factor": torch.full((M,), 2.0)}),
        "scaling_factor is not all ones",
    ),
    "saelens damaged cfg.json": (
        lambda p: (saelens_folder(p) / "cfg.json").write_text("{not json") and p,
        "cfg.json is not valid JSON",
    ),
    "saelens truncated weights": (
        lambda p: truncated(saelens_folder(p) / "sae_weights.safetensors").parent,
        "sae_weights.safetensors is damaged or truncated",
    ),
    "saelens integer weights": (
        lambda p: saelens_folder(p, t={**draw(), "b_dec": torch.zeros(D, dtype=torch.int64)}),
        "b_dec holds I64, not floating-point weights",
    ),
    "saelens NaN weight": (
        lambda p: saelens_folder(p, t={**draw(), "W_enc": torch.full((D, M), float("nan"))}),
        "weights: W_enc holds 2,048 NaN or infinite values",
    ),
    "saelens infinite threshold": (
        lambda p: saelens_folder(
            p, "jumprelu", t={**draw(), "threshold": torch.full((M,), float("inf"))}
        ),
        "weights: threshold holds 64 NaN or infinite values",
    ),
    "saelens rescaled zero decoder row": (
        lambda p: saelens_folder(
            p,
            "topk",
            t={**draw(), "W_dec": torch.cat([torch.zeros(1, D), draw()["W_dec"][1:]])},
            rescale_acts_by_decoder_norm=True,
        ),
        "weights: rescale_acts_by_decoder_norm with a zero decoder row",
    ),
    "sparsify transcoder": (
        lambda p: sparsify_folder(p, transcode=True),
        "sparsify transcode: true is a transcoder, not an SAE of the residual stream",
    ),
    "sparsify skip connection": (
        lambda p: sparsify_folder(p, skip_connection=True),
        "sparsify skip_connection: true adds x W_skip",
    ),
    "sparsify W_skip without the flag": (
        lambda p: sparsify_folder(
            p,
            weights={
                "encoder.weight": torch.zeros(M, D),
                "encoder.bias": torch.zeros(M),
                "W_dec": torch.zeros(M, D),
                "b_dec": torch.zeros(D),
                "W_skip": torch.zeros(D, D),
            },
        ),
        "holds W_skip, which sparsify does not load",
    ),
    "sparsify groupmax": (
        lambda p: sparsify_folder(p, activation="groupmax"),
        "sparsify activation: 'groupmax'",
    ),
    "sparsify k over width": (
        lambda p: sparsify_folder(p, k=M + 1),
        r"k = 65 is outside 1\.\.64",
    ),
    "sparsify width against W_dec": (
        lambda p: sparsify_folder(p, num_latents=M * 2),
        r"encoder.weight is \[64, 32\], its config says \[128, 32\]",
    ),
    "npz object array": (
        lambda p: npz(p.with_suffix(".npz"), W_enc=np.array([{"a": 1}], dtype=object)),
        "W_enc is an object array, which only unpickling could read",
    ),
    "npz missing threshold": (
        lambda p: npz(p.with_suffix(".npz"), threshold=None),
        "has no threshold; Gemma Scope needs it",
    ),
    "npz truncated": (
        lambda p: truncated(npz(p.with_suffix(".npz"))),
        "params.npz is damaged or truncated",
    ),
    "npz W_dec against W_enc": (
        lambda p: npz(p.with_suffix(".npz"), W_dec=np.zeros((M, D + 1), np.float32)),
        r"W_dec is \[64, 33\], its config says \[64, 32\]",
    ),
    "npz NaN threshold": (
        lambda p: npz(p.with_suffix(".npz"), threshold=np.full(M, np.nan, np.float32)),
        "weights: threshold holds 64 NaN or infinite values",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_causaldim_cannot_read_is_refused_in_one_line(tmp_path, case):
    make, words = REFUSED[case]
    path = make(tmp_path / ("params" if case.startswith("npz") else "layers.2"))
    from_weights = words.startswith("weights: ")
    words = words.removeprefix("weights: ")
    if not from_weights:  # refused from the metadata alone, as the pipeline's check reads it
        with pytest.raises(UsageError, match=words) as exc:
            peek_d_in(path)
        assert "\n" not in str(exc.value)
    else:
        peek_d_in(path)
        with pytest.raises(UsageError, match=words):
            check_weights(path)
    with pytest.raises(UsageError, match=words) as exc:
        load_any(path)
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------ the CLI and the API

CLI_CASES = [
    "saelens NaN weight",
    "saelens k over width",
    "saelens W_dec against d_sae",
    "sparsify transcoder",
    "npz object array",
    "npz missing threshold",
    "saelens truncated weights",
]


@pytest.mark.parametrize("case", CLI_CASES)
@pytest.mark.parametrize("dry", [False, True])
def test_the_cli_refuses_each_in_one_line_exit_2_and_writes_nothing(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work, case, dry
):
    make, words = REFUSED[case]
    path = make(tmp_path / ("params" if case.startswith("npz") else "layers.2"))
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--sae-paths", str(path)]
    capsys.readouterr()
    assert cli.main(args + (["--dry-run"] if dry else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(words.removeprefix("weights: "), err)
    assert not out.exists()


def test_the_api_raises_a_usage_error_before_any_work(
    tmp_path, tiny_model, text_corpus, no_model_work
):
    path = REFUSED["sparsify groupmax"][0](tmp_path / "layers.2")
    with pytest.raises(UsageError, match="groupmax"):
        causaldim.measure(
            tiny_model("llama"),
            corpus=str(text_corpus),
            out=str(tmp_path / "run"),
            sae_paths=[str(path)],
            progress=False,
        )
    assert not (tmp_path / "run").exists()


def test_an_sae_of_another_width_than_the_model_is_refused_by_the_check(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    path = gemma_scope_npz(tmp_path / "params.npz", D + 16, M)
    args = run_args(tiny_model("llama"), text_corpus, tmp_path / "run")
    assert cli.main(args + ["--sae-paths", path, "--dry-run"]) == 2
    assert "the SAE reads d = 48" in capsys.readouterr().err


def test_one_imported_sae_is_told_what_kappa_hat_needs_and_costs_no_training(
    tmp_path, tiny_model, text_corpus, capsys
):
    path = gemma_scope_npz(tmp_path / "params.npz", D, M)
    args = run_args(tiny_model("llama"), text_corpus, tmp_path / "run") + ["--sae-paths", path]
    assert cli.main(args + ["--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "note: kappa_hat needs SAEs of 4 widths or more, and 1 imported SAE(s)" in printed
    assert re.search(r"\bsweep 0[, ]", printed)  # loading and scoring, no training
    assert not (tmp_path / "run").exists()
    assert cli.main(args + ["--quiet"]) == 0  # the run says it too, bars or none
    assert "note: kappa_hat needs SAEs of 4 widths or more" in capsys.readouterr().err
