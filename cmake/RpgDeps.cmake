# Third-party libraries. libtorch and Arrow/Parquet come from the venv's torch and
# pyarrow wheels; everything else from Debian packages. Nothing is downloaded here.

if(NOT EXISTS "${RPG_PYTHON}")
  message(FATAL_ERROR "rpg: no Python at RPG_PYTHON=${RPG_PYTHON}; run scripts/setup.sh first")
endif()

execute_process(
  COMMAND "${RPG_PYTHON}" -c [=[
import os, torch, pyarrow
t = os.path.dirname(torch.__file__)
print(torch.__version__)
print(os.path.join(t, "include"))
print(os.path.join(t, "lib"))
print(pyarrow.get_include())
print(pyarrow.get_library_dirs()[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
]=]
  OUTPUT_VARIABLE py_out RESULT_VARIABLE py_rc ERROR_VARIABLE py_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT py_rc EQUAL 0)
  message(FATAL_ERROR "rpg: cannot import torch and pyarrow with ${RPG_PYTHON}: ${py_err}")
endif()
string(REPLACE "\n" ";" py_out "${py_out}")
list(GET py_out 0 RPG_TORCH_VERSION)
list(GET py_out 1 torch_include)
list(GET py_out 2 RPG_TORCH_LIB_DIR)
list(GET py_out 3 arrow_include)
list(GET py_out 4 RPG_ARROW_LIB_DIR)
list(GET py_out 5 torch_cxx11_abi)
message(STATUS "rpg: torch ${RPG_TORCH_VERSION} from ${RPG_TORCH_LIB_DIR}")

# libtorch. We link libtorch_cpu + libc10 directly instead of find_package(Torch): the
# wheel's TorchConfig.cmake insists on a CUDA toolkit at configure time although the build
# never compiles CUDA code. One binary serves CPU and GPU machines: libtorch's CUDA backend
# (libtorch_cuda.so of the same wheel) is never linked; src/rpg/core/device.cpp dlopen's it
# at device selection when a run asks for cuda, or for auto and the driver reports a GPU, so
# a CPU run maps no CUDA library (+0.2 s and +350 MiB per process otherwise).
add_library(rpg_torch INTERFACE)
target_include_directories(rpg_torch SYSTEM INTERFACE
  "${torch_include}" "${torch_include}/torch/csrc/api/include")
target_compile_definitions(rpg_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${torch_cxx11_abi})
set(torch_libs "${RPG_TORCH_LIB_DIR}/libtorch_cpu.so" "${RPG_TORCH_LIB_DIR}/libc10.so")
if(EXISTS "${RPG_TORCH_LIB_DIR}/libtorch_cuda.so")
  message(STATUS "rpg: CUDA backend ${RPG_TORCH_LIB_DIR}/libtorch_cuda.so (loaded at run time when a GPU is used)")
else()
  message(STATUS "rpg: CPU-only torch wheel: --device cuda will be an error")
endif()
if(RPG_CUDA)
  message(WARNING "rpg: RPG_CUDA is obsolete: every build loads the CUDA backend on demand (src/rpg/core/device.h)")
endif()
target_link_libraries(rpg_torch INTERFACE ${torch_libs})
add_library(rpg::torch ALIAS rpg_torch)

# Arrow / Parquet C++ from pyarrow. The wheel ships only versioned sonames
# (libarrow.so.NNNN); we link those files by full path rather than creating symlinks
# inside site-packages. arrow_python is never linked: it needs libpython.
function(rpg_find_versioned_lib out name)
  file(GLOB candidates "${RPG_ARROW_LIB_DIR}/lib${name}.so.[0-9]*")
  list(FILTER candidates EXCLUDE REGEX "\\.so\\.[0-9]+\\.[0-9]")
  list(LENGTH candidates n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "rpg: expected one lib${name}.so.N in ${RPG_ARROW_LIB_DIR}, found: ${candidates}")
  endif()
  set(${out} "${candidates}" PARENT_SCOPE)
endfunction()
rpg_find_versioned_lib(arrow_lib arrow)
rpg_find_versioned_lib(parquet_lib parquet)
add_library(rpg_arrow INTERFACE)
target_include_directories(rpg_arrow SYSTEM INTERFACE "${arrow_include}")
target_link_libraries(rpg_arrow INTERFACE "${parquet_lib}" "${arrow_lib}")
add_library(rpg::arrow ALIAS rpg_arrow)

# tcmalloc (gperftools' tcmalloc_minimal, Debian libgoogle-perftools-dev): the malloc of
# rpg-torch and of the benches that time its phases (src/rpg/core/malloc_env.h says why).
# -DRPG_MALLOC=glibc builds them on glibc's malloc, tuned by core/malloc_env instead.
set(RPG_MALLOC "tcmalloc" CACHE STRING "malloc of rpg-torch and its benches: tcmalloc or glibc")
set_property(CACHE RPG_MALLOC PROPERTY STRINGS tcmalloc glibc)
add_library(rpg_malloc INTERFACE)
if(RPG_MALLOC STREQUAL "tcmalloc")
  find_library(RPG_TCMALLOC_LIB tcmalloc_minimal)
  if(NOT RPG_TCMALLOC_LIB)
    message(FATAL_ERROR "rpg: libtcmalloc_minimal not found (apt-get install libgoogle-perftools-dev), "
                        "or configure with -DRPG_MALLOC=glibc")
  endif()
  # Linked for its malloc alone: nothing references its symbols, so a linker run with
  # --as-needed (a distribution's default) would drop it.
  target_link_libraries(rpg_malloc INTERFACE "-Wl,--push-state,--no-as-needed" "${RPG_TCMALLOC_LIB}" "-Wl,--pop-state")
elseif(NOT RPG_MALLOC STREQUAL "glibc")
  message(FATAL_ERROR "rpg: RPG_MALLOC=${RPG_MALLOC}: expected tcmalloc or glibc")
endif()
add_library(rpg::malloc ALIAS rpg_malloc)

find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Threads REQUIRED)
# libcurl (Debian libcurl4-openssl-dev): headers for src/rpg/reward/http_scorer.cpp, which dlopens
# the library; the reward service tests link it.
find_package(CURL REQUIRED)
# ICU: Unicode character properties (core) and normalization (tokenizer).
find_package(ICU REQUIRED COMPONENTS uc)
if(RPG_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
