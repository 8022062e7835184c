# Locate LibTorch.
#   1. -DSLIME_TORCH_DIR=<dir with TorchConfig.cmake>   (explicit override)
#   2. a PyTorch install visible to python3              (the CUDA build on GPU machines)
#   3. Debian's libtorch-dev                             (CPU, LibTorch 1.13)
# Sets SLIME_TORCH_VERSION, SLIME_WITH_CUDA and SLIME_WITH_NCCL. CUDA and NCCL code is only
# compiled when the LibTorch found was built with CUDA.
if(SLIME_TORCH_DIR)
  set(Torch_DIR "${SLIME_TORCH_DIR}")
  if(EXISTS "${SLIME_TORCH_DIR}/share/cmake/Torch/TorchConfig.cmake")
    set(Torch_DIR "${SLIME_TORCH_DIR}/share/cmake/Torch")
  endif()
  message(STATUS "slime: LibTorch from SLIME_TORCH_DIR=${SLIME_TORCH_DIR}")
else()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _slime_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _slime_torch_rc)
    if(_slime_torch_rc EQUAL 0 AND _slime_torch_prefix)
      list(PREPEND CMAKE_PREFIX_PATH "${_slime_torch_prefix}")
      message(STATUS "slime: LibTorch from the PyTorch install at ${_slime_torch_prefix}")
    endif()
  endif()
endif()

find_package(Torch REQUIRED)
set(SLIME_TORCH_VERSION "${Torch_VERSION}")

set(SLIME_WITH_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR CAFFE2_USE_CUDA OR TORCH_CUDA_LIBRARIES)
  set(SLIME_WITH_CUDA ON)
endif()
# Our own CUDA kernels (src/engine/cuda/*.cu): raw pointers, no LibTorch headers.
if(SLIME_WITH_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # H100/H200; override with -DCMAKE_CUDA_ARCHITECTURES
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  enable_language(CUDA)
endif()
set(SLIME_WITH_NCCL OFF)
if(SLIME_WITH_CUDA)
  find_path(SLIME_NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_ROOT PATH_SUFFIXES include)
  find_library(SLIME_NCCL_LIBRARY nccl HINTS ENV NCCL_ROOT PATH_SUFFIXES lib lib64)
  if(SLIME_NCCL_INCLUDE_DIR AND SLIME_NCCL_LIBRARY)
    set(SLIME_WITH_NCCL ON)
  endif()
endif()

# Imported interface target carrying LibTorch's flags, so torch modules only link it.
add_library(slime_torch_deps INTERFACE)
target_include_directories(slime_torch_deps SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(slime_torch_deps INTERFACE ${TORCH_LIBRARIES})
if(TORCH_CXX_FLAGS)
  separate_arguments(_slime_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(slime_torch_deps INTERFACE ${_slime_torch_flags})
endif()
# PyTorch 2.x wheels ship fmt headers (a newer fmt, compiled into libtorch with hidden symbols)
# in their include directory. Torch translation units would pick those up instead of the
# system fmt that we, spdlog and the rest of the tree link against, and fail to link. A shadow
# include directory, searched before torch's, points <fmt/...> back at the system fmt.
foreach(_dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${_dir}/fmt/format.h" AND NOT _dir MATCHES "^/usr(/local)?/include/?$")
    find_path(SLIME_SYSTEM_FMT_DIR fmt/format.h
      PATHS /usr/include /usr/local/include NO_DEFAULT_PATH)
    set(_shadow "${PROJECT_BINARY_DIR}/torch_shadow_include")
    file(MAKE_DIRECTORY "${_shadow}")
    file(CREATE_LINK "${SLIME_SYSTEM_FMT_DIR}/fmt" "${_shadow}/fmt" SYMBOLIC)
    target_include_directories(slime_torch_deps BEFORE INTERFACE "${_shadow}")
    message(STATUS "slime: LibTorch ships its own fmt; torch targets use ${SLIME_SYSTEM_FMT_DIR}/fmt")
    break()
  endif()
endforeach()

# PyTorch wheels link libstdc++ statically into libtorch_cpu.so and export its symbols, among
# them std::filesystem (pytorch/pytorch#133437). If libtorch comes first in the search order,
# our calls bind to that older copy and crash. Naming the system libstdc++ first (before any
# object or library on the link line) makes the dynamic linker resolve std:: symbols to it.
if(TORCH_INSTALL_PREFIX MATCHES "site-packages")
  add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")
  message(STATUS "slime: PyTorch wheel LibTorch; libstdc++ is linked first")
endif()

# c10d's Gloo backend header includes <gloo/...>; PyTorch wheels do not ship those headers, so
# they come from Debian's libgloo-dev (installed on CPU machines, unpacked on the GPU machine).
find_path(SLIME_GLOO_INCLUDE_DIR gloo/algorithm.h)
if(NOT SLIME_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers not found: install libgloo-dev (scripts/setup.sh)")
endif()
target_include_directories(slime_torch_deps SYSTEM INTERFACE ${SLIME_GLOO_INCLUDE_DIR})
# c10d: Gloo everywhere (Debian ships the headers in libgloo-dev), NCCL with CUDA.
target_compile_definitions(slime_torch_deps INTERFACE USE_C10D_GLOO
  $<$<BOOL:${SLIME_WITH_CUDA}>:SLIME_WITH_CUDA>
  $<$<BOOL:${SLIME_WITH_NCCL}>:USE_C10D_NCCL SLIME_WITH_NCCL>)
if(SLIME_WITH_NCCL)
  target_include_directories(slime_torch_deps SYSTEM INTERFACE ${SLIME_NCCL_INCLUDE_DIR})
  target_link_libraries(slime_torch_deps INTERFACE ${SLIME_NCCL_LIBRARY})
endif()

message(STATUS "slime: LibTorch ${SLIME_TORCH_VERSION}, CUDA=${SLIME_WITH_CUDA}, NCCL=${SLIME_WITH_NCCL}")
