# The sanitizer build: ORCHARD_SANITIZE=ON (`./orchard.sh fuzz`).
#
# A full build of everything under AddressSanitizer takes too long for CI's
# two cores, so this one compiles only what orchard_fuzz_tests needs: the
# readers' layers (core, text, data), what models/lora.cpp (the adapter
# config reader) pulls in (models, ops), and the server the HTTP campaign
# talks to (serve, with infer and runs below it). libtorch itself is not
# instrumented; only Orchard's code is.
# -Wno-maybe-uninitialized: at -O1 GCC 12 reports libtorch's own headers
# (c10::optional<at::Generator>).
set(ORCHARD_SANITIZE_FLAGS -O1 -g1 -fsanitize=address,undefined
    -fno-omit-frame-pointer -Wno-maybe-uninitialized)

file(GLOB_RECURSE ORCHARD_READER_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/src/core/*.cpp
  ${CMAKE_SOURCE_DIR}/src/text/*.cpp
  ${CMAKE_SOURCE_DIR}/src/data/*.cpp
  ${CMAKE_SOURCE_DIR}/src/ops/*.cpp
  ${CMAKE_SOURCE_DIR}/src/models/*.cpp
  ${CMAKE_SOURCE_DIR}/src/runs/*.cpp
  ${CMAKE_SOURCE_DIR}/src/infer/*.cpp
  ${CMAKE_SOURCE_DIR}/src/serve/*.cpp)
add_library(orchard_reader_lib STATIC ${ORCHARD_READER_SOURCES} ${ORCHARD_PRESETS_CPP} ${ORCHARD_WEB_CPP}
  ${ORCHARD_TOKENIZERS_CPP})
target_include_directories(orchard_reader_lib PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_include_directories(orchard_reader_lib PUBLIC ${HTTPLIB_INCLUDE})
if(HTTPLIB_LIBRARY)
  target_link_libraries(orchard_reader_lib PUBLIC ${HTTPLIB_LIBRARY})
  target_compile_options(orchard_reader_lib PUBLIC ${HTTPLIB_CFLAGS_OTHER})
endif()
target_link_libraries(orchard_reader_lib PUBLIC
  ${TORCH_LIBRARIES} yaml-cpp nlohmann_json::nlohmann_json Threads::Threads
  PkgConfig::PCRE2)
target_compile_options(orchard_reader_lib PRIVATE ${ORCHARD_WARNINGS})
target_compile_options(orchard_reader_lib PUBLIC ${ORCHARD_SANITIZE_FLAGS})
target_link_options(orchard_reader_lib PUBLIC -fsanitize=address,undefined)
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/core/version.cpp PROPERTIES
  COMPILE_DEFINITIONS "ORCHARD_VERSION=\"${PROJECT_VERSION}\";ORCHARD_BUILD_TYPE=\"Sanitize\""
  INCLUDE_DIRECTORIES ${CMAKE_BINARY_DIR}/generated)
add_dependencies(orchard_reader_lib orchard_git_commit)
if(ORCHARD_WITH_CUDA)
  target_compile_definitions(orchard_reader_lib PRIVATE ORCHARD_WITH_CUDA)
  target_link_libraries(orchard_reader_lib PUBLIC CUDA::cudart)
endif()
target_precompile_headers(orchard_reader_lib PRIVATE ${CMAKE_SOURCE_DIR}/src/core/pch.h)
orchard_skip_pch_without_torch(${ORCHARD_READER_SOURCES})
set_source_files_properties(${ORCHARD_PRESETS_CPP} ${ORCHARD_WEB_CPP} ${ORCHARD_TOKENIZERS_CPP}
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
orchard_unity(orchard_reader_lib) # as the main build (CMakeLists.txt)
set_source_files_properties(
  ${CMAKE_SOURCE_DIR}/src/core/version.cpp
  ${ORCHARD_PRESETS_CPP} ${ORCHARD_WEB_CPP} ${ORCHARD_TOKENIZERS_CPP}
  PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

enable_testing()
find_package(GTest REQUIRED)
include(GoogleTest)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/generated/test_paths.h CONTENT
"#pragma once
#define ORCHARD_BIN \"orchard-is-not-built-with-ORCHARD_SANITIZE\"
#define ORCHARD_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\"
#define ORCHARD_FIXTURES \"${CMAKE_SOURCE_DIR}/tests/fixtures\"
")
file(GLOB ORCHARD_FUZZ_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*.cpp)
add_executable(orchard_fuzz_tests ${ORCHARD_FUZZ_SOURCES})
target_link_libraries(orchard_fuzz_tests PRIVATE orchard_reader_lib GTest::gtest GTest::gtest_main)
target_compile_options(orchard_fuzz_tests PRIVATE ${ORCHARD_WARNINGS})
target_include_directories(orchard_fuzz_tests PRIVATE
  ${CMAKE_BINARY_DIR}/generated ${CMAKE_SOURCE_DIR}/tests)
target_precompile_headers(orchard_fuzz_tests REUSE_FROM orchard_reader_lib)
orchard_skip_pch_without_torch(${ORCHARD_FUZZ_SOURCES})
orchard_unity(orchard_fuzz_tests)
gtest_discover_tests(orchard_fuzz_tests
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR} DISCOVERY_TIMEOUT 300
  PROPERTIES LABELS fuzz TIMEOUT 1200)
