# Compiler launcher and warnings shared by every target, set in one place so that the
# precompiled header's flags match the flags of every target that reuses it.

find_program(RPG_CCACHE ccache)
if(RPG_CCACHE)
  # CCACHE_BASEDIR makes paths relative, so fresh clones in other folders (CI) hit the
  # same cache; the sloppiness settings are what ccache needs to cache PCH users.
  set(launcher env "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}"
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_NOHASHDIR=true" "${RPG_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER ${launcher})
  message(STATUS "rpg: compiling through ccache (${RPG_CCACHE})")
endif()

set(RPG_WARNINGS -Wall -Wextra -Wno-unused-parameter)
