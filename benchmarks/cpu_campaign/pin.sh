# The campaigns' pinned commits and configs: a finished cell is reused only by the code that computed it, so every
# session of a campaign computes from its commit, whatever main has become since. Change a pin only to start that
# campaign over, or to a commit whose package code is the same (the same code version: every cell keeps its hash;
# tests/test_cpu_campaign.py checks it).   . pin.sh [CAMPAIGN]   (robustness, the default, or tuned)
case "${1:-robustness}" in
  robustness) PIN=b37dd46; CONFIG=configs/cpu_smollm2_forget01_robustness.yaml ;;
  # issue 77 part 5: the tuned run with its attacks, which holds every cell of configs/cpu_smollm2_forget01_tuned.yaml;
  # 597377b's package code (code version 075b6c8f1e0ab19d), the config added since
  tuned) PIN=3e5978e; CONFIG=configs/cpu_smollm2_forget01_tuned_robustness.yaml ;;
  *) echo "unknown campaign '$1': robustness or tuned" >&2; return 2 2>/dev/null || exit 2 ;;
esac
