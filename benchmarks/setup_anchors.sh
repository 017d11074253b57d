#!/usr/bin/env bash
# Creates benchmarks/.venv-anchors, the separate environment that benchmarks/anchors.py
# runs in: SAELens and sparsify (the anchors) are never causaldim dependencies, so they live
# here, beside an editable causaldim (--no-deps; its runtime needs are in the lock file).
#
#   bash benchmarks/setup_anchors.sh            # idempotent; VENV=... to put it elsewhere
#
# Pins: torch==2.13.0 (the CPU build on the project's machines; TORCH="" keeps whatever
# torch the venv has, TORCH="torch==X" picks another), sae-lens==6.54.12,
# transformer-lens==3.9.0, eai-sparsify==1.3.3, schedulefree==1.4.1, and every other
# package exactly as in benchmarks/anchors-requirements.txt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${VENV:-$here/.venv-anchors}"
python="${PYTHON:-python3}"
torch_spec="${TORCH-torch==2.13.0}"

test -x "$venv/bin/python" || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
if [ -n "$torch_spec" ]; then
    "${pip[@]}" "$torch_spec"
fi
"${pip[@]}" -r "$here/anchors-requirements.txt"
"${pip[@]}" --no-deps -e "$root"

"$venv/bin/python" - <<'PY'
from importlib.metadata import version

import causaldim.sae  # noqa: F401
import causaldim.harvest.store  # noqa: F401
import sae_lens  # noqa: F401
import sparsify  # noqa: F401

names = ("torch", "sae-lens", "transformer-lens", "eai-sparsify", "schedulefree", "causaldim")
print("anchors venv ready:", ", ".join(f"{n} {version(n)}" for n in names))
PY
