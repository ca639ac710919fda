# The authors' verl fork (complex-reasoning/RPG @ ec8e30bd), provisioned by scripts/setup.sh
# next to the venv. Tests that use it as an oracle get its path as the compile definition
# RPG_FORK_DIR and fail (never skip) when it is missing.
if(NOT DEFINED RPG_FORK_DIR)
  get_filename_component(rpg_venv_real "${CMAKE_SOURCE_DIR}/.venv" REALPATH)
  get_filename_component(rpg_cache_dir "${rpg_venv_real}" DIRECTORY)
  if(NOT EXISTS "${CMAKE_SOURCE_DIR}/.venv")
    if(DEFINED ENV{RPG_CACHE_DIR})
      set(rpg_cache_dir "$ENV{RPG_CACHE_DIR}")
    else()
      set(rpg_cache_dir "$ENV{HOME}/.cache/rpg")
    endif()
  endif()
  set(RPG_FORK_DIR "${rpg_cache_dir}/rpg-fork-ec8e30bd" CACHE PATH
      "The authors' verl fork at commit ec8e30bd (scripts/setup.sh provides it)")
endif()

function(rpg_use_fork target)
  target_compile_definitions(${target} PRIVATE RPG_FORK_DIR="${RPG_FORK_DIR}")
endfunction()
