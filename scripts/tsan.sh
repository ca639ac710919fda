#!/usr/bin/env bash
# ThreadSanitizer build and run of the threaded code (docs/robustness.md): core, jinja,
# tokenizer and reward compiled with -fsanitize=thread, and tests/core/threads_test.cpp
# (batch scoring, the Python reward pool and the reward service client shared by threads,
# batch tokenization, progress bar, metrics writer, 8 threads each).
#   scripts/tsan.sh [BUILD_DIR]      (default build-tsan; needs clang++ and a configured
#                                     build/ for build/generated/rpg/core/build_info.h)
# Exit status: the test's (a data race report fails it: TSAN_OPTIONS=halt_on_error=1).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/build-tsan}
gen=$src/build/generated
[ -f "$gen/rpg/core/build_info.h" ] && [ -f "$gen/rpg/reward/reward_worker_py.cpp" ] ||
  { echo "tsan.sh: configure build/ first (build/generated/rpg/core/build_info.h, .../reward/reward_worker_py.cpp)" >&2; exit 2; }
mkdir -p "$out/obj"
cxx=${CXX_TSAN:-clang++}
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=thread -I "$src/src" -I "$gen" -I "$src/tests/common"
       -I "$src/tests/tokenizer")
sources=(src/rpg/core/{args,config,io,log,metrics,progress,rng,signals,test_hook,text,unicode,jsonl}.cpp
         src/rpg/jinja/{lexer,parser,renderer,builtins,pystr,value,template}.cpp
         src/rpg/tokenizer/{unicode,pretokenize,load,tokenizer,bpe_trainer}.cpp
         src/rpg/reward/{text,math_dapo,math_lighteval,registry,overlong,python_pool,http_scorer}.cpp
         build/generated/rpg/reward/reward_worker_py.cpp
         tests/common/test_util.cpp tests/core/threads_test.cpp)
objs=()
for s in "${sources[@]}"; do
  o="$out/obj/$(echo "$s" | tr / _).o"
  if [ ! -f "$o" ] || [ "$src/$s" -nt "$o" ]; then
    echo "tsan: $s" >&2
    nice "$cxx" "${flags[@]}" -c "$src/$s" -o "$o"
  fi
  objs+=("$o")
done
nice "$cxx" -fsanitize=thread "${objs[@]}" -o "$out/threads_tests" -lgtest -lgtest_main -lyaml-cpp -licuuc -lcurl -ldl -lpthread
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "$out/threads_tests" "${@:2}"
