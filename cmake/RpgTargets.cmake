# Helpers that give every module and test the same shape:
#   rpg_add_library(<module> SOURCES ... [DEPS ...] [TORCH])  -> static library rpg_<module>
#   rpg_add_test(<name> SOURCES ... [DEPS ...] [TORCH])        -> GoogleTest binary registered with CTest
# TORCH links libtorch and reuses the one precompiled torch header.

set(RPG_TORCH_PCH_HEADER "${CMAKE_SOURCE_DIR}/src/rpg/core/torch_pch.h")
set(pch_stub "${CMAKE_BINARY_DIR}/generated/torch_pch_stub.cpp")
file(WRITE "${pch_stub}.in" "// compiled only to produce the shared precompiled header\n")
configure_file("${pch_stub}.in" "${pch_stub}" COPYONLY)
add_library(rpg_torch_pch OBJECT "${pch_stub}")
target_link_libraries(rpg_torch_pch PRIVATE rpg::torch)
target_compile_options(rpg_torch_pch PRIVATE ${RPG_WARNINGS})
target_precompile_headers(rpg_torch_pch PRIVATE "${RPG_TORCH_PCH_HEADER}")

function(rpg_setup_target target torch)
  target_compile_options(${target} PRIVATE ${RPG_WARNINGS})
  target_include_directories(${target} PUBLIC "${CMAKE_SOURCE_DIR}/src" "${CMAKE_BINARY_DIR}/generated")
  if(torch)
    target_link_libraries(${target} PUBLIC rpg::torch)
    target_precompile_headers(${target} REUSE_FROM rpg_torch_pch)
  endif()
endfunction()

function(rpg_add_library module)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(rpg_${module} STATIC ${ARG_SOURCES})
  rpg_setup_target(rpg_${module} "${ARG_TORCH}")
  target_link_libraries(rpg_${module} PUBLIC ${ARG_DEPS})
endfunction()

function(rpg_add_test name)
  # FIXTURES: CTest fixtures every test of the binary requires (e.g. a model made by a setup test).
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS;LABELS;FIXTURES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  rpg_setup_target(${name} "${ARG_TORCH}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} rpg_test_common GTest::gtest GTest::gtest_main)
  # CTest runs tests in parallel (-j2 on 2 cores): one intra-op thread per test process
  # (ours and the Python oracles') avoids oversubscription, which costs more than it gives.
  # PROPERTIES is one flat list (a list-valued property cannot be passed): the fixtures come
  # before ENVIRONMENT, whose second entry would otherwise swallow them.
  set(fixtures)
  if(ARG_FIXTURES)
    set(fixtures FIXTURES_REQUIRED ${ARG_FIXTURES})
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 120
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 900 ${fixtures} ENVIRONMENT "OMP_NUM_THREADS=1;MKL_NUM_THREADS=1")
endfunction()

# rpg_add_haswell_test(<name> <test binary target> <gtest filter> <label>)
# The binary's vectorised CPU paths as a CPU with AVX2 and FMA and no AVX-512 runs them: the
# x86-64-v3 builds of the loops (core/cpu_clones.h), which a machine with AVX-512 never picks,
# under qemu-user's Haswell (scripts/setup.sh installs it; without it the test fails).
# RPG_TEST_EXPECT_CPU lets a test check that the emulated CPU is that one (CpuClones.*).
find_program(RPG_QEMU_X86_64 qemu-x86_64)
function(rpg_add_haswell_test name target filter label)
  add_test(NAME ${name} COMMAND ${RPG_QEMU_X86_64} -cpu Haswell $<TARGET_FILE:${target}> "--gtest_filter=${filter}")
  set_tests_properties(${name} PROPERTIES LABELS ${label} ENVIRONMENT "RPG_TEST_EXPECT_CPU=x86-64-v3")
endfunction()

# rpg_add_device_path_test(<name> <test binary target> <gtest filter> <label>)
# The binary's decode tests through the device-generic decode path a GPU takes (position-major
# KV caches, SDPA under a mask, sampling by tensor operations), on the CPU:
# RPG_DECODE_ATTENTION=sdpa turns the CPU decode kernel off (model/decode_attention.h) and
# RPG_SAMPLER=torch the CPU sampling loops (rollout/sampler.cpp), so that path is tested before
# any GPU runs it.
function(rpg_add_device_path_test name target filter label)
  add_test(NAME ${name} COMMAND $<TARGET_FILE:${target}> "--gtest_filter=${filter}" --gtest_brief=1)
  set_tests_properties(${name} PROPERTIES LABELS ${label} TIMEOUT 900
    ENVIRONMENT "RPG_DECODE_ATTENTION=sdpa;RPG_SAMPLER=torch;OMP_NUM_THREADS=1;MKL_NUM_THREADS=1")
endfunction()

# rpg_add_fuzz_target(<name> SOURCES <target.cpp> <library .cpp files it exercises>...
#                     [LIBS <extra link flags>] [CORPUS <seed dir>] [SECONDS <n>])
# The target file defines LLVMFuzzerTestOneInput. With clang (Debian clang-14 +
# libclang-rt-14-dev, installed by scripts/setup.sh) it is built as a coverage-guided
# libFuzzer binary under ASan+UBSan; every listed source is compiled with the sanitizers.
# CTest runs it for a bounded time as test `fuzz.<name>`; a crash, leak, sanitizer report
# or timeout of one input fails the test.
find_program(RPG_CLANGXX NAMES clang++-14 clang++)
set(RPG_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz test runs")
function(rpg_add_fuzz_target name)
  cmake_parse_arguments(ARG "" "SECONDS" "SOURCES;LIBS;CORPUS" ${ARGN})
  if(NOT ARG_SECONDS)
    set(ARG_SECONDS ${RPG_FUZZ_SECONDS})
  endif()
  if(NOT RPG_CLANGXX)
    message(FATAL_ERROR "rpg: fuzz target ${name} needs clang++ (apt-get install clang-14 libclang-rt-14-dev)")
  endif()
  set(out "${CMAKE_CURRENT_BINARY_DIR}/fuzz_${name}")
  set(sources)
  foreach(s IN LISTS ARG_SOURCES)
    get_filename_component(abs "${s}" ABSOLUTE)
    list(APPEND sources "${abs}")
  endforeach()
  add_custom_command(
    OUTPUT "${out}"
    COMMAND "${RPG_CLANGXX}" -std=c++20 -O1 -g -fno-omit-frame-pointer
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I "${CMAKE_SOURCE_DIR}/src" -I "${CMAKE_BINARY_DIR}/generated"
            -MD -MF "${out}.d"
            ${sources} ${ARG_LIBS} -o "${out}"
    DEPENDS ${sources}
    DEPFILE "${out}.d"
    COMMENT "Building libFuzzer target fuzz_${name}"
    VERBATIM)
  add_custom_target(fuzz_${name}_bin ALL DEPENDS "${out}")
  set(work "${CMAKE_CURRENT_BINARY_DIR}/fuzz_${name}_corpus")
  set(corpus_args "${work}")
  foreach(c IN LISTS ARG_CORPUS)
    get_filename_component(abs "${c}" ABSOLUTE)
    list(APPEND corpus_args "${abs}")
  endforeach()
  add_test(NAME fuzz.${name}
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
            sh -c "mkdir -p \"$1\" && exec \"$0\" -max_total_time=${ARG_SECONDS} -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \"$@\""
            "${out}" ${corpus_args})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 600)
endfunction()
