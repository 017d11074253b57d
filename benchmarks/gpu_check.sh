#!/usr/bin/env bash
# The GPU checks of issues 9 and 40, as one prepared script for a lent GPU machine (its python3
# holds CUDA torch, transformers, scipy, matplotlib, pytest and hypothesis; nothing is
# downloaded: the models are random-init or tiny). Logs go to $OUT (or ./gpu-logs).
#   device run: bash benchmarks/gpu_check.sh   (about 10 minutes on an H200)
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
# 1. GPU against CPU numbers, device resolution and placement.
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_devices.py 2>&1 | tee "$out/tests.log"
cd benchmarks
# 2. SAE step against the encoder-matmul floor at W = 131,072 (Gemma-2-2B's d = 2304).
timeout 180 python3 sae_step.py --device cuda --width 131072 --d 2304 --k 64 --batch 4096 \
    --archs topk jumprelu --dtypes bfloat16 float32 --rounds 3 --steps 10 2>&1 | tee "$out/sae_step.log"
# 3. Model pass throughput and memory at causaldim's batch size.
timeout 60 python3 model_pass.py --shape smollm2-135m --device cuda --seq-len 128 2>&1 | tee "$out/pass_smollm2.log"
timeout 120 python3 model_pass.py --shape gemma-2-2b --device cuda --seq-len 512 2>&1 | tee "$out/pass_gemma2.log"
# 4. The paper's widest SAE on this card (issue 40): for each optimiser, the widest of the
#    paper preset's widths whose estimate fits, trained a few steps, its peak beside the
#    estimate (and the allocator's reserve: the overhead the plan's headroom must cover).
timeout 420 python3 sae_memory.py --device cuda --sae-dtype bfloat16 --fit --steps 4 2>&1 | tee "$out/sae_memory.log"
