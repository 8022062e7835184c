# Version and git hash baked into the binary (slime_train --version).
find_package(Git QUIET)
set(SLIME_GIT_HASH "$ENV{SLIME_GIT_HASH}")
if(NOT SLIME_GIT_HASH AND GIT_FOUND AND EXISTS "${CMAKE_SOURCE_DIR}/.git")
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    OUTPUT_VARIABLE SLIME_GIT_HASH OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT SLIME_GIT_HASH)
  set(SLIME_GIT_HASH "unknown")
endif()
