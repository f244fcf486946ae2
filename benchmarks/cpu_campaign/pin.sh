# The campaigns' pinned commits and configs: a finished cell is reused only by the code that computed it, so every
# session of a campaign computes from its commit, whatever main has become since. Change a pin only to start that
# campaign over.   . pin.sh [CAMPAIGN]   (robustness, the default, or tuned)
case "${1:-robustness}" in
  robustness) PIN=b37dd46; CONFIG=configs/cpu_smollm2_forget01_robustness.yaml ;;
  tuned) PIN=597377b; CONFIG=configs/cpu_smollm2_forget01_tuned.yaml ;;   # issue 77 part 5
  *) echo "unknown campaign '$1': robustness or tuned" >&2; return 2 2>/dev/null || exit 2 ;;
esac
