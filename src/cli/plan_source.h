// Where the planner reads a checkpoint from: a local directory (headers read from disk, no
// weights mapped) or an HTTP(S) base URL (Hugging Face ".../resolve/main/" style): config
// files and each shard's safetensors header fetched with Range requests. A .gguf path or URL:
// the GGUF header of each shard (metadata, tensor table), nothing else.
//
// Remote header reads: the first 16 KiB of a shard are asked for; if the header is longer,
// the rest of it in a second range. A server that ignores Range and answers 200 with the
// whole file is read only up to the end of the header, then the transfer is aborted (the
// bounded fallback): no more bytes are kept than with Range support.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.h"
#include "plan/footprint.h"  // gguf_tokenizer_json_bytes

namespace spool::plan {

/// A checkpoint opened for planning, and how it was read.
struct ModelSource {
  io::Checkpoint ckpt;                // header-only
  std::string location;               // the directory or the normalised base URL
  bool remote = false;
  std::string suggested_dir;          // --model for the printed command (the dir, or ./<repo name>)
  uint64_t tokenizer_json_bytes = 0;  // size of tokenizer.json; 0 when absent
  uint64_t bytes_fetched = 0;         // body bytes received over the network
  int requests = 0;                   // HTTP requests made
};

/// True for "http://..." and "https://...".
bool is_url(const std::string& s);

/// A base URL ending in '/': "https://huggingface.co/ORG/NAME" (no /resolve/) becomes
/// ".../ORG/NAME/resolve/main/"; others only get the trailing slash.
std::string normalize_base_url(const std::string& url);

/// Opens `dir_or_url`: a directory or base URL (safetensors), or a .gguf file or URL (one file
/// or any shard of a split set; GGUF headers, fetched with Range requests from a URL). Throws spool::Error naming the file or URL: missing config.json or
/// weights (HTTP 404), other HTTP errors, a truncated or malformed safetensors header, a
/// header larger than 100 MB, shard names that are not plain file names.
/// `gguf_first_range`: bytes asked for first of each remote GGUF (more follow while the header
/// continues; tests make it small to exercise that).
ModelSource open_source(const std::string& dir_or_url, uint64_t gguf_first_range = 1 << 20, bool mtp = false);

}  // namespace spool::plan
