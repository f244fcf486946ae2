# GPU machine, call 2 (carry .gpB): keeps the GGUF's middle part in /tmp beside call 1's, for run.sh to join.
# It has a call of its own because the three parts together pass the 64 MiB a call may carry (prepare.sh).
source benchmarks/gpu_session/env.sh
stash_parts && ls -la "$T/gg"
