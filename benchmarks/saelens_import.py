"""Does causaldim read other tools' SAEs exactly as their own library runs them? For every
variant: an SAE with random weights (biases, JumpReLU thresholds and decoder row norms
drawn at random) made and saved by the real SAELens or sparsify with its own save method
(a Gemma Scope params.npz written by hand and read by SAELens' own Gemma Scope loader),
read by causaldim as `--sae-paths` reads it (the pipeline's checks, then `load_any`), and
compared with the library's encode/decode of the saved files on the same inputs. Variants
causaldim cannot represent must be refused in one line. Prints one line a case; exits 1
on any mismatch (more than 1e-5, or another active set) or a wrong acceptance/refusal.

Runs in the anchors environment (SAELens and sparsify are never causaldim dependencies):

    bash benchmarks/setup_anchors.sh
    benchmarks/.venv-anchors/bin/python benchmarks/saelens_import.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import sae_lens
import torch
from sae_lens import SAE as LensSAE
from sae_lens.loading import pretrained_sae_loaders as lens_loaders
from sparsify import SparseCoder, SparseCoderConfig

from causaldim.errors import UsageError
from causaldim.sae.formats import check_weights, load_any, peek_d_in, peek_source

D, WIDTH, K, TOKENS, TOL = 64, 256, 8, 512, 1e-5
warnings.filterwarnings("ignore")


def randomise(module: torch.nn.Module, seed: int, zero_threshold: bool = False) -> None:
    """Every parameter and buffer random: encoder columns of norm about 1 (pre-activations
    of unit order on unit inputs), decoder rows of norms in [0.2, 3], thresholds in
    [0.3, 1.5] (or zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*module.named_parameters(), *module.named_buffers()]:
            if name in ("W_enc", "encoder.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / D**0.5)
            elif name == "W_dec":
                rows = torch.randn(p.shape, generator=gen)
                norms = torch.rand(p.shape[0], 1, generator=gen) * 2.8 + 0.2
                p.copy_(rows / rows.norm(dim=1, keepdim=True) * norms)
            elif name in ("threshold", "topk_threshold"):
                drawn = torch.rand(p.shape, generator=gen) * 1.2 + 0.3
                p.copy_(torch.zeros(p.shape) if zero_threshold else drawn)
            elif p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


# ------------------------------------------------------------------------------- SAELens


def lens_cfg(cls, **kw):
    return cls(
        d_in=D,
        d_sae=WIDTH,
        metadata=sae_lens.saes.sae.SAEMetadata(
            hook_name="blocks.3.hook_resid_post", sae_lens_version=sae_lens.__version__
        ),
        **kw,
    )


def lens_case(sae_cls, cfg_cls, save: str = "save_model", zero_threshold: bool = False, **kw):
    def make(folder: Path):
        sae = sae_cls(lens_cfg(cfg_cls, **kw))
        randomise(sae, 0, zero_threshold)
        getattr(sae, save)(folder)
        ref = LensSAE.load_from_disk(str(folder), device="cpu")
        return ref.encode, ref.decode

    return make


def lens_edited(sae_cls, cfg_cls, edit: dict, **kw):
    """A folder SAELens writes, its cfg.json then edited (a variant causaldim refuses)."""

    def make(folder: Path):
        lens_case(sae_cls, cfg_cls, **kw)(folder)
        cfg = json.loads((folder / "cfg.json").read_text())
        for key, value in edit.items():
            (cfg["metadata"] if key == "hook_head_index" else cfg)[key] = value
        (folder / "cfg.json").write_text(json.dumps(cfg))
        return None

    return make


def lens_refused(sae_cls, cfg_cls, **kw):
    def make(folder: Path):
        sae = sae_cls(lens_cfg(cfg_cls, **kw))
        randomise(sae, 0)
        sae.save_model(folder)
        return None

    return make


def gemma_scope(folder: Path):
    """A params.npz laid out as Gemma Scope's, read by SAELens' own Gemma Scope loader."""
    gen = np.random.default_rng(0)
    rows = gen.standard_normal((WIDTH, D))
    params = {
        "W_enc": gen.standard_normal((D, WIDTH)) / D**0.5,
        "W_dec": rows
        / np.linalg.norm(rows, axis=1, keepdims=True)
        * gen.uniform(0.2, 3, (WIDTH, 1)),
        "b_enc": gen.standard_normal(WIDTH) * 0.5,
        "b_dec": gen.standard_normal(D) * 0.5,
        "threshold": gen.uniform(0.3, 1.5, WIDTH),
    }
    path = folder / "layer_3" / "width_16k" / "average_l0_8" / "params.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, **{k: v.astype(np.float32) for k, v in params.items()})
    with mock.patch.object(lens_loaders, "hf_hub_download", lambda **kw: str(path)):
        cfg, state, _ = lens_loaders.gemma_2_sae_huggingface_loader(
            "google/gemma-scope-2b-pt-res",
            "layer_3/width_16k/average_l0_8",
            cfg_overrides={"d_in": D, "d_sae": WIDTH},
        )
    ref = LensSAE.from_dict(lens_loaders.handle_config_defaulting(cfg))
    ref.load_state_dict(state)
    return path, (ref.encode, ref.decode)


# ------------------------------------------------------------------------------ sparsify


def sparsify_case(**kw):
    def make(folder: Path):
        sae = SparseCoder(D, SparseCoderConfig(num_latents=WIDTH, k=K, **kw))
        randomise(sae, 1)
        sae.save_to_disk(folder)
        ref = SparseCoder.load_from_disk(folder)
        if kw.get("skip_connection") or kw.get("transcode") or kw.get("activation"):
            return None

        def encode(x):
            acts, idx, _ = ref.encode(x)
            return torch.zeros(len(x), WIDTH).scatter_(-1, idx, acts)

        def decode(f):
            acts, idx = f.topk(K, dim=-1)
            return ref.decode(acts, idx)

        return encode, decode

    return make


# --------------------------------------------------------------------------------- cases

S, T, J = sae_lens.StandardSAE, sae_lens.TopKSAE, sae_lens.JumpReLUSAE
SC, TC, JC = sae_lens.StandardSAEConfig, sae_lens.TopKSAEConfig, sae_lens.JumpReLUSAEConfig
TT, TTC = sae_lens.TopKTrainingSAE, sae_lens.TopKTrainingSAEConfig
CASES = {
    "saelens standard": lens_case(S, SC),
    "saelens standard apply_b_dec_to_input false": lens_case(S, SC, apply_b_dec_to_input=False),
    "saelens topk": lens_case(T, TC, k=K),
    "saelens topk apply_b_dec_to_input false": lens_case(T, TC, k=K, apply_b_dec_to_input=False),
    "saelens topk rescale_acts_by_decoder_norm": lens_case(
        T, TC, k=K, rescale_acts_by_decoder_norm=True
    ),
    "saelens jumprelu": lens_case(J, JC),
    "saelens jumprelu apply_b_dec_to_input false": lens_case(J, JC, apply_b_dec_to_input=False),
    "saelens jumprelu zero thresholds": lens_case(J, JC, zero_threshold=True),
    "saelens trainer standard save_model": lens_case(
        sae_lens.StandardTrainingSAE, sae_lens.StandardTrainingSAEConfig
    ),
    "saelens trainer standard save_inference_model": lens_case(
        sae_lens.StandardTrainingSAE, sae_lens.StandardTrainingSAEConfig, "save_inference_model"
    ),
    "saelens trainer topk save_model (rescale, norms not folded)": lens_case(TT, TTC, k=K),
    "saelens trainer topk save_inference_model (norms folded)": lens_case(
        TT, TTC, "save_inference_model", k=K
    ),
    "saelens trainer jumprelu save_model": lens_case(
        sae_lens.JumpReLUTrainingSAE, sae_lens.JumpReLUTrainingSAEConfig
    ),
    "saelens trainer jumprelu save_inference_model": lens_case(
        sae_lens.JumpReLUTrainingSAE, sae_lens.JumpReLUTrainingSAEConfig, "save_inference_model"
    ),
    "saelens trainer batchtopk save_inference_model (jumprelu)": lens_case(
        sae_lens.BatchTopKTrainingSAE,
        sae_lens.BatchTopKTrainingSAEConfig,
        "save_inference_model",
        k=K,
    ),
    "sparsify topk normalize_decoder true": sparsify_case(normalize_decoder=True),
    "sparsify topk normalize_decoder false": sparsify_case(normalize_decoder=False),
    "sparsify topk multi_topk true": sparsify_case(multi_topk=True),
    "gemma scope params.npz (SAELens' loader)": gemma_scope,
}
REFUSED = {
    "saelens gated": lens_refused(sae_lens.GatedSAE, sae_lens.GatedSAEConfig),
    "saelens abstopk": lens_refused(sae_lens.AbsTopKSAE, sae_lens.AbsTopKSAEConfig, k=K),
    "saelens transcoder": lens_refused(
        sae_lens.Transcoder, sae_lens.TranscoderConfig, d_out=D, apply_b_dec_to_input=False
    ),
    "saelens skip_transcoder": lens_refused(
        sae_lens.SkipTranscoder, sae_lens.SkipTranscoderConfig, d_out=D, apply_b_dec_to_input=False
    ),
    "saelens jumprelu_transcoder": lens_refused(
        sae_lens.JumpReLUTranscoder,
        sae_lens.JumpReLUTranscoderConfig,
        d_out=D,
        apply_b_dec_to_input=False,
    ),
    "saelens trainer batchtopk save_model": lens_refused(
        sae_lens.BatchTopKTrainingSAE, sae_lens.BatchTopKTrainingSAEConfig, k=K
    ),
    "saelens normalize_activations layer_norm": lens_edited(
        S, SC, {"normalize_activations": "layer_norm"}
    ),
    "saelens normalize_activations expected_average_only_in": lens_edited(
        S, SC, {"normalize_activations": "expected_average_only_in"}
    ),
    "saelens reshape_activations hook_z": lens_edited(S, SC, {"reshape_activations": "hook_z"}),
    "saelens hook_head_index 2": lens_edited(S, SC, {"hook_head_index": 2}),
    "saelens topk k 0": lens_edited(T, TC, {"k": 0}, k=K),
    "saelens topk k above width": lens_edited(T, TC, {"k": WIDTH + 1}, k=K),
    "sparsify skip_connection true": sparsify_case(skip_connection=True),
    "sparsify transcode true": sparsify_case(transcode=True),
    "sparsify activation groupmax": sparsify_case(activation="groupmax"),
}


def read_as_the_pipeline_does(path: Path):
    """--sae-paths: the check's metadata reads and finite weights, then the import."""
    peek_d_in(path)
    peek_source(path)
    check_weights(path)
    return load_any(path)


def main() -> int:
    x = torch.randn(TOKENS, D, generator=torch.Generator().manual_seed(2))
    failures = 0
    print(
        f"{'case':<62} {'max |f diff|':>12} {'max |x^ diff|':>13} {'max |f|':>7} {'L0':>6}  active"
    )
    for name, make in {**CASES, **REFUSED}.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "layers.3" if name.startswith("sparsify") else Path(tmp) / "sae"
            made = make(folder)
            path, lib = (
                made
                if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], Path)
                else (folder, made)
            )
            try:
                ours = read_as_the_pipeline_does(path)
            except UsageError as exc:
                wrong = name in CASES or "\n" in str(exc)
                failures += wrong
                line = str(exc).replace(f"{tmp}/", "")
                print(f"{name:<62} refused: {line}{'  <- WRONG' if wrong else ''}")
                continue
            if name in REFUSED:
                failures += 1
                print(f"{name:<62} accepted  <- WRONG: should be refused")
                continue
            with torch.no_grad():
                f, f_lib = ours.encode(x), lib[0](x)
                x_hat, x_hat_lib = ours.decode(f), lib[1](f_lib)
            df = (f - f_lib).abs().max().item()
            dx = (x_hat - x_hat_lib).abs().max().item()
            same = bool(((f != 0) == (f_lib != 0)).all())
            ok = df <= TOL and dx <= TOL and same
            failures += not ok
            l0 = (f != 0).float().sum(1).mean().item()
            print(
                f"{name:<62} {df:>12.2g} {dx:>13.2g} {f_lib.abs().max().item():>7.2f} {l0:>6.1f}  "
                f"{'same' if same else 'DIFFERENT'}{'' if ok else '  <- MISMATCH'}"
            )
    print(f"{len(CASES)} read exactly, {len(REFUSED)} refused; {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
