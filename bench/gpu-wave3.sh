#!/usr/bin/env bash
# Third H200 run of the wave (issue 12): the complex GRU against complextorch at the example's
# size and on long sequences (bench/gpu-gru.sh), then the GPU tests that earlier runs cut
# off (3-D volume layers, 64-bit indexing). Each step appends to one summary file in $OUT.
#   bench/gpu-wave3.sh [tests-timeout-s]
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_REQUIRE_GPU=1 CVC_GPU_BIN=.gpu
S=${OUT:-/tmp}/summary.txt
say() { tee -a "$S"; }
( OUT=/tmp timeout 200 bash bench/gpu-gru.sh --batch 32 --length 512 --hidden 16 --peer-timeout 100 2>&1 | tail -6 ) | say
( OUT=/tmp timeout 150 bash bench/gpu-gru.sh --batch 128 --length 4096 --hidden 32 --steps 10 --no-compile --peer-timeout 100 2>&1 | tail -5 ) | say
grep -h -E "^plan|arena|measured|recurrence" /tmp/gru/plan_cvc_b128_l4096_h32.txt 2>/dev/null | head -6 | say
timeout "${1:-200}" .gpu/gpu --test-threads 1 --nocapture volume_layers sixty_four_bit > /tmp/g.txt 2>&1
echo "gpu tests rc=$?" | say
grep -E "\.\.\. ok$|^ok$|FAILED|FAILS|panicked|test result|^test |checked" /tmp/g.txt | cut -c1-160 | tail -60 | say
