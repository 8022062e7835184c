# Third-party dependencies (docs/dependencies.md says why each is here).
# All come from Debian 12 packages (scripts/setup.sh) or, on the GPU machine,
# from the prefix that scripts/device/run.sh unpacks.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)

# prometheus-cpp (Debian's prometheus-cpp-dev 1.0.1): we link its core library only (registry,
# metric types, text serializer); /metrics is served by our own HTTP layer, not its civetweb
# exposer. Its CMake package also loads the pull/push parts' dependencies (civetweb, CURL,
# ZLIB); where one of those is absent (the GPU machine's prefix) the core library and headers
# are found directly and the same target is made here.
find_package(prometheus-cpp CONFIG QUIET)
if(TARGET prometheus-cpp::core)
  message(STATUS "slime: prometheus-cpp (CMake package in ${prometheus-cpp_DIR})")
else()
  find_path(SLIME_PROMETHEUS_INCLUDE_DIR prometheus/text_serializer.h)
  find_library(SLIME_PROMETHEUS_CORE_LIBRARY NAMES prometheus-cpp-core
               PATH_SUFFIXES lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
  if(NOT SLIME_PROMETHEUS_INCLUDE_DIR OR NOT SLIME_PROMETHEUS_CORE_LIBRARY)
    message(FATAL_ERROR "prometheus-cpp not found: install prometheus-cpp-dev (scripts/setup.sh), "
                        "or on the GPU machine carry its .debs (scripts/device/fetch_debs.sh)")
  endif()
  add_library(prometheus-cpp::core UNKNOWN IMPORTED)
  set_target_properties(prometheus-cpp::core PROPERTIES
    IMPORTED_LOCATION "${SLIME_PROMETHEUS_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SLIME_PROMETHEUS_INCLUDE_DIR}")
  message(STATUS "slime: prometheus-cpp core ${SLIME_PROMETHEUS_CORE_LIBRARY} (without its CMake "
                 "package: a dependency of its pull/push parts is missing)")
endif()

if(NOT TARGET yaml-cpp::yaml-cpp)
  # Debian's yaml-cpp 0.7 exports the plain target name only.
  add_library(yaml-cpp::yaml-cpp INTERFACE IMPORTED)
  set_target_properties(yaml-cpp::yaml-cpp PROPERTIES INTERFACE_LINK_LIBRARIES yaml-cpp)
endif()

find_program(SLIME_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_program(SLIME_PROTOC protoc REQUIRED)

if(SLIME_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(SLIME_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()
