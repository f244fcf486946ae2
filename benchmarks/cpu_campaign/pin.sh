# The campaign's pinned commit and config: a finished cell is reused only by the code that computed it, so every
# session computes from this commit, whatever main has become since. Change it only to start the campaign over.
PIN=b37dd46
CONFIG=configs/cpu_smollm2_forget01_robustness.yaml
