// main() of every GoogleTest binary (instead of gtest_main): runs the tests, and with
// SPOOL_NO_SKIP=1 in the environment (.ci/run sets it) a skipped test makes the run fail, so
// that in CI a test either runs or fails and a GTEST_SKIP() never counts as a pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const char* no_skip = std::getenv("SPOOL_NO_SKIP");
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && no_skip != nullptr && std::strcmp(no_skip, "1") == 0 && u.skipped_test_count() > 0) {
    std::fprintf(stderr, "SPOOL_NO_SKIP=1: %d test(s) skipped; in CI a test runs or fails\n", u.skipped_test_count());
    return 1;
  }
  return rc;
}
