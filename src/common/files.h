// Whole-file helpers.
#pragma once

#include <string>

namespace spool {

/// Writes `content` to `path` atomically: to `path`.tmp, fsync, then rename over `path`, so a
/// reader never sees a partial file and a failure never destroys the previous one. Throws
/// spool::Error naming the file.
void write_file_atomic(const std::string& path, const std::string& content);

/// Reads a whole file; throws spool::Error naming it.
std::string read_whole_file(const std::string& path);

}  // namespace spool
