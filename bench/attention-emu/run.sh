#!/usr/bin/env bash
# Builds and runs the CPU emulation of the CUDA attention kernels (see main.cpp); needs g++ ≥ 11.
# Slow (a thread per CUDA thread): about a minute on 2 cores.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
python3 - "$tmp/lib.h" <<'PY'
import re, sys
src = open("../../compiler/src/back/cuda/attention.rs").read()
open(sys.argv[1], "w").write(re.search(r'pub\(crate\) const LIB: &str = r#"(.*?)"#;', src, re.S).group(1))
PY
g++ -std=c++20 -O1 -w -pthread -I"$tmp" main.cpp -o "$tmp/emu"
"$tmp/emu" | tee "$tmp/out"
rm -rf "$tmp"
