#!/usr/bin/env bash
# Builds, here (no GPU needed), the git-ignored payload a session carries to a lent GPU machine (the `device`
# tool): such a machine reaches no registry and no Hub, and takes at most 64 MiB per call. Run from the
# repository root:   bash benchmarks/gpu_session/prepare.sh [SHARED_DIR]    (default ../shared)
#   .gpu/  the wheels the machine lacks (lm-eval & co., ../shared/tools/gpu_wheels.sh; one solid xz archive,
#          wheels_xz.py: 5 MB instead of 13), TOFU and RWKU whole (xz, 7 MB: a subset would change the data
#          fingerprint cells record), the commit, and a shallow clone's .git (the copy sent there has none; with
#          it, run records name the commit and whether the package differed from it, as here)
#   .gpA/, .gpB/, .gpC/  SmolLM2's 98 MB GGUF in three parts: A fills call 1 up to 64 MiB, B fills call 2, C is
#          the rest. Every call also carries every tracked file, so two parts stopped fitting once committed results
#          grew the tree; with three, the tree can grow by ~25 MB more (C takes what A and B lose).
# Then, back to back (the machine stays warm ~30 s between calls; the parts are kept and joined in /tmp there):
#   call 1, carry [.gpu, .gpA]:  bash benchmarks/gpu_session/call1.sh     (installs; runs the gpu tests)
#   call 2, carry [.gpB]:        bash benchmarks/gpu_session/stash.sh     (keeps part B; seconds)
#   call 3, carry [.gpC]:        bash benchmarks/gpu_session/run.sh a 560 (joins the GGUF; runs CONFIG)
#   call 4, carry []:            bash benchmarks/gpu_session/run.sh b 560 (resumes the run)
# Each call leaves its log and a tarball of the results (work/ left out) under $OUT: unpack the last one at the
# repository root here. The output directory stays git-ignored on the machine while the run is under way (the tool
# keeps ignored files between calls); un-ignore it in .gitignore when its results are committed.
# A later lease (a fresh machine) resumes the same run: copy the last tarball to .gpR/results.tgz (and for a study
# run with --reuse, the reused run's tarball beside it, any name ending .tgz) before running this, and carry
# [.gpC, .gpR] in call 3; run.sh unpacks each run directory where the machine has none yet. The
# first cell that needs the fine-tuned model fine-tunes it again (runner.execute.PlanExecutor.finetuned_checkpoint).
# rehearse.sh plays these calls here on the CPU, in a copy of the machine's Python: run it after changing them.
set -euo pipefail
shared=${1:-../shared}
rm -rf .gpu .gpA .gpB .gpC
mkdir -p .gpu .gpA .gpB .gpC
bash "$shared/tools/gpu_wheels.sh" .gpu/wheels
python3 benchmarks/gpu_session/wheels_xz.py pack .gpu/wheels .gpu/whl.tar.xz && rm -rf .gpu/wheels
tar cJf .gpu/data.tar.xz -C "$shared/data" tofu rwku
git rev-parse --short HEAD > .gpu/commit
git clone -q --depth 1 "file://$PWD" .gpu/clone && mv .gpu/clone/.git .gpu/git && rm -rf .gpu/clone
gguf=$(python -c "from cru_harness.testbed.smollm import find_smollm2_gguf; print(find_smollm2_gguf())")
limit=$((64 * 1024 * 1024)); margin=1500000   # 1.5 MB of margin per call
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
gpr=$( [ -d .gpR ] && du -sb .gpR | cut -f1 || echo 0)
size_a=$((limit - margin - tree - $(du -sb .gpu | cut -f1)))
size_b=$((limit - margin - tree))
total=$(stat -c %s "$gguf")
[ "$size_a" -gt 0 ] && [ $((total - size_a - size_b + tree + gpr + margin)) -lt "$limit" ] || {
  echo "the tree ($((tree / 1024)) KiB) leaves too little room for the GGUF in three calls: make the tree or .gpu smaller"; exit 1; }
head -c "$size_a" "$gguf" > .gpA/part
dd if="$gguf" of=.gpB/part bs=1M iflag=skip_bytes,count_bytes skip="$size_a" count="$size_b" status=none
tail -c +"$((size_a + size_b + 1))" "$gguf" > .gpC/part
sha256sum "$gguf" | cut -c1-64 > .gpC/sha256
cat .gpA/part .gpB/part .gpC/part | cmp -s - "$gguf" || { echo "the three parts do not join to the GGUF"; exit 1; }
for call in "1 .gpu .gpA" "2 .gpB" "3 .gpC"; do
  set -- $call; n=$1; shift
  echo "call $n sends $(( (tree + $(du -sbc "$@" | tail -1 | cut -f1) + (n == 3 ? gpr : 0)) / 1024 )) KiB$( [ "$n" = 3 ] && [ "$gpr" -gt 0 ] && echo ' with .gpR') (limit $((limit / 1024)) KiB)"
done
