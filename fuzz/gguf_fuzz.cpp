// libFuzzer target for the GGUF reader: arbitrary bytes as a whole file (header, metadata,
// tensor infos, data). Errors must be spool::Error, never a crash or an out-of-bounds read; a
// file that opens must have every tensor inside its file, and parse_header on any prefix must
// either parse the same header, ask for more bytes, or throw spool::Error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/spool_gguf_fuzz_" + std::to_string(getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    spool::io::GgufFile g = spool::io::GgufFile::open(path);
    uint64_t sum = 0;
    for (const auto& t : g.tensors()) {
      const auto& h = g.shard(t.shard);
      if (t.offset < h.data_offset || t.offset + t.nbytes > h.file_size) std::abort();
      if (t.nbytes > 0) sum += g.data(t)[0] + g.data(t)[t.nbytes - 1];  // touch first and last byte
    }
    for (const auto& [k, v] : g.metadata()) sum += v.count + v.str.size();
    (void)sum;
  } catch (const spool::Error&) {
  }
  // A prefix of the bytes as a remote header.
  try {
    (void)spool::io::GgufFile::parse_header(data, size / 2, size, "fuzz");
  } catch (const spool::Error&) {
  }
  return 0;
}
