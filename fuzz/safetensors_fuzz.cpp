// libFuzzer target for the safetensors header parser: arbitrary bytes as a whole file
// (u64 header length + JSON header + data). Errors must be spool::Error, never a crash or
// an out-of-bounds read; a file that opens must have every tensor inside the file.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/spool_st_fuzz_" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    spool::io::SafetensorsFile st = spool::io::SafetensorsFile::open(path);
    uint64_t sum = 0;
    for (const auto& t : st.tensors()) {
      if (t.offset + t.nbytes > st.file_size()) std::abort();
      if (t.nbytes > 0) sum += st.data(t)[0] + st.data(t)[t.nbytes - 1];  // touch first and last byte
    }
    (void)sum;
  } catch (const spool::Error&) {
  }
  return 0;
}
