// Header validation of safetensors files: every malformed header is a clear spool::Error.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/error.h"

namespace spool::io {
namespace {

std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "/st_" + std::to_string(getpid()) + "_" + name; }

// Writes a file: u64 header length, header text, then `data_len` zero bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_len, int64_t len_override = -1) {
  std::string p = tmp_path(name);
  std::ofstream f(p, std::ios::binary);
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header;
  f << std::string(data_len, '\0');
  return p;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTrip) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  uint16_t b[2] = {0x3f80, 0x4000};
  std::string p = tmp_path("ok.safetensors");
  write_safetensors(p, {{"a", DType::F32, {2, 3}, a}, {"b", DType::BF16, {2}, b}}, {{"format", "pt"}});
  SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->nbytes, 24u);
  EXPECT_EQ(reinterpret_cast<const float*>(f.data(*ta))[5], 6.0f);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, Truncated) {
  std::string p = write_raw("short", "", 0, 0);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "abc";
  EXPECT_NE(error_of(p).find("too short"), std::string::npos) << error_of(p);
}

TEST(Safetensors, HeaderLengthPastEof) {
  std::string p = write_raw("hlen", "{}", 0, 1000);
  EXPECT_NE(error_of(p).find("past the end"), std::string::npos) << error_of(p);
}

TEST(Safetensors, MalformedJson) {
  std::string p = write_raw("json", "{\"a\": [", 0);
  EXPECT_NE(error_of(p).find("not valid JSON"), std::string::npos) << error_of(p);
}

TEST(Safetensors, OffsetsPastEof) {
  std::string p = write_raw("off", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(error_of(p).find("past the end"), std::string::npos) << error_of(p);
}

TEST(Safetensors, SizeMismatch) {
  std::string p = write_raw("size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(error_of(p).find("does not match"), std::string::npos) << error_of(p);
}

TEST(Safetensors, Overlap) {
  std::string p = write_raw("ovl",
                            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                            24);
  EXPECT_NE(error_of(p).find("overlap"), std::string::npos) << error_of(p);
}

TEST(Safetensors, DuplicateName) {
  // Entries are validated one by one as they are parsed: a name given twice is an error (the
  // JSON tree used to keep the last one silently).
  std::string p = write_raw("dup",
                            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  EXPECT_NE(error_of(p).find("'a' appears twice"), std::string::npos) << error_of(p);
}

TEST(Safetensors, EntryNotAnObjectAfterOthers) {
  std::string p = write_raw("notobj", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":5,"c":[1]})", 4);
  EXPECT_NE(error_of(p).find("tensor 'b': entry is not an object"), std::string::npos) << error_of(p);
  p = write_raw("meta", R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata().at("k"), "v");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_NE(f.find("a"), nullptr);
  f.drop_tensor_table();
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.find("a"), nullptr);
  EXPECT_EQ(f.metadata().at("k"), "v");
}

TEST(Safetensors, UnknownDtype) {
  std::string p = write_raw("dt", R"({"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(error_of(p).find("unknown dtype"), std::string::npos) << error_of(p);
}

TEST(Safetensors, BadShapeAndOffsets) {
  EXPECT_NE(error_of(write_raw("neg", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("non-negative"),
            std::string::npos);
  EXPECT_NE(error_of(write_raw("rev", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)).find("begin"),
            std::string::npos);
  EXPECT_NE(error_of(write_raw("huge", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", 4)),
            "");
  EXPECT_NE(error_of(write_raw("notobj", R"([1,2])", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(tmp_path("does-not-exist")).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace spool::io
