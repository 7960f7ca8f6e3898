#!/bin/sh
# bench/gemv_stream/run.sh [OLD_COMMIT] [ROUNDS]: build bench.cpp (g++ -O3 -march=native, no
# torch) and print q8_0 and 4-bit GB/s at batch 1 and 4, then a plain one-thread read.
set -e
cd "$(dirname "$0")"
old=${1:-HEAD}; rounds=${2:-5}; k=../../linnet/backends/torch/kernels
mkdir -p build
git show "$old:linnet/backends/torch/kernels/packed_int8_avx2.cpp" \
  | sed 's/namespace linnet_avx2/namespace old_avx2/' > build/old_int8.cpp
cp $k/packed_int8_avx2.cpp build/new_int8.cpp
# the f32 kernel up to its torch op, in a namespace of its own
sed '/^at::Tensor packed_linear/,$d; s/^namespace {/namespace f32k {/' $k/packed_gemv.cpp > build/f32k.cpp
echo '}' >> build/f32k.cpp
${CXX:-g++} -O3 -march=native -std=c++20 -Istub bench.cpp -o build/bench
${CXX:-g++} -O3 -march=native stream_read.cpp -o build/stream_read
for b in 1 4; do build/bench q8 $b "$rounds"; build/bench q4 $b "$rounds"; done
build/stream_read
