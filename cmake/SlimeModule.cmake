# slime_add_module(NAME SOURCES ... [DEPS ...] [PRIVATE_DEPS ...] [TORCH])
#   One static library per module (docs/architecture.md): target slime_<NAME>, alias slime::<NAME>.
#   Public headers live in include/slime/<NAME>/. TORCH marks a module that may include LibTorch:
#   it links LibTorch and gets a precompiled header; other modules never see torch include paths.
#   PRIVATE_DEPS are used by the module's sources only: their flags (e.g. gRPC's -pthread, which
#   would disable the torch modules' precompiled header) do not reach the modules that use it,
#   only their libraries reach the link. NAME, its TORCH flag and its slime:: DEPS and
#   PRIVATE_DEPS are checked against cmake/layering.txt (SlimeLayering.cmake): a dependency the
#   layering forbids stops the configure step.
include(SlimeLayering)
set(SLIME_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# All torch modules share one precompiled <torch/torch.h>, built once by slime_torch_pch.
if(SLIME_USE_PCH)
  add_library(slime_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  target_link_libraries(slime_torch_pch PRIVATE slime_torch_deps)
  target_compile_options(slime_torch_pch PRIVATE ${SLIME_WARNINGS})
  target_precompile_headers(slime_torch_pch PRIVATE <torch/torch.h>)
  set_target_properties(slime_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()

function(slime_add_module name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  slime_check_layering(${name} "${ARG_TORCH}" "${ARG_DEPS};${ARG_PRIVATE_DEPS}")
  # For scripts/check_layering.py: which sources each torch-free library compiles.
  set(sources)
  foreach(source IN LISTS ARG_SOURCES)
    get_filename_component(source ${source} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    file(RELATIVE_PATH source ${PROJECT_SOURCE_DIR} ${source})
    list(APPEND sources ${source})
  endforeach()
  string(REPLACE ";" " " sources "${sources}")
  set_property(GLOBAL APPEND PROPERTY SLIME_LIBRARY_SOURCES "${name}: ${sources}")
  set(target slime_${name})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(slime::${name} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                              ${PROJECT_BINARY_DIR}/include)
  target_compile_options(${target} PRIVATE ${SLIME_WARNINGS})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
  target_link_libraries(${target} PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(ARG_TORCH)
    target_link_libraries(${target} PRIVATE slime_torch_deps)
    if(SLIME_USE_PCH)
      target_precompile_headers(${target} REUSE_FROM slime_torch_pch)
    endif()
  endif()
endfunction()

# slime_add_test(NAME SOURCES ... DEPS ... LABELS ... [TORCH])
#   One gtest executable registered with ctest, every test carrying LABELS (unit, inproc,
#   multiproc, e2e, gpu). Tests labelled gpu skip themselves with a message where CUDA is absent.
function(slime_add_test name)
  cmake_parse_arguments(ARG "TORCH" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${SLIME_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} slime_test_paths GTest::gtest
                        GTest::gtest_main)
  # Helpers every test may use (tests/support/: promtool, test_paths, ...).
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  if(ARG_TORCH)
    target_link_libraries(${name} PRIVATE slime_torch_deps)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # Where tests find the repository and the real binary: the environment wins (ctest sets
  # SLIME_SOURCE_DIR), the configure-time paths of slime_test_paths (tests/CMakeLists.txt) are
  # the fallback when a test runs by hand.
  gtest_discover_tests(${name}
    TEST_PREFIX "${name}."
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
               ENVIRONMENT "SLIME_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()
