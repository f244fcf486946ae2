#!/usr/bin/env bash
# Run the `gpu` tests on a CUDA machine and record them in benchmarks/results/gpu_tests.txt:
# the GPU(s), torch / CUDA / transformers versions, and the pytest summary. A missing GPU fails the run
# (CRU_HARNESS_REQUIRE_GPU=1) instead of skipping, so the file never records a run that tested nothing.
#   bash benchmarks/run_gpu_tests.sh            (from the repository root; extra arguments go to pytest)
set -uo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/gpu_tests.txt
mkdir -p "$(dirname "$out")"
{
  echo "# gpu tests: python -m pytest -m gpu $*"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # A GPU machine's copy of the tree names its commit through CRU_HARNESS_COMMIT (its .git is a carried one).
  echo "commit: ${CRU_HARNESS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  python - <<'PY'
import torch, transformers, accelerate
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, transformers {transformers.__version__}, "
      f"accelerate {accelerate.__version__}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, bf16 {torch.cuda.is_bf16_supported()}")
if not torch.cuda.is_available():
    print("gpu: none visible")
PY
  echo
} > "$out"
CRU_HARNESS_REQUIRE_GPU=1 python -m pytest -m gpu -rA -q -p no:cacheprovider "$@" 2>&1 | tee -a "$out"
status=${PIPESTATUS[0]}
echo "wrote $out (pytest exit status $status)"
exit "$status"
