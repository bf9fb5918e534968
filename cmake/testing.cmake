# main() of every test binary: gtest's, except that with SPOOL_NO_SKIP=1 (set by .ci/run) a
# skipped test fails the run (tests/support/gtest_main.cpp).
add_library(spool_gtest_main STATIC ${CMAKE_SOURCE_DIR}/tests/support/gtest_main.cpp)
target_link_libraries(spool_gtest_main PUBLIC GTest::gtest)
# Every test binary links spool_gtest_main, so this puts tests/ on their include path: the shared
# test helpers are included as "support/<file>.h".
target_include_directories(spool_gtest_main PUBLIC ${CMAKE_SOURCE_DIR}/tests)

# spool_add_test(NAME SOURCES a.cpp b.cpp LIBS lib1 lib2 [LABELS l1 l2])
# Builds a GoogleTest binary and registers its tests with CTest. Tests find their data
# through the SPOOL_TEST_DATA_DIR / SPOOL_DEFAULT_MODEL_DIR compile definitions.
function(spool_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest spool_gtest_main)
  # GCC 12 reports false -Wrestrict warnings inside std::string operator+ (GCC bug 105329).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${name} PRIVATE -Wno-restrict)
  endif()
  target_compile_definitions(${name} PRIVATE
    SPOOL_TEST_DATA_DIR="${SPOOL_TEST_DATA_DIR}"
    SPOOL_DEFAULT_MODEL_DIR="${SPOOL_DEFAULT_MODEL_DIR}"
    SPOOL_BINARY_DIR="${CMAKE_BINARY_DIR}")
  add_dependencies(${name} spool_test_data spool_model_data)
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  # A list property must reach the generated set_tests_properties() call as one argument:
  # it passes through two rounds of CMake escaping (checked with CMake 3.25: ctest -L sanitize).
  string(REPLACE ";" "\\\\\\\\\\\\\\\\;" labels_arg "${T_LABELS}")
  # Scratch files go under the build tree (gtest's TempDir() reads TEST_TMPDIR), so two builds
  # or two users never share them and deleting the build removes them.
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-tmp)
  gtest_discover_tests(${name} PROPERTIES LABELS "${labels_arg}" ENVIRONMENT "TEST_TMPDIR=${CMAKE_BINARY_DIR}/test-tmp/"
                       DISCOVERY_TIMEOUT 60)
endfunction()
