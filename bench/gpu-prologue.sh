# Sourced by the wave scripts from bench/gpu-wave15.sh on (the older ones repeat these lines):
# the repository root as the working directory (and as /work/main, where the tests look for
# it), $O (the call's $OUT), $W (a scratch folder whose logs the script archives), $S (the
# summary file), NVRTC on the library path and the device printed into the summary.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
W=$(mktemp -d)
S=$O/summary.txt
. bench/gpu-env.sh | tee -a "$S"
