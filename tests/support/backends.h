// Test support: the backends a parameterized backend test runs over.
#pragma once

#include <string>
#include <vector>

namespace spool::testing {

/// The backend names of the parameterized backend tests (backend_test, capability_test): "cpu",
/// then "cuda" in a build with SPOOL_HAVE_CUDA (those tests skip it, visibly, on a machine without
/// a CUDA device), for ::testing::ValuesIn.
inline std::vector<std::string> backend_names() {
  std::vector<std::string> v = {"cpu"};
#ifdef SPOOL_HAVE_CUDA
  v.push_back("cuda");
#endif
  return v;
}

}  // namespace spool::testing
