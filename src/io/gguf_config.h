// The Hugging Face config.json a GGUF file's metadata stands for, per llama.cpp architecture
// (the GGUF notes (ggml docs/gguf.md) section 2.3; llama.cpp's convert_hf_to_gguf.py for the
// keys each architecture writes). The family's config reader (src/models/<family>.cpp) then
// reads it as it reads a safetensors checkpoint's config.json.
#pragma once

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/gguf_names.h"

namespace spool::io {

/// The config.json fields the family of `a` reads, from `g`'s `{arch}.*` metadata, tokenizer
/// ids and tensor list (vocab_size from token_embd, tied embeddings from a missing output.weight,
/// dense layers from missing routers, expert width from the ffn_*_exps shape when the key is
/// absent, attention biases / q-k norms from their tensors). Throws spool::Error naming the file
/// and key for a missing or inconsistent key, a rope scaling spool does not run, or a file of the
/// architecture that spool's family cannot represent (a dense "llama" file, a non-sigmoid
/// glm4moe / minimax-m2 router).
nlohmann::json gguf_config_json(const GgufFile& g, const GgufArch& a);

}  // namespace spool::io
