#!/usr/bin/env bash
# Builds, here (no GPU needed), the git-ignored payload a session carries to a lent GPU machine (the `device`
# tool): such a machine reaches no registry and no Hub, and takes at most 64 MiB per call. Run from the
# repository root:   bash benchmarks/gpu_session/prepare.sh [SHARED_DIR]    (default ../shared)
#   .gpu/  the wheels the machine lacks (lm-eval & co., ../shared/tools/gpu_wheels.sh; one solid xz archive,
#          wheels_xz.py: 5 MB instead of 13), TOFU and RWKU whole (xz, 7 MB: a subset would change the data
#          fingerprint cells record), the commit, and a shallow clone's .git (the copy sent there has none; with
#          it, run records name the commit and whether the package differed from it, as here)
#   .gpA/, .gpB/  SmolLM2's 98 MB GGUF in two parts sized so that each call stays under 64 MiB
# Then, back to back (the machine stays warm ~30 s between calls; the parts are joined in /tmp there):
#   call 1, carry [.gpu, .gpA]:  bash benchmarks/gpu_session/call1.sh     (installs; runs the gpu tests)
#   call 2, carry [.gpB]:        bash benchmarks/gpu_session/run.sh a 560 (joins the GGUF; runs CONFIG)
#   call 3, carry []:            bash benchmarks/gpu_session/run.sh b 560 (resumes the run)
# Each call leaves its log and a tarball of the results (work/ left out) under $OUT: unpack the last one at the
# repository root here. The output directory stays git-ignored on the machine while the run is under way (the tool
# keeps ignored files between calls); un-ignore it in .gitignore when its results are committed.
# A later lease (a fresh machine) resumes the same run: copy the last tarball to .gpR/results.tgz before running
# this, and carry [.gpB, .gpR] in call 2; run.sh unpacks it where the machine has no output directory yet. The
# first cell that needs the fine-tuned model fine-tunes it again (runner.execute.PlanExecutor.finetuned_checkpoint).
# rehearse.sh plays these calls here on the CPU, in a copy of the machine's Python: run it after changing them.
set -euo pipefail
shared=${1:-../shared}
rm -rf .gpu .gpA .gpB
mkdir -p .gpu .gpA .gpB
bash "$shared/tools/gpu_wheels.sh" .gpu/wheels
python3 benchmarks/gpu_session/wheels_xz.py pack .gpu/wheels .gpu/whl.tar.xz && rm -rf .gpu/wheels
tar cJf .gpu/data.tar.xz -C "$shared/data" tofu rwku
git rev-parse --short HEAD > .gpu/commit
git clone -q --depth 1 "file://$PWD" .gpu/clone && mv .gpu/clone/.git .gpu/git && rm -rf .gpu/clone
gguf=$(python -c "from cru_harness.testbed.smollm import find_smollm2_gguf; print(find_smollm2_gguf())")
limit=$((64 * 1024 * 1024))
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
first=$((limit - tree - $(du -sb .gpu | cut -f1) - 1500000))   # 1.5 MB of margin
head -c "$first" "$gguf" > .gpA/part
tail -c +"$((first + 1))" "$gguf" > .gpB/part
sha256sum "$gguf" | cut -c1-64 > .gpB/sha256
call1=$((tree + $(du -sb .gpu | cut -f1) + $(du -sb .gpA | cut -f1)))
call2=$((tree + $(du -sb .gpB | cut -f1) + $( [ -d .gpR ] && du -sb .gpR | cut -f1 || echo 0)))
echo "call 1 sends $((call1 / 1024)) KiB, call 2 sends $((call2 / 1024)) KiB with .gpR if any (limit $((limit / 1024)) KiB)"
[ "$call2" -lt "$limit" ] || { echo "call 2 would exceed the limit: make the tree or .gpu smaller"; exit 1; }
