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
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  rpg_setup_target(${name} "${ARG_TORCH}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} rpg_test_common GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 120
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 900)
endfunction()
