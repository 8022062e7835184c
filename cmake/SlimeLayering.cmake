# Reads the layering rules of cmake/layering.txt (its header says the format) and checks one
# library's DEPS against them: slime_check_layering(NAME TORCH DEPS) stops with an error naming
# both modules when NAME's module may not use a module one of its slime:: DEPS belongs to.
# Sets SLIME_LAYER_MODULES (the modules in order), SLIME_LAYER_MODULE_<lib>,
# SLIME_LAYER_TORCH_<lib> and SLIME_LAYER_USES_<module> (allowances included).
# Works in script mode too (cmake -P), which is how tests/scripts/layering_checker_test.py
# shows that a forbidden DEPS entry fails.
if(NOT SLIME_LAYERING_FILE)
  set(SLIME_LAYERING_FILE ${CMAKE_CURRENT_LIST_DIR}/layering.txt)
endif()

set(SLIME_LAYER_MODULES)
file(STRINGS ${SLIME_LAYERING_FILE} _slime_layer_lines)
set(_slime_layer_n 0)
foreach(_line IN LISTS _slime_layer_lines)
  math(EXPR _slime_layer_n "${_slime_layer_n} + 1")
  string(REGEX REPLACE "#.*" "" _line "${_line}")
  string(STRIP "${_line}" _line)
  if(_line STREQUAL "")
    continue()
  endif()
  if(_line MATCHES "^allow +([a-z0-9_]+) *-> *([a-z0-9_]+)$")
    list(APPEND SLIME_LAYER_USES_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  elseif(_line MATCHES "^([a-z0-9_]+): *([^|]*)\\|(.*)$")
    set(_module ${CMAKE_MATCH_1})
    set(_uses "${CMAKE_MATCH_3}")  # (string(REGEX) below resets CMAKE_MATCH_<n>)
    string(REGEX MATCHALL "[^ ]+" _libs "${CMAKE_MATCH_2}")
    string(REGEX MATCHALL "[^ ]+" _uses "${_uses}")
    list(APPEND SLIME_LAYER_MODULES ${_module})
    list(APPEND SLIME_LAYER_USES_${_module} ${_uses})
    foreach(_lib IN LISTS _libs)
      if(_lib MATCHES "^([a-z0-9_]+)\\(torch\\)$")
        set(SLIME_LAYER_TORCH_${CMAKE_MATCH_1} ON)
        set(_lib ${CMAKE_MATCH_1})
      else()
        set(SLIME_LAYER_TORCH_${_lib} OFF)
      endif()
      set(SLIME_LAYER_MODULE_${_lib} ${_module})
    endforeach()
  else()
    message(FATAL_ERROR "${SLIME_LAYERING_FILE}:${_slime_layer_n}: not a rule: '${_line}' "
                        "(expected '<module>: <libraries> | <modules>' or 'allow <a> -> <b>')")
  endif()
endforeach()

function(slime_check_layering name torch deps)
  set(module "${SLIME_LAYER_MODULE_${name}}")
  if(NOT module)
    message(FATAL_ERROR "layering: library slime_${name} belongs to no module of "
                        "${SLIME_LAYERING_FILE}: add it to its module's line")
  endif()
  if(torch AND NOT SLIME_LAYER_TORCH_${name})
    message(FATAL_ERROR "layering: library slime_${name} of module '${module}' is built with TORCH "
                        "but ${SLIME_LAYERING_FILE} declares it torch-free (write ${name}(torch))")
  elseif(NOT torch AND SLIME_LAYER_TORCH_${name})
    message(FATAL_ERROR "layering: library slime_${name} of module '${module}' is declared "
                        "${name}(torch) in ${SLIME_LAYERING_FILE} but built without TORCH")
  endif()
  foreach(dep IN LISTS deps)
    if(NOT dep MATCHES "^slime::(.+)$")
      continue()
    endif()
    set(lib ${CMAKE_MATCH_1})
    set(dep_module "${SLIME_LAYER_MODULE_${lib}}")
    if(NOT dep_module)
      message(FATAL_ERROR "layering: module '${module}' (slime_${name}) links ${dep}, a library "
                          "of no module in ${SLIME_LAYERING_FILE}")
    endif()
    if(NOT dep_module STREQUAL module AND NOT dep_module IN_LIST SLIME_LAYER_USES_${module})
      string(REPLACE ";" " " allowed "${SLIME_LAYER_USES_${module}}")
      message(FATAL_ERROR "layering: module '${module}' may not use module '${dep_module}': "
                          "slime_${name} links ${dep}. '${module}' may use: ${allowed} "
                          "(${SLIME_LAYERING_FILE})")
    endif()
  endforeach()
endfunction()
