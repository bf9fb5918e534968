// Which of the backend's optional ops a model calls, from its ModelSpec alone: the loader's
// "host fallback" line (engine/loader.cpp) intersects it with Backend::host_fallback_ops().
#pragma once

#include <string>
#include <vector>

#include "models/spec.h"

namespace spool::models {

/// The ops of ops::generic_host_fallback_ops() (the ones only some models call, which a device
/// backend may leave on the host) that a model of `spec` calls in its forward pass, in that list's
/// order: route_grouped_top_k (a grouped router on MoE layers: the DeepSeek family, GLM, MiniMax),
/// attention_window (windowed attention layers without sinks: Mixtral-style sliding_window, once a
/// sequence passes the window), attention_sinks (gpt-oss attention sinks, windowed or not) and
/// mla_attention (MLA layers). backend_test checks it against the calls of every fixture family.
std::vector<std::string> optional_ops_used(const ModelSpec& spec);

}  // namespace spool::models
