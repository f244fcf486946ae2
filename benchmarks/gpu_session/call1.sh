# GPU machine, first call (carry .gpu and .gpA): install the wheels and the project, keep the GGUF's first part
# and TOFU / RWKU in /tmp (env.sh), run the gpu tests (benchmarks/results/gpu_tests.txt, copied to $OUT;
# GPU_TESTS_S=0 skips them).
source benchmarks/gpu_session/env.sh; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 benchmarks/gpu_session/wheels_xz.py unpack .gpu/whl.tar.xz "$T/whl" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$T/site" "$T"/whl/*.whl || exit 1
# Editable: the tests and `python3 -m cru_harness` run from the repository root, whose ./cru_harness would shadow
# an installed copy and has no cru_harness.configs (setuptools maps it from configs/).
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile -e . || exit 1
mkdir -p "$T/data" && stash_parts || exit 1
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" .gpu/data.tar.xz "$T/data" || exit 1
python3 -c "import lm_eval, torch; from cru_harness.runner.provenance import code_record; print('lm_eval', lm_eval.__version__, 'torch', torch.__version__, code_record())"
echo "installed in $(( $(date +%s) - t0 )) s"
if [ "${GPU_TESTS_S:-240}" = 0 ]; then   # a lease whose tests already ran on this code spends its minutes on runs
  echo "gpu tests: skipped (GPU_TESTS_S=0)"
else
  CRU_HARNESS_COMMIT=$(cat .gpu/commit) timeout "${GPU_TESTS_S:-240}" bash benchmarks/run_gpu_tests.sh > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit $?"; cp benchmarks/results/gpu_tests.txt "$OUT/" 2>/dev/null; tail -30 "$OUT/gpu_tests.log"
fi
echo "call 1 took $(( $(date +%s) - t0 )) s"
