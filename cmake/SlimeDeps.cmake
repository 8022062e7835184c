# Third-party dependencies (docs/dependencies.md says why each is here).
# All come from Debian 12 packages (scripts/setup.sh) or, on the GPU machine,
# from the prefix that scripts/device/prepare.sh unpacks.
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
