#!/usr/bin/env bash
# One CPU session of a campaign (README.md beside this file), from the root of the checkout holding the landed
# results (main):   bash benchmarks/cpu_campaign/session.sh HH:MM [WORKERS] [CAMPAIGN]
# Makes (or reuses) a worktree of the campaign's pinned commit (pin.sh; CAMPAIGN: robustness, the default, or tuned)
# and a venv with that checkout installed, copies the landed cells into its compute directory, and starts WORKERS
# (default 2, one thread each) that start no cell they cannot end by the next HH:MM. Land what they finished with
# land.py before the machine goes.
set -euo pipefail
deadline=${1:?usage: session.sh HH:MM [WORKERS] [CAMPAIGN]}; workers=${2:-2}; campaign=${3:-robustness}
here=$(cd "$(dirname "$0")" && pwd); source "$here/pin.sh" "$campaign"
suffix=$([ "$campaign" = robustness ] && echo "" || echo "-$campaign")   # the first campaign's paths unchanged
main=$(pwd); wt=${CAMPAIGN_WORKTREE:-$main/../wt-campaign$suffix}; venv=${CAMPAIGN_VENV:-$main/../venv-campaign$suffix}
name=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['output_dir'])" "$CONFIG")

if [ ! -d "$wt" ]; then git worktree add --detach "$wt" "$PIN"; fi
[ "$(git -C "$wt" rev-parse HEAD)" = "$(git rev-parse "$PIN^{commit}")" ] || { echo "$wt is not at $PIN"; exit 2; }
[ -z "$(git -C "$wt" status --porcelain --untracked-files=no)" ] || { echo "$wt has uncommitted changes"; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --no-deps -e "$wt"
fi
# LUNAR's refusal prompts (docs/configs.md): the project does not ship them
harmful="$wt/data/lunar/harmful.json"
if [ "$(sha256sum "$harmful" 2>/dev/null | cut -c1-8)" != "8f5c0eac" ]; then
  echo "$harmful: LUNAR's dataset/splits/harmful.json is missing or other bytes (docs/configs.md says where)"; exit 3
fi
# the landed cells, where the compute directory has none yet (and a tuned run's saved choice)
for cell in "$main/$name"/cells/*/; do
  [ -d "$cell" ] || continue   # nothing landed yet
  hash=$(basename "$cell"); to="$wt/$name/cells/$hash"
  if [ -f "$cell/result.json" ] && [ ! -f "$to/result.json" ]; then
    mkdir -p "$to" && cp "$cell/run_record.json" "$cell/result.json" "$to/"
  fi
done
if [ -d "$main/$name/tuning" ]; then mkdir -p "$wt/$name/tuning" && cp -n "$main/$name"/tuning/*.json "$wt/$name/tuning/"; fi
# another version of a recorded library (a newer accelerate from the registry) makes every landed cell stale:
# refuse, naming the versions, rather than compute them all again
(cd "$wt" && "$venv/bin/python" "$here/worker.py" "$CONFIG" "$name" --check) || exit 4
mkdir -p "$wt/campaign-logs"
# HH:MM is the next such time: a session that passes midnight ends tomorrow
until=$(date -d "$deadline" +%Y-%m-%dT%H:%M)
if [ "$(date -d "$deadline" +%s)" -le "$(date +%s)" ]; then until=$(date -d "tomorrow $deadline" +%Y-%m-%dT%H:%M); fi
for i in $(seq 1 "$workers"); do
  (cd "$wt" && CRU_HARNESS_DATA_DIR=${CRU_HARNESS_DATA_DIR:-$main/../shared/data} TOKENIZERS_PARALLELISM=false \
     OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nohup "$venv/bin/python" "$here/worker.py" "$CONFIG" "$name" \
     --deadline "$until" > "campaign-logs/worker$i.log" 2>&1 &)
  sleep 15   # the first takes the fine-tune; the next ones wait for it or take other cells
done
echo "$workers workers until $until; progress: $wt/$name/campaign.log"
