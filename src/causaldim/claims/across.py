"""The claims about kappa one run cannot test, decided across runs (`causaldim claims RUN
RUN ...`, the atlas): the text (one model and layer, different corpora), the scale
(different models at matched relative depth, one corpus) and training (a model against
its nulls at one layer and corpus), each by kappa.py's rules and in both metrics."""

from __future__ import annotations

from itertools import combinations

from ..measures.sigma import HEADLINE
from .kappa import (
    ACT,
    LITERAL,
    MATCHED_DEPTH,
    RULES,
    TEXT_MOVES,
    _apart,
    _estimate,
    _kappa,
    _training_verdict,
)
from .verdicts import CONSTANT, KAPPA, UNTESTABLE, Claim, Decided, decided


def _label(name: str, results: dict) -> str:
    return f"{name} (layer {results['store']['layer']})"


def _relative_depth(results: dict) -> float:
    return (results["store"]["layer"] + 1) / results["store"]["model"]["n_layers"]


def _pairs(runs, same, differ) -> list:
    return [(a, b) for a, b in combinations(runs, 2) if same(a[1], b[1]) and differ(a[1], b[1])]


def _corpus(r: dict) -> str:
    return r["inputs"]["corpus"].get("sha256") or r["inputs"]["corpus"]["id"]


def _model(r: dict) -> str:
    """The weights' identity: a null of a model is another model."""
    return _weights(r) + str(_null(r) or "")


def _weights(r: dict) -> str:
    """The trained weights a run (or its null) comes from."""
    m = r["inputs"]["model"]
    return str(m.get("files") or m["name"].split(":")[0])


def _null(r: dict) -> dict | None:
    return r["inputs"]["model"].get("null")


def _compare(pairs, reading: str, rule) -> Decided:
    usable, why = [], []
    for (na, a), (nb, b) in pairs:
        ea, wa = _estimate(a, reading)
        eb, wb = _estimate(b, reading)
        if ea is None or eb is None:
            why.append(f"{na} / {nb}: {wa or wb}")
        else:
            usable.append(((na, a, ea), (nb, b, eb)))
    if not usable:
        return "n/a", UNTESTABLE, "; ".join(why) or "no pair of runs to compare"
    return rule(usable)


def _components(r: dict) -> frozenset[str]:
    """A corpus's parts: a mixture (a+b, or its id mix:a+b) holds each part and is broader
    than any of them."""
    cid = r["inputs"]["corpus"]["id"]
    return frozenset(cid.removeprefix("mix:").split("+"))


def _narrower(a: dict, b: dict) -> bool:
    return _components(a) < _components(b)


def _text_rule(usable) -> Decided:
    """Directed: the narrower text (a part of the other's mixture) needs fewer directions,
    apart by TEXT_MOVES+ with disjoint intervals."""
    shown, fewer = [], []
    for (na, a, ea), (nb, b, eb) in usable:
        (nn, n, en), (nw, w, ew) = (
            ((na, a, ea), (nb, b, eb))
            if _narrower(a, b)
            else (
                (nb, b, eb),
                (na, a, ea),
            )
        )
        ratio, apart = _apart(en, ew)
        fewer.append(
            apart and ratio >= TEXT_MOVES and en["erank_corrected"] < ew["erank_corrected"]
        )
        shown.append(
            f"narrow {_label(nn, n)} {_kappa(en)} vs broad {_label(nw, w)} {_kappa(ew)}: "
            f"x{ew['erank_corrected'] / en['erank_corrected']:.2f}"
        )
    return decided(
        "; ".join(shown),
        all(fewer),
        f"{sum(fewer)} of {len(fewer)} pairs have the narrower text's kappa below the "
        f"broader's by x{TEXT_MOVES}+ with disjoint intervals",
    )


def _family(r: dict) -> str | None:
    return r["store"]["model"]["identity"].get("family")


def _scale_rule(usable) -> Decided:
    shown, worst = [], 1.0
    for (na, a, ea), (nb, b, eb) in usable:
        ratio = max(ea["erank_corrected"], eb["erank_corrected"]) / min(
            ea["erank_corrected"], eb["erank_corrected"]
        )
        worst = max(worst, ratio)
        shown.append(f"{_label(na, a)} {_kappa(ea)} vs {_label(nb, b)} {_kappa(eb)}")
    return decided(
        "; ".join(shown),
        worst <= CONSTANT,
        f"largest / smallest kappa over the pairs x{worst:.2f} (alike: <= x{CONSTANT})",
    )


def _training_rule(usable) -> Decided:
    pairs = []
    for (na, a, ea), (nb, b, eb) in usable:
        (nt, t, et), (nn, n, en) = (
            ((na, a, ea), (nb, b, eb)) if _null(b) else ((nb, b, eb), (na, a, ea))
        )
        pairs.append((_label(nt, t), et, _label(nn, n), en))
    return _training_verdict(pairs, "their trained model")


def across(runs: list[tuple[str, dict]]) -> list[Claim]:
    """The claims one run cannot test, decided across runs: runs of one model and layer
    on different corpora (text); runs of different models at matched relative depth on
    one corpus (scale); a model against its nulls at one layer and corpus (training).
    Nulls enter the training claim only."""
    trained = [(name, r) for name, r in runs if not _null(r)]
    text_pairs = _pairs(
        trained,
        lambda a, b: _model(a) == _model(b) and a["store"]["layer"] == b["store"]["layer"],
        lambda a, b: _narrower(a, b) or _narrower(b, a),
    )
    # the paper's scale test is within a family (Gemma-2-2B against 9B): across families
    # the architecture, the data and the quantisation differ too, and no contrast is scale
    scale_pairs = _pairs(
        trained,
        lambda a, b: (
            _corpus(a) == _corpus(b)
            and _family(a) is not None
            and _family(a) == _family(b)
            and abs(_relative_depth(a) - _relative_depth(b)) < MATCHED_DEPTH
        ),
        lambda a, b: _model(a) != _model(b),
    )
    training_pairs = _pairs(
        runs,
        lambda a, b: (
            _weights(a) == _weights(b)
            and _corpus(a) == _corpus(b)
            and a["store"]["layer"] == b["store"]["layer"]
        ),
        lambda a, b: (_null(a) is None) != (_null(b) is None),
    )
    paper = runs[0][1]["paper"] if runs else {}
    return [
        _across_claim(
            "kappa_text",
            text_pairs,
            _text_rule,
            "no two runs of one model and layer on corpora of which one is part of the other "
            "(narrow text, such as one genre, against a mixture that holds it)",
            paper,
        ),
        _across_claim(
            "kappa_scale",
            scale_pairs,
            _scale_rule,
            "no two runs of different models of one family at matched relative depth on one "
            "corpus (across families, scale is not the only difference)",
            paper,
        ),
        _across_claim(
            "kappa_training",
            training_pairs,
            _training_rule,
            "no run of a model beside a run of its null (MODEL:permuted, MODEL:init) at one "
            "layer and corpus",
            paper,
        ),
    ]


def _across_claim(key: str, pairs: list, rule, none: str, paper: dict) -> Claim:
    spec = next(r for r in RULES if r.key == key)

    def decide(reading: str) -> Decided:
        return _compare(pairs, reading, rule) if pairs else ("n/a", UNTESTABLE, none)

    shown, verdict, reason = decide(HEADLINE)
    return Claim(
        key,
        KAPPA,
        spec.claim,
        spec.paper(paper),
        shown,
        spec.test,
        verdict,
        reason,
        literal=decide(LITERAL),
        activation_weighted=decide(ACT),
    )
