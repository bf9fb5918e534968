// GGUF reader: files written by the gguf PyPI package (tests/reference/gguf_fixtures.py:
// metadata of every value type, every block type, alignment 64, a split set), and hand-built
// corrupt headers, each of which must give a spool::Error naming the problem.
#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/gguf_writer.h"
#include "common/error.h"

namespace spool::io {
namespace {

namespace fs = std::filesystem;

std::string gguf_dir() { return std::string(SPOOL_TEST_DATA_DIR) + "/gguf"; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// (The process id in the name: ctest runs tests as parallel processes that share TempDir(), and
// several of them write a "bad.gguf".)
std::string write_tmp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "gguf_test_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Expects open() of `bytes` to throw spool::Error whose message contains `what`.
void expect_error(const std::string& bytes, const std::string& what, const std::string& name = "bad.gguf") {
  const std::string path = write_tmp(name, bytes);
  try {
    GgufFile::open(path);
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "message names no file: " << e.what();
  }
  std::remove(path.c_str());
}

using Bytes = spool::testing::GgufBytes;

struct TInfo {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};

// A file: header, the given raw KV records (already encoded), tensor infos, padding to 32 and
// `data_bytes` bytes of data.
std::string make_file(const std::string& kvs, uint64_t n_kv, const std::vector<TInfo>& ts, size_t data_bytes,
                      uint32_t version = 3) {
  Bytes f;
  f.b = "GGUF";
  f.u32(version).u64(ts.size()).u64(n_kv);
  f.b += kvs;
  for (const TInfo& t : ts) {
    f.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) f.u64(n);
    f.u32(t.type).u64(t.offset);
  }
  f.pad(32);
  f.b.append(data_bytes, '\x01');
  return f.b;
}

std::string arch_kv() { return Bytes().str("general.architecture").u32(8).str("test").b; }

// A valid file (the shared test writer's): one F32 tensor [2 rows x 4 cols] at offset 0 (32 bytes
// of 0x01, as make_file fills its data).
std::string valid_file() {
  spool::testing::GgufWriter w;
  w.add_string("general.architecture", "test");
  w.add_tensor("t", {4, 2}, GgmlType::F32, std::string(32, '\x01').data(), 32);
  return w.bytes();
}

TEST(Gguf, ValidMinimalFile) {
  const std::string path = write_tmp("ok.gguf", valid_file());
  GgufFile f = GgufFile::open(path);
  ASSERT_EQ(f.tensors().size(), 1u);
  const GgufTensor& t = f.tensors()[0];
  EXPECT_EQ(t.name, "t");
  EXPECT_EQ(t.type, GgmlType::F32);
  EXPECT_EQ(t.ne[0], 4);
  EXPECT_EQ(t.ne[1], 2);
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.nbytes, 32u);
  EXPECT_EQ(t.row_bytes(), 16u);
  EXPECT_EQ(t.offset % 32, 0u);
  EXPECT_EQ(f.architecture(), "test");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data(t)), 32), std::string(32, '\x01'));  // all its bytes
  GgufFile h = GgufFile::open(path, /*map=*/false);
  EXPECT_THROW(h.data(h.tensors()[0]), Error);
}

TEST(Gguf, MetadataOfEveryValueType) {
  GgufFile f = GgufFile::open(gguf_dir() + "/blocks.gguf");
  EXPECT_EQ(f.shard(0).version, 3u);
  EXPECT_EQ(f.architecture(), "spool-test");
  EXPECT_EQ(*f.get_int("test.u8"), 200);
  EXPECT_EQ(*f.get_int("test.i8"), -100);
  EXPECT_EQ(*f.get_int("test.u16"), 60000);
  EXPECT_EQ(*f.get_int("test.i16"), -30000);
  EXPECT_EQ(*f.get_int("test.u32"), 4000000000LL);
  EXPECT_EQ(*f.get_int("test.i32"), -2000000000LL);
  EXPECT_EQ(*f.get_float("test.f32"), 0.125);
  EXPECT_EQ(f.find_key("test.bool")->to_bool("test.bool"), true);
  EXPECT_EQ(*f.get_string("test.string"), "h\xc3\xa9llo GGUF");
  EXPECT_EQ(f.find_key("test.u64")->bits, (uint64_t{1} << 63) + 5);
  EXPECT_THROW(f.get_int("test.u64"), Error);  // does not fit in int64
  EXPECT_EQ(*f.get_int("test.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*f.get_float("test.f64"), -2.5e-300);
  EXPECT_EQ(f.find_key("test.arr_i32")->to_ints("test.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.find_key("test.arr_u8")->to_ints("test.arr_u8"), (std::vector<int64_t>{1, 2, 250}));
  EXPECT_EQ(f.find_key("test.arr_f32")->to_floats("test.arr_f32"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(f.find_key("test.arr_str")->to_strings("test.arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.find_key("test.arr_bool")->count, 2u);
  EXPECT_FALSE(f.get_int("test.absent").has_value());
  // Wrong kinds name the key.
  try {
    f.get_int("test.string");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.get_string("test.u8"), Error);
  EXPECT_THROW(f.find_key("test.arr_str")->to_ints("test.arr_str"), Error);
}

TEST(Gguf, TensorTableOfEveryBlockType) {
  GgufFile f = GgufFile::open(gguf_dir() + "/blocks.gguf");
  const char* types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",   "Q5_0",   "Q5_1",
                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"};
  EXPECT_EQ(f.tensors().size(), 2 * std::size(types));
  for (const char* ty : types) {
    const GgufTensor* w = f.find(std::string("w.") + ty);
    ASSERT_NE(w, nullptr) << ty;
    EXPECT_STREQ(ggml_type_name(w->type), ty);
    EXPECT_EQ(w->n_dims, 2u);
    EXPECT_EQ(w->ne[0], 512);  // columns (fastest-varying)
    EXPECT_EQ(w->ne[1], 4);
    EXPECT_EQ(w->nbytes, 4 * ggml_row_bytes(w->type, 512));
    EXPECT_EQ(w->offset % f.shard(0).alignment, 0u);
    const GgufTensor* r = f.find(std::string("ref.") + ty);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->type, GgmlType::F32);
  }
}

TEST(Gguf, Alignment64) {
  GgufFile f = GgufFile::open(gguf_dir() + "/align64.gguf");
  const GgufHeader& h = f.shard(0);
  EXPECT_EQ(h.alignment, 64u);
  EXPECT_EQ(h.data_offset % 64, 0u);
  // gguf-py pads each tensor to the alignment: a (60 bytes) at 0, b (2 x 68 bytes) at 64,
  // c at 64 + 192.
  EXPECT_EQ(f.find("a")->offset - h.data_offset, 0u);
  EXPECT_EQ(f.find("b")->offset - h.data_offset, 64u);
  EXPECT_EQ(f.find("b")->type, GgmlType::Q8_0);
  EXPECT_EQ(f.find("b")->nbytes, 136u);
  EXPECT_EQ(f.find("c")->offset - h.data_offset, 256u);
  EXPECT_EQ(f.find("c")->n_dims, 1u);
  EXPECT_EQ(f.find("c")->ne[0], 7);
}

TEST(Gguf, SplitSetFromAnyShard) {
  for (int given : {1, 2, 3}) {
    GgufFile f = GgufFile::open(gguf_dir() + "/split-0000" + std::to_string(given) + "-of-00003.gguf");
    ASSERT_EQ(f.shard_count(), 3u);
    ASSERT_EQ(f.tensors().size(), 5u);
    EXPECT_EQ(*f.get_string("general.name"), "split test");  // shard 0's metadata
    EXPECT_EQ(*f.get_int("split.count"), 3);
    for (int i = 0; i < 5; ++i) {
      const GgufTensor* t = f.find("t" + std::to_string(i));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->shard, static_cast<uint32_t>(i / 2));
      EXPECT_EQ(t->ne[0], 3 + i);
      EXPECT_EQ(t->ne[1], 2);
      // Values are i + N(0, 1): the mean of the tensor tells it came from the right bytes.
      const float* v = reinterpret_cast<const float*>(f.data(*t));
      double s = 0;
      for (int k = 0; k < t->numel(); ++k) s += v[k];
      EXPECT_NEAR(s / t->numel(), i, 1.5) << t->name;
    }
  }
}

TEST(Gguf, SplitSetErrors) {
  const std::string dir = ::testing::TempDir() + "gguf_split/";
  fs::create_directories(dir);
  for (int i = 1; i <= 3; ++i) fs::remove(dir + "s-0000" + std::to_string(i) + "-of-00003.gguf");
  // Missing shard 3.
  for (int i = 1; i <= 2; ++i)
    fs::copy_file(gguf_dir() + "/split-0000" + std::to_string(i) + "-of-00003.gguf",
                  dir + "s-0000" + std::to_string(i) + "-of-00003.gguf", fs::copy_options::overwrite_existing);
  EXPECT_THROW(GgufFile::open(dir + "s-00001-of-00003.gguf"), Error);
  // Shards in the wrong order: split.no does not match the name.
  fs::copy_file(gguf_dir() + "/split-00002-of-00003.gguf", dir + "s-00003-of-00003.gguf",
                fs::copy_options::overwrite_existing);
  try {
    GgufFile::open(dir + "s-00001-of-00003.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split.no"), std::string::npos) << e.what();
  }
  // A shard renamed so that the name disagrees with split.count.
  fs::copy_file(gguf_dir() + "/split-00001-of-00003.gguf", dir + "r-00001-of-00002.gguf",
                fs::copy_options::overwrite_existing);
  EXPECT_THROW(GgufFile::open(dir + "r-00001-of-00002.gguf"), Error);
  // A shard whose name has no -NNNNN-of-MMMMM part.
  fs::copy_file(gguf_dir() + "/split-00001-of-00003.gguf", dir + "plain.gguf", fs::copy_options::overwrite_existing);
  EXPECT_THROW(GgufFile::open(dir + "plain.gguf"), Error);
  EXPECT_EQ(gguf_split_paths("a/b-00002-of-00003.gguf"),
            (std::vector<std::string>{"a/b-00001-of-00003.gguf", "a/b-00002-of-00003.gguf", "a/b-00003-of-00003.gguf"}));
  EXPECT_TRUE(gguf_split_paths("a/b.gguf").empty());
}

// Headers read elsewhere (as the planner does over HTTP) make the same tensor table as open();
// the split-set checks apply to them; nothing is mapped.
TEST(Gguf, FromHeadersEqualsOpen) {
  std::vector<GgufHeader> hs;
  for (int i = 1; i <= 3; ++i) {
    const std::string bytes = read_file(gguf_dir() + "/split-0000" + std::to_string(i) + "-of-00003.gguf");
    hs.push_back(GgufFile::parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(), "s" + std::to_string(i)));
  }
  const GgufFile opened = GgufFile::open(gguf_dir() + "/split-00002-of-00003.gguf");
  const GgufFile f = GgufFile::from_headers(hs, "remote");
  ASSERT_EQ(f.tensors().size(), opened.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    EXPECT_EQ(f.tensors()[i].name, opened.tensors()[i].name);
    EXPECT_EQ(f.tensors()[i].shard, opened.tensors()[i].shard);
    EXPECT_EQ(f.tensors()[i].offset, opened.tensors()[i].offset);
    EXPECT_EQ(f.tensors()[i].nbytes, opened.tensors()[i].nbytes);
  }
  EXPECT_EQ(f.shard_fd(0), -1);
  EXPECT_THROW(f.data(f.tensors()[0]), Error);
  // A shard missing, or two in the wrong order: the errors of open().
  EXPECT_THROW(GgufFile::from_headers({hs[0], hs[1]}, "remote"), Error);
  try {
    GgufFile::from_headers({hs[0], hs[2], hs[1]}, "remote");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split.no"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufFile::from_headers({}, "remote"), Error);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const std::string ok = valid_file();
  for (size_t n = 0; n < ok.size(); ++n) {
    const std::string path = write_tmp("trunc.gguf", ok.substr(0, n));
    EXPECT_THROW(GgufFile::open(path), Error) << "truncated to " << n;
  }
  // The real file cut inside its header and inside its data.
  const std::string real = read_file(gguf_dir() + "/blocks.gguf");
  ASSERT_GT(real.size(), 3000u);
  for (size_t n : {size_t{7}, size_t{30}, size_t{100}, size_t{600}, size_t{1500}, real.size() - 1}) {
    const std::string path = write_tmp("trunc_real.gguf", real.substr(0, n));
    EXPECT_THROW(GgufFile::open(path), Error) << "truncated to " << n;
  }
  expect_error(ok.substr(0, ok.size() - 8), "past the end");  // header complete, data cut
}

TEST(Gguf, CorruptHeaders) {
  std::string f = valid_file();
  f[3] = 'X';
  expect_error(f, "not a GGUF file");
  expect_error(make_file(arch_kv(), 1, {{"t", {4, 2}, 0, 0}}, 32, 1), "version 1");
  expect_error(make_file(arch_kv(), 1, {{"t", {4, 2}, 0, 0}}, 32, 4), "version 4");
  expect_error(make_file(arch_kv(), 1, {{"t", {4, 2}, 0, 0}}, 32, 0x03000000), "big-endian");
  // Counts the file cannot hold.
  f = valid_file();
  for (int i = 0; i < 8; ++i) f[8 + i] = static_cast<char>(i == 7 ? 0x40 : 0);  // tensor count 2^62
  expect_error(f, "tensor count");
  f = valid_file();
  for (int i = 0; i < 8; ++i) f[16 + i] = static_cast<char>(0xFF);  // KV count 2^64 - 1
  expect_error(f, "metadata count");
  // Tensor data past the end of the file, misaligned, overlapping.
  expect_error(make_file(arch_kv(), 1, {{"t", {4, 2}, 0, 32}}, 32), "past the end");
  expect_error(make_file(arch_kv(), 1, {{"t", {4, 2}, 0, 4}}, 64), "not a multiple of the alignment");
  expect_error(make_file(arch_kv(), 1, {{"a", {8}, 0, 0}, {"b", {8}, 0, 0}}, 64), "overlap");
  expect_error(make_file(arch_kv(), 1, {{"a", {16}, 0, 0}, {"b", {8}, 0, 32}}, 64), "overlap");
  // Duplicate names and keys.
  expect_error(make_file(arch_kv(), 1, {{"t", {8}, 0, 0}, {"t", {8}, 0, 32}}, 64), "duplicate tensor name 't'");
  expect_error(make_file(arch_kv() + arch_kv(), 2, {}, 0), "duplicate metadata key 'general.architecture'");
  // Types.
  expect_error(make_file(arch_kv(), 1, {{"blk.0.w", {32, 2}, 99, 0}}, 64), "tensor 'blk.0.w': unknown ggml type id 99");
  expect_error(make_file(arch_kv(), 1, {{"blk.0.w", {32, 2}, 4, 0}}, 64), "retired ggml type id 4");
  expect_error(make_file(arch_kv(), 1, {{"q", {16, 2}, 2, 0}}, 64), "not a multiple of the Q4_0 block size 32");
  // Dimensions.
  expect_error(make_file(arch_kv(), 1, {{"t", {1, 1, 1, 1, 1}, 0, 0}}, 32), "5 dimensions");
  expect_error(make_file(arch_kv(), 1, {{"t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0}}, 32), "overflows");
  expect_error(make_file(arch_kv(), 1, {{"t", {~uint64_t{0}}, 0, 0}}, 32), "negative");
  expect_error(make_file(arch_kv(), 1, {{"t", {uint64_t{1} << 40}, 0, 0}}, 32), "more than the");
  expect_error(make_file(arch_kv(), 1, {{std::string(64, 'n'), {8}, 0, 0}}, 32), "64 bytes long");
  // Metadata values.
  expect_error(make_file(Bytes().str("k").u32(13).u32(0).b, 1, {}, 0), "key 'k': unknown value type 13");
  expect_error(make_file(Bytes().str("k").u32(9).u32(9).u64(1).b, 1, {}, 0), "nested arrays");
  expect_error(make_file(Bytes().str("k").u32(9).u32(5).u64(uint64_t{1} << 40).b, 1, {}, 0), "does not fit");
  expect_error(make_file(Bytes().str("k").u32(9).u32(8).u64(1000).str("x").b, 1, {}, 0), "does not fit");
  expect_error(make_file(Bytes().str("k").u32(7).u8(2).b, 1, {}, 0), "bool value is 2");
  expect_error(make_file(Bytes().str("k").u32(8).u64(uint64_t{1} << 50).b, 1, {}, 0), "is 1125899906842624 bytes long");
  expect_error(make_file(Bytes().str("k").u32(8).u64(500).b, 1, {}, 0), "truncated");
  expect_error(make_file(Bytes().str("general.alignment").u32(4).u32(48).b, 1, {}, 0), "not a power of two");
  expect_error(make_file(Bytes().str("general.alignment").u32(4).u32(0).b, 1, {}, 0), "not a power of two");
  expect_error(make_file(Bytes().str("general.alignment").u32(10).u64(64).b, 1, {}, 0), "expected UINT32");
}

TEST(Gguf, CustomAlignmentInHandBuiltFile) {
  // alignment 16: a tensor at offset 16 is fine, at 8 it is not.
  const std::string kv = Bytes().str("general.alignment").u32(4).u32(16).b;
  const std::string path = write_tmp("a16.gguf", make_file(kv, 1, {{"t", {2}, 0, 16}}, 32));
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.shard(0).alignment, 16u);
  EXPECT_EQ(f.shard(0).data_offset % 16, 0u);
  expect_error(make_file(kv, 1, {{"t", {2}, 0, 8}}, 32), "not a multiple of the alignment 16");
}

TEST(Gguf, ParseHeaderAsksForMoreBytes) {
  const std::string real = read_file(gguf_dir() + "/blocks.gguf");
  const auto* p = reinterpret_cast<const uint8_t*>(real.data());
  try {
    GgufFile::parse_header(p, 64, real.size(), "remote");
    ADD_FAILURE();
  } catch (const GgufNeedMore& e) {
    EXPECT_GT(e.needed(), 64u);
    EXPECT_LE(e.needed(), real.size());
  }
  const GgufHeader h = GgufFile::parse_header(p, real.size(), real.size(), "remote");
  EXPECT_EQ(h.tensors.size(), 32u);
}

}  // namespace
}  // namespace spool::io
