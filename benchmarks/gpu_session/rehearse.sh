#!/usr/bin/env bash
# Rehearses the GPU session here, on the CPU, before a lent GPU's minutes are spent on it. It builds what the
# `device` tool would see: a venv holding only the GPU image's packages that the project touches (the tool's
# KINDS.md lists the image; lm-eval & co. are not in it), the payload of prepare.sh (its wheels rebuilt for this
# Python), and a copy of the tree as the tool sends it (tracked files and the carried folders, no .git). Then it
# plays the calls: call1.sh, whose gpu tests must fail for want of CUDA (not on an import), stash.sh, and run.sh
# twice on cpu_smollm2.yaml cut to GA (output results/rehearsal), the first stopped by its time limit, the second
# resuming; then a second lease on a fresh machine, where run.sh tried before stash.sh must refuse, resumes from
# the tarball with GD added, which needs the fine-tuned model.
# It also checks that the data carried there (one xz archive) has the fingerprints of the copy here.
#   bash benchmarks/gpu_session/rehearse.sh [SHARED_DIR] [WORK_DIR]    (needs the registry; ~25 min on 2 cores)
# REHEARSAL_PYTHON=python3.12 builds the venv with the H200's Python, so the wheels are prepare.sh's own.
# Rebuilds prepare.sh's payload in this checkout; everything else stays in WORK_DIR (default /tmp/gpu_rehearsal).
set -euo pipefail
shared=$(cd "${1:-../shared}" && pwd)
work=${2:-/tmp/gpu_rehearsal}
rm -rf "$work" && mkdir -p "$work/out" && work=$(cd "$work" && pwd)

echo "== the machine's python: torch, transformers, accelerate as there, and the image's packages the project uses"
"${REHEARSAL_PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip setuptools wheel
# the H200's torch: PyPI's CUDA build (with its nvidia-* wheels, ~3 GB), which runs on the CPU here
"$work/venv/bin/pip" install -q torch==2.11.0
"$work/venv/bin/pip" install -q transformers==5.17.0 accelerate==1.15.0 safetensors tokenizers huggingface_hub \
  scipy pandas matplotlib pytest numpy pyyaml regex requests tqdm pyarrow xxhash fsspec aiohttp httpx peft \
  sacrebleu scikit-learn sentencepiece jinja2 psutil packaging tabulate absl-py six click joblib pybind11 \
  portalocker colorama lxml
"$work/venv/bin/pip" uninstall -q -y pydantic pydantic-core 2>/dev/null || true   # pulled in, not in the image

echo "== the payload, and the wheels again for this Python"
bash benchmarks/gpu_session/prepare.sh "$shared"
head=$(git rev-parse HEAD)   # the commit the payload's .git names
py=$("$work/venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
sed "s/--python-version 3.12/--python-version $py/" "$shared/tools/gpu_wheels.sh" > "$work/wheels.sh"
bash "$work/wheels.sh" "$work/whl" && python3 benchmarks/gpu_session/wheels_xz.py pack "$work/whl" "$work/whl.tar.xz"

machine() {  # a fresh machine ($1: its name): the copy the device tool sends, an empty /tmp and cache
  dev=$work/$1 && mkdir "$dev"
  git ls-files -z | xargs -0 cp --parents -t "$dev"
  cp -r .gpu .gpA "$dev/" && cp "$work/whl.tar.xz" "$dev/.gpu/whl.tar.xz"
  cp "$work/rehearsal.yaml" "$work/rehearsal_gd.yaml" "$dev/"
  export GPU_SESSION_TMP=$work/$1.tmp CRU_HARNESS_CACHE=$work/$1.cache
}
call() {  # a device call: $OUT emptied, the command run in the copy's root
  rm -rf "$work/out" && mkdir -p "$work/out" && (cd "$dev" && OUT=$work/out bash -c "$1") > "$work/$2.txt" 2>&1 || true
  mkdir -p "$work/$2" && cp -r "$work/out/." "$work/$2/"
}
# cpu_smollm2.yaml cut to GA, then (the second lease) with GD beside it: GD needs the fine-tuned checkpoint
sed -e 's|^output_dir: .*|output_dir: results/rehearsal|' -e '/{method: \(NPO\|SimNPO\|IdkDPO\|CRU\),/d' \
  -e '/beta: 4.5, forget_weight/d' configs/cpu_smollm2.yaml > "$work/rehearsal_gd.yaml"
sed '/{method: GD,/d' "$work/rehearsal_gd.yaml" > "$work/rehearsal.yaml"
export PATH=$work/venv/bin:$PATH

echo "== lease 1, call 1: install, gpu tests"
machine lease1
call "GPU_TESTS_S=120 bash benchmarks/gpu_session/call1.sh" call1
carry() { rm -rf "$dev"/.gpA "$dev"/.gpB "$dev"/.gpC && { [ $# = 0 ] || cp -r "$@" "$dev/"; }; }   # its part only
carry .gpB
echo "== lease 1, call 2: keep part B"
call "bash benchmarks/gpu_session/stash.sh" stash1
carry .gpC
echo "== lease 1, call 3: join the GGUF, run for 240 s"
call "bash benchmarks/gpu_session/run.sh a 240 rehearsal.yaml" call2
carry
echo "== lease 1, call 4: resume"
call "bash benchmarks/gpu_session/run.sh b 600 rehearsal.yaml" call3
echo "== lease 2 (a fresh machine): call 1, a call 3 too early (part B missing), call 2, then call 3 resuming"
echo "   from lease 1's tarball, GD added"
machine lease2
call "GPU_TESTS_S=1 bash benchmarks/gpu_session/call1.sh" call4
carry .gpC && call "bash benchmarks/gpu_session/run.sh x 60 rehearsal.yaml" nostash
carry .gpB && call "bash benchmarks/gpu_session/stash.sh" stash2
carry .gpC && mkdir "$dev/.gpR" && cp "$work/call3/results_b.tgz" "$dev/.gpR/results.tgz"
call "bash benchmarks/gpu_session/run.sh c 600 rehearsal_gd.yaml" call5

fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }
check "call 1 installed lm-eval and the project, with the commit and a clean tree" \
  "grep -q \"^lm_eval 0.4.13 .*'commit': '$head', 'dirty': False\" '$work/call1.txt'"
check "the gpu tests were collected and failed for want of CUDA, not on an import" \
  "grep -q 'CRU_HARNESS_REQUIRE_GPU=1 demands it' '$work/call1/gpu_tests.txt' && ! grep -q 'ModuleNotFoundError\|ImportError' '$work/call1/gpu_tests.txt'"
check "a call carrying part C alone cannot join without part B (a skipped call 2 says so)" \
  "grep -q \"part B is not on the machine\" '$work/nostash.txt'"
check "call 3 joined the GGUF and finished a cell before its limit stopped it" \
  "grep -q '^run: exit 124' '$work/call2.txt' && grep -q ': ok in' '$work/call2/run_a.log'"
first=$(grep -o '\] [0-9a-f]\{16\} .*: ok in' "$work/call2/run_a.log" | head -1 | cut -d' ' -f2)
check "call 4 took over the lock, kept call 3's cells (${first:-none}) and finished the rest" \
  "[ -n '$first' ] && grep -q 'taking over the lock' '$work/call3/run_b.log' && grep -q '^run: exit 0' '$work/call3.txt' && ! grep -q '$first .*: running' '$work/call3/run_b.log'"
tar tzf "$work/call3/results_b.tgz" > "$work/tarball.txt"   # listed once: `tar | grep -q` fails under pipefail
check "the tarball holds the cells and a report, without work/" \
  "grep -q '^results/rehearsal/report/report.md$' '$work/tarball.txt' && ! grep -q '/work/' '$work/tarball.txt'"
check "lease 2 unpacked lease 1's cells, skipped them, and fine-tuned again for GD, with the recorded weights" \
  "grep -q '^resuming results/rehearsal from .gpR' '$work/call5.txt' && grep -q 'GA seed=0: finished earlier, skipped' '$work/call5/run_c.log' && grep -q 'fine-tuning it again' '$work/call5/run_c.log' && tar xzf '$work/call5/results_c.tgz' -C '$work' && grep -q '\"matches_recorded\": true' \$(grep -l '\"method\": \"GD\"' '$work'/results/rehearsal/cells/*/result.json)"
fingerprints() { python3 -c "import sys; from cru_harness.runner.provenance import data_fingerprint as f; print(f('tofu', sys.argv[1]), f('rwku', sys.argv[1]))" "$1"; }
here=$(fingerprints "$shared/data")
check "the carried TOFU and RWKU have the local copy's fingerprints ($here), and the cells recorded TOFU's" \
  "[ \"\$(fingerprints '$work/lease1.tmp/data')\" = '$here' ] && [ \"\$(grep -l '\"data\": \"${here%% *}\"' '$work'/results/rehearsal/cells/*/run_record.json | wc -l)\" = 5 ]"
echo "logs: $work/{call1,...,call5,stash1,stash2,nostash}.txt and the folders of the same names"
exit "$fail"
