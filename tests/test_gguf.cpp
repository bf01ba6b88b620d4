// GGUF reader and writer: round trips, the exact byte layout, getters, and a
// corpus of truncated and corrupted files that must each be a tandem::Error
// (never a crash or an out-of-bounds read: run under ASan to see the latter).

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem::gguf {
namespace {

// ---------------------------------------------------------------------------
// Helpers

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

testing::AssertionResult same_value(const Value& a, const Value& b, const std::string& where) {
  auto fail = [&](const std::string& what) {
    return testing::AssertionFailure() << where << ": " << what;
  };
  if (a.type != b.type) {
    return fail("type " + value_type_name(a.type) + " vs " + value_type_name(b.type));
  }
  if (a.is_integer() || a.type == ValueType::BOOL) {
    if (a.u64 != b.u64 || a.i64 != b.i64) {
      return fail("integer " + std::to_string(a.i64) + " vs " + std::to_string(b.i64));
    }
  } else if (a.is_float()) {
    if (double_bits(a.f64) != double_bits(b.f64)) {
      return fail("float " + std::to_string(a.f64) + " vs " + std::to_string(b.f64));
    }
  } else if (a.type == ValueType::STRING) {
    if (a.str != b.str) return fail("string '" + a.str + "' vs '" + b.str + "'");
  } else if (a.type == ValueType::ARRAY) {
    if (a.elem_type != b.elem_type) return fail("array element type differs");
    if (a.items.size() != b.items.size()) return fail("array size differs");
    for (size_t i = 0; i < a.items.size(); ++i) {
      auto r = same_value(a.items[i], b.items[i], where + "[" + std::to_string(i) + "]");
      if (!r) return r;
    }
  }
  return testing::AssertionSuccess();
}

// Runs `f`, which must throw tandem::Error; returns the message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a tandem::Error";
  return "";
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  return error_of([&] { File::parse(bytes, "bad.gguf"); });
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Invariants every successfully parsed file must satisfy, whatever its bytes.
// Reading every tensor byte lets ASan catch a view that escapes the buffer.
void check_parsed_invariants(const File& f) {
  ASSERT_TRUE(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  ASSERT_LE(f.data_offset(), f.file_size());
  std::set<std::string> names;
  unsigned sum = 0;
  for (const TensorInfo& t : f.tensors()) {
    ASSERT_TRUE(names.insert(t.name).second) << t.name;
    ASSERT_TRUE(type_is_known(t.type));
    ASSERT_GE(t.dims.size(), 1u);
    ASSERT_LE(t.dims.size(), 4u);
    uint64_t expect = row_bytes(t.type, t.dims[0]);
    for (size_t d = 1; d < t.dims.size(); ++d) expect *= t.dims[d];
    ASSERT_EQ(t.n_bytes, expect);
    ASSERT_GT(t.n_bytes, 0u);
    ASSERT_EQ(t.offset % f.alignment(), 0u);
    ASSERT_LE(t.offset, f.file_size() - f.data_offset());
    ASSERT_LE(t.n_bytes, f.file_size() - f.data_offset() - t.offset);
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  }
  (void)sum;
}

// Parses `bytes`; success must satisfy the invariants, failure must be an Error.
// Returns whether it parsed.
bool parse_or_error(const std::vector<uint8_t>& bytes) {
  try {
    File f = File::parse(bytes, "fuzz.gguf");
    check_parsed_invariants(f);
    return true;
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "fuzz.gguf")) << e.what();
    EXPECT_TRUE(contains(e.what(), "byte offset")) << e.what();
    return false;
  }
}

class TempFile {
 public:
  TempFile() {
    static int counter = 0;
    path_ = testing::TempDir() + "tandem_gguf_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++) + ".gguf";
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An independent serializer for hand-built files. It records where each field
// lands so that the corpus can corrupt exactly that field.
enum class Kind {
  kVersion,
  kTensorCount,
  kKvCount,
  kKeyLength,
  kValueType,
  kStringLength,
  kElemType,
  kArrayCount,
  kNameLength,
  kNDims,
  kDim,
  kTensorType,
  kOffset,
};

struct Field {
  Kind kind;
  size_t at;
  int width;  // 4 or 8
};

struct Builder {
  std::vector<uint8_t> b;
  std::vector<Field> fields;

  void raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void u32(uint32_t v, Kind k) {
    fields.push_back({k, b.size(), 4});
    u32(v);
  }
  void u64(uint64_t v, Kind k) {
    fields.push_back({k, b.size(), 8});
    u64(v);
  }
  void str(const std::string& s, Kind k = Kind::kStringLength) {
    u64(s.size(), k);
    raw(s.data(), s.size());
  }
  void header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    raw("GGUF", 4);
    u32(version, Kind::kVersion);
    u64(n_tensors, Kind::kTensorCount);
    u64(n_kv, Kind::kKvCount);
  }
  void key(const std::string& k, ValueType t) {
    str(k, Kind::kKeyLength);
    u32(static_cast<uint32_t>(t), Kind::kValueType);
  }
  void array_header(ValueType elem, uint64_t count) {
    u32(static_cast<uint32_t>(elem), Kind::kElemType);
    u64(count, Kind::kArrayCount);
  }
  void tensor_info(const std::string& name, std::vector<uint64_t> dims, TensorType t,
                   uint64_t offset) {
    str(name, Kind::kNameLength);
    u32(static_cast<uint32_t>(dims.size()), Kind::kNDims);
    for (uint64_t d : dims) u64(d, Kind::kDim);
    u32(static_cast<uint32_t>(t), Kind::kTensorType);
    u64(offset, Kind::kOffset);
  }
  void pad(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
  }
  size_t size() const { return b.size(); }
};

// ---------------------------------------------------------------------------
// Type table

TEST(GgufTypes, BlockGeometryMatchesGgml) {
  struct Row {
    TensorType type;
    const char* name;
    uint64_t elements, bytes;
  };
  const Row rows[] = {
      {TensorType::F32, "f32", 1, 4},
      {TensorType::F16, "f16", 1, 2},
      {TensorType::Q4_0, "q4_0", 32, 18},
      {TensorType::Q4_1, "q4_1", 32, 20},
      {TensorType::Q5_0, "q5_0", 32, 22},
      {TensorType::Q5_1, "q5_1", 32, 24},
      {TensorType::Q8_0, "q8_0", 32, 34},
      {TensorType::Q8_1, "q8_1", 32, 36},
      {TensorType::Q2_K, "q2_K", 256, 84},
      {TensorType::Q3_K, "q3_K", 256, 110},
      {TensorType::Q4_K, "q4_K", 256, 144},
      {TensorType::Q5_K, "q5_K", 256, 176},
      {TensorType::Q6_K, "q6_K", 256, 210},
      {TensorType::Q8_K, "q8_K", 256, 292},
      {TensorType::IQ2_XXS, "iq2_xxs", 256, 66},
      {TensorType::IQ2_XS, "iq2_xs", 256, 74},
      {TensorType::IQ3_XXS, "iq3_xxs", 256, 98},
      {TensorType::IQ1_S, "iq1_s", 256, 50},
      {TensorType::IQ4_NL, "iq4_nl", 32, 18},
      {TensorType::IQ3_S, "iq3_s", 256, 110},
      {TensorType::IQ2_S, "iq2_s", 256, 82},
      {TensorType::IQ4_XS, "iq4_xs", 256, 136},
      {TensorType::I8, "i8", 1, 1},
      {TensorType::I16, "i16", 1, 2},
      {TensorType::I32, "i32", 1, 4},
      {TensorType::I64, "i64", 1, 8},
      {TensorType::F64, "f64", 1, 8},
      {TensorType::IQ1_M, "iq1_m", 256, 56},
      {TensorType::BF16, "bf16", 1, 2},
      {TensorType::TQ1_0, "tq1_0", 256, 54},
      {TensorType::TQ2_0, "tq2_0", 256, 66},
      {TensorType::MXFP4, "mxfp4", 32, 17},
  };
  for (const Row& r : rows) {
    EXPECT_TRUE(type_is_known(r.type)) << r.name;
    EXPECT_EQ(type_name(r.type), r.name);
    EXPECT_EQ(type_block_elements(r.type), r.elements) << r.name;
    EXPECT_EQ(type_block_bytes(r.type), r.bytes) << r.name;
  }
  // Ids ggml removed or never had are unknown.
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 43u, 0xffffffffu}) {
    const auto t = static_cast<TensorType>(id);
    EXPECT_FALSE(type_is_known(t)) << id;
    EXPECT_EQ(type_block_elements(t), 0u);
    EXPECT_EQ(type_block_bytes(t), 0u);
    EXPECT_EQ(row_bytes(t, 32), 0u);
    EXPECT_EQ(type_name(t), "type" + std::to_string(id));
  }
}

TEST(GgufTypes, RowBytes) {
  EXPECT_EQ(row_bytes(TensorType::F32, 10), 40u);
  EXPECT_EQ(row_bytes(TensorType::BF16, 3), 6u);
  EXPECT_EQ(row_bytes(TensorType::Q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(TensorType::Q8_0, 33), 0u);
  EXPECT_EQ(row_bytes(TensorType::Q4_K, 512), 288u);
  EXPECT_EQ(row_bytes(TensorType::Q4_K, 128), 0u);
  EXPECT_EQ(row_bytes(TensorType::F32, 1ull << 62), 0u);  // overflows 64 bits
}

TEST(GgufTypes, ValueHelpers) {
  EXPECT_EQ(Value::make_i8(-1).u64, ~0ull);
  EXPECT_EQ(Value::make_i8(-1).i64, -1);
  EXPECT_EQ(Value::make_u64(~0ull).i64, -1);
  EXPECT_EQ(Value::make_bool(true).u64, 1u);
  EXPECT_TRUE(Value::make_u16(1).is_integer());
  EXPECT_FALSE(Value::make_u16(1).is_float());
  EXPECT_TRUE(Value::make_f64(1).is_float());
  EXPECT_FALSE(Value::make_bool(true).is_integer());
  EXPECT_FALSE(Value::make_string("x").is_integer());
  EXPECT_EQ(value_type_name(ValueType::STRING), "string");
  EXPECT_EQ(value_type_name(static_cast<ValueType>(99)), "type99");
  const std::string msg = error_of([] {
    Value::make_array(ValueType::INT32, {Value::make_i32(1), Value::make_u32(2)});
  });
  EXPECT_TRUE(contains(msg, "item 1")) << msg;
}

TEST(GgufTypes, TensorInfoShape) {
  TensorInfo t;
  t.dims = {4096, 32000};
  EXPECT_EQ(t.n_elements(), 4096u * 32000u);
  EXPECT_EQ(t.shape_string(), "[4096, 32000]");
}

// ---------------------------------------------------------------------------
// Round trips

std::vector<KeyValue> every_value_type() {
  std::vector<KeyValue> kv;
  auto add = [&](const std::string& k, Value v) { kv.push_back({k, std::move(v)}); };
  add("v.u8", Value::make_u8(250));
  add("v.i8", Value::make_i8(-128));
  add("v.u16", Value::make_u16(65535));
  add("v.i16", Value::make_i16(-32768));
  add("v.u32", Value::make_u32(4000000000u));
  add("v.i32", Value::make_i32(std::numeric_limits<int32_t>::min()));
  add("v.f32", Value::make_f32(-1.5e-7f));
  add("v.f32.inf", Value::make_f32(std::numeric_limits<float>::infinity()));
  add("v.f32.nan", Value::make_f32(std::numeric_limits<float>::quiet_NaN()));
  add("v.bool.t", Value::make_bool(true));
  add("v.bool.f", Value::make_bool(false));
  add("v.string", Value::make_string("hello \xe2\x96\x81world"));
  add("v.string.empty", Value::make_string(""));
  add("v.string.nul", Value::make_string(std::string("a\0b", 3)));
  add("v.u64", Value::make_u64(std::numeric_limits<uint64_t>::max()));
  add("v.i64", Value::make_i64(std::numeric_limits<int64_t>::min()));
  add("v.f64", Value::make_f64(-0.0));
  add("v.f64.pi", Value::make_f64(3.141592653589793));
  add("a.u8", Value::make_array(ValueType::UINT8, {Value::make_u8(0), Value::make_u8(255)}));
  add("a.i8", Value::make_array(ValueType::INT8, {Value::make_i8(-5), Value::make_i8(127)}));
  add("a.u16", Value::make_array(ValueType::UINT16, {Value::make_u16(7)}));
  add("a.i16", Value::make_array(ValueType::INT16, {Value::make_i16(-7), Value::make_i16(8)}));
  add("a.u32", Value::make_array(ValueType::UINT32, {Value::make_u32(1), Value::make_u32(2)}));
  add("a.i32", Value::make_i32_array({-1, 0, 1, std::numeric_limits<int32_t>::max()}));
  add("a.f32", Value::make_f32_array({0.5f, -2.25f, 1e30f}));
  add("a.bool",
      Value::make_array(ValueType::BOOL, {Value::make_bool(true), Value::make_bool(false)}));
  add("a.string", Value::make_string_array({"<s>", "", "\xe2\x96\x81the", "a b"}));
  add("a.u64", Value::make_array(ValueType::UINT64, {Value::make_u64(1ull << 63)}));
  add("a.i64", Value::make_array(ValueType::INT64, {Value::make_i64(-1), Value::make_i64(2)}));
  add("a.f64", Value::make_array(ValueType::FLOAT64, {Value::make_f64(1e300)}));
  add("a.empty", Value::make_array(ValueType::FLOAT32, {}));
  add("a.nested", Value::make_array(ValueType::ARRAY,
                                    {Value::make_i32_array({1, 2, 3}), Value::make_i32_array({}),
                                     Value::make_array(ValueType::INT32, {Value::make_i32(-4)})}));
  // Arrays of arrays of different element types, and deeper nesting.
  add("a.mixed", Value::make_array(ValueType::ARRAY, {Value::make_string_array({"x"}),
                                                      Value::make_f32_array({1.0f})}));
  add("a.deep",
      Value::make_array(ValueType::ARRAY,
                        {Value::make_array(ValueType::ARRAY, {Value::make_string_array({"d"})})}));
  return kv;
}

TEST(GgufRoundTrip, EveryValueTypeIsIdentity) {
  const std::vector<KeyValue> kv = every_value_type();
  Writer w;
  for (const KeyValue& e : kv) w.set(e.key, e.value);
  const File f = File::parse(w.to_bytes());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].key, kv[i].key);
    EXPECT_TRUE(same_value(f.metadata()[i].value, kv[i].value, kv[i].key));
  }
  // No alignment key is written for the default alignment.
  EXPECT_EQ(f.find("general.alignment"), nullptr);
}

struct TensorSpec {
  std::string name;
  TensorType type;
  std::vector<uint64_t> dims;
  std::vector<uint8_t> data;
};

std::vector<TensorSpec> sample_tensors() {
  std::vector<TensorSpec> out = {
      {"f32.1d", TensorType::F32, {7}, {}},
      {"f16.2d", TensorType::F16, {8, 3}, {}},
      {"bf16.3d", TensorType::BF16, {4, 3, 2}, {}},
      {"q8_0.4d", TensorType::Q8_0, {64, 2, 3, 2}, {}},
      {"q8_0.1d", TensorType::Q8_0, {32}, {}},
  };
  uint32_t seed = 1;
  for (TensorSpec& t : out) {
    uint64_t n = row_bytes(t.type, t.dims[0]);
    for (size_t d = 1; d < t.dims.size(); ++d) n *= t.dims[d];
    t.data = pattern_bytes(n, seed++);
  }
  return out;
}

Writer sample_writer(uint64_t alignment) {
  Writer w(alignment);
  w.set("general.architecture", Value::make_string("llama"));
  w.set("llama.block_count", Value::make_u32(2));
  for (const TensorSpec& t : sample_tensors()) w.add_tensor(t.name, t.type, t.dims, t.data);
  return w;
}

void expect_sample_tensors(const File& f) {
  const std::vector<TensorSpec> specs = sample_tensors();
  ASSERT_EQ(f.tensors().size(), specs.size());
  EXPECT_EQ(f.data_offset() % f.alignment(), 0u);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.type, specs[i].type);
    EXPECT_EQ(t.dims, specs[i].dims);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    ASSERT_EQ(t.n_bytes, specs[i].data.size());
    EXPECT_EQ(std::memcmp(t.data, specs[i].data.data(), t.n_bytes), 0) << t.name;
    EXPECT_EQ(&f.tensor(t.name), &t);
  }
}

TEST(GgufRoundTrip, TensorsWithDefaultAlignment) {
  const File f = File::parse(sample_writer(32).to_bytes());
  EXPECT_EQ(f.alignment(), 32u);
  expect_sample_tensors(f);
  EXPECT_EQ(f.find("general.alignment"), nullptr);
}

TEST(GgufRoundTrip, TensorsWithAlignment64) {
  const std::vector<uint8_t> bytes = sample_writer(64).to_bytes();
  const File f = File::parse(bytes);
  EXPECT_EQ(f.alignment(), 64u);
  expect_sample_tensors(f);
  const Value* a = f.find("general.alignment");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, ValueType::UINT32);
  EXPECT_EQ(a->u64, 64u);
  // The writer pads the last tensor too, as llama.cpp expects.
  EXPECT_EQ(bytes.size() % 64, 0u);
}

TEST(GgufRoundTrip, AlignmentSetThroughKey) {
  Writer w;
  w.set("general.alignment", Value::make_u32(128));
  w.add_tensor("t", TensorType::F32, {3}, pattern_bytes(12, 9));
  w.add_tensor("u", TensorType::F32, {3}, pattern_bytes(12, 10));
  const File f = File::parse(w.to_bytes());
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.data_offset() % 128, 0u);
  EXPECT_EQ(f.tensor("u").offset, 128u);
}

TEST(GgufRoundTrip, SameInputsGiveSameBytes) {
  EXPECT_EQ(sample_writer(32).to_bytes(), sample_writer(32).to_bytes());
  EXPECT_EQ(sample_writer(64).to_bytes(), sample_writer(64).to_bytes());
  EXPECT_NE(sample_writer(32).to_bytes(), sample_writer(64).to_bytes());
}

TEST(GgufRoundTrip, SetReplacesInPlace) {
  Writer w;
  w.set("a", Value::make_u32(1));
  w.set("b", Value::make_u32(2));
  w.set("a", Value::make_string("x"));
  const File f = File::parse(w.to_bytes());
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].key, "a");
  EXPECT_EQ(f.metadata()[0].value.str, "x");
  EXPECT_EQ(f.metadata()[1].key, "b");
}

TEST(GgufRoundTrip, OpenFromFileEqualsParse) {
  const Writer w = sample_writer(64);
  TempFile tmp;
  w.write(tmp.path());
  const std::vector<uint8_t> bytes = w.to_bytes();
  {
    std::ifstream in(tmp.path(), std::ios::binary);
    const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
    EXPECT_EQ(on_disk, bytes);
  }
  File opened = File::open(tmp.path());
  const File parsed = File::parse(bytes);
  EXPECT_EQ(opened.path(), tmp.path());
  EXPECT_EQ(opened.file_size(), parsed.file_size());
  EXPECT_EQ(opened.data_offset(), parsed.data_offset());
  ASSERT_EQ(opened.metadata().size(), parsed.metadata().size());
  for (size_t i = 0; i < parsed.metadata().size(); ++i) {
    EXPECT_EQ(opened.metadata()[i].key, parsed.metadata()[i].key);
    EXPECT_TRUE(same_value(opened.metadata()[i].value, parsed.metadata()[i].value,
                           parsed.metadata()[i].key));
  }
  expect_sample_tensors(opened);

  // Moving keeps the mapping alive and the views valid; the moved-from object
  // no longer owns it (ASan would flag a double munmap or a stale view).
  File moved(std::move(opened));
  expect_sample_tensors(moved);
  File assigned = File::parse(Writer().to_bytes());
  assigned = std::move(moved);
  expect_sample_tensors(assigned);
  File parsed_moved = File::parse(bytes);
  assigned = std::move(parsed_moved);  // unmaps the file, takes the heap copy
  expect_sample_tensors(assigned);
}

// ---------------------------------------------------------------------------
// Exact layout, and the file the corruption corpus starts from

struct Corpus {
  std::vector<uint8_t> bytes;
  std::vector<Field> fields;
  size_t info_end = 0;                                   // end of the tensor infos, before padding
  size_t data_offset = 0;                                // start of the data section
  std::vector<size_t> name_at;                           // each tensor name's first byte
  std::vector<std::pair<size_t, size_t>> tensor_extent;  // absolute [begin, end)
  std::vector<size_t> key_at;                            // each key's first byte
};

const std::vector<TensorSpec>& corpus_tensors() {
  // Equal-length names and keys so a test can overwrite one with another.
  static const std::vector<TensorSpec> specs = [] {
    std::vector<TensorSpec> s = {
        {"tok_embd", TensorType::F32, {4, 3}, pattern_bytes(48, 11)},
        {"out_norm", TensorType::F16, {8}, pattern_bytes(16, 12)},
        {"blk0attn", TensorType::Q8_0, {32, 2}, pattern_bytes(68, 13)},
    };
    return s;
  }();
  return specs;
}

Corpus build_corpus(uint32_t version = 3) {
  Corpus c;
  Builder b;
  b.header(version, 3, 6);
  auto key = [&](const std::string& k, ValueType t) {
    c.key_at.push_back(b.size() + 8);
    b.key(k, t);
  };
  key("general.architecture", ValueType::STRING);
  b.str("llama");
  key("test.aaa", ValueType::UINT32);
  b.u32(7);
  key("tokenizer.tokens", ValueType::ARRAY);
  b.array_header(ValueType::STRING, 3);
  for (const char* s : {"<s>", "a", "bc"}) b.str(s);
  key("tokenizer.scores", ValueType::ARRAY);
  b.array_header(ValueType::FLOAT32, 3);
  for (float f : {0.0f, -1.5f, 2.0f}) b.raw(&f, 4);
  key("test.nested", ValueType::ARRAY);
  b.array_header(ValueType::ARRAY, 2);
  b.array_header(ValueType::UINT8, 2);
  b.u8(1);
  b.u8(2);
  b.array_header(ValueType::INT16, 1);
  const int16_t minus3 = -3;
  b.raw(&minus3, 2);
  key("test.bbb", ValueType::BOOL);
  b.u8(1);
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const TensorSpec& t : corpus_tensors()) {
    c.name_at.push_back(b.size() + 8);
    b.tensor_info(t.name, t.dims, t.type, offset);
    offsets.push_back(offset);
    offset = (offset + t.data.size() + 31) / 32 * 32;
  }
  c.info_end = b.size();
  b.pad(32);
  c.data_offset = b.size();
  for (size_t i = 0; i < corpus_tensors().size(); ++i) {
    const TensorSpec& t = corpus_tensors()[i];
    EXPECT_EQ(b.size(), c.data_offset + offsets[i]);
    c.tensor_extent.push_back({b.size(), b.size() + t.data.size()});
    b.raw(t.data.data(), t.data.size());
    b.pad(32);
  }
  c.bytes = std::move(b.b);
  c.fields = std::move(b.fields);
  return c;
}

Writer corpus_writer() {
  Writer w;
  w.set("general.architecture", Value::make_string("llama"));
  w.set("test.aaa", Value::make_u32(7));
  w.set("tokenizer.tokens", Value::make_string_array({"<s>", "a", "bc"}));
  w.set("tokenizer.scores", Value::make_f32_array({0.0f, -1.5f, 2.0f}));
  w.set("test.nested",
        Value::make_array(
            ValueType::ARRAY,
            {Value::make_array(ValueType::UINT8, {Value::make_u8(1), Value::make_u8(2)}),
             Value::make_array(ValueType::INT16, {Value::make_i16(-3)})}));
  w.set("test.bbb", Value::make_bool(true));
  for (const TensorSpec& t : corpus_tensors()) w.add_tensor(t.name, t.type, t.dims, t.data);
  return w;
}

void put32(std::vector<uint8_t>& bytes, size_t at, uint32_t v) { std::memcpy(&bytes[at], &v, 4); }
void put64(std::vector<uint8_t>& bytes, size_t at, uint64_t v) { std::memcpy(&bytes[at], &v, 8); }

const Field& nth_field(const Corpus& c, Kind kind, size_t n) {
  for (const Field& f : c.fields) {
    if (f.kind == kind && n-- == 0) return f;
  }
  ADD_FAILURE() << "no such field";
  return c.fields.front();
}

TEST(GgufLayout, WriterMatchesHandBuiltFile) {
  const Corpus c = build_corpus();
  EXPECT_EQ(corpus_writer().to_bytes(), c.bytes);
  const File f = File::parse(c.bytes);
  EXPECT_EQ(f.data_offset(), c.data_offset);
  ASSERT_EQ(f.tensors().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(f.data_offset() + f.tensors()[i].offset, c.tensor_extent[i].first);
    EXPECT_EQ(f.tensors()[i].n_bytes, c.tensor_extent[i].second - c.tensor_extent[i].first);
  }
  EXPECT_EQ(f.get_string_array("tokenizer.tokens"), (std::vector<std::string>{"<s>", "a", "bc"}));
  const Value* nested = f.find("test.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->items.size(), 2u);
  EXPECT_EQ(nested->items[1].elem_type, ValueType::INT16);
  EXPECT_EQ(nested->items[1].items.at(0).i64, -3);
}

// A file with general.alignment = 64 and one tensor, built by hand.
struct AlignedFile {
  std::vector<uint8_t> bytes;
  size_t type_at = 0, value_at = 0, offset_at = 0;
};

AlignedFile build_aligned_file() {
  AlignedFile a;
  Builder b;
  b.header(3, 1, 1);
  b.str("general.alignment", Kind::kKeyLength);
  a.type_at = b.size();
  b.u32(static_cast<uint32_t>(ValueType::UINT32));
  a.value_at = b.size();
  b.u32(64);
  b.tensor_info("t", {16}, TensorType::F32, 0);
  a.offset_at = b.size() - 8;
  b.pad(64);
  const std::vector<uint8_t> data = pattern_bytes(64, 5);
  b.raw(data.data(), data.size());
  a.bytes = std::move(b.b);
  return a;
}

TEST(GgufLayout, CustomAlignmentMatchesHandBuiltFile) {
  Writer w(64);
  w.add_tensor("t", TensorType::F32, {16}, pattern_bytes(64, 5));
  const AlignedFile a = build_aligned_file();
  EXPECT_EQ(w.to_bytes(), a.bytes);
  EXPECT_EQ(File::parse(a.bytes).alignment(), 64u);
}

TEST(GgufLayout, ReadsVersion2) {
  const Corpus c = build_corpus(2);
  const File f = File::parse(c.bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u64("test.aaa"), 7u);
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo& t = f.tensor("blk0attn");
  EXPECT_EQ(t.type, TensorType::Q8_0);
  EXPECT_EQ(std::memcmp(t.data, corpus_tensors()[2].data.data(), t.n_bytes), 0);
}

TEST(GgufLayout, NoTensorsNeedsNoTrailingPadding) {
  // llama.cpp only seeks past the padding when there are tensors.
  Builder b;
  b.header(3, 0, 1);
  b.key("a", ValueType::UINT8);
  b.u8(9);
  ASSERT_NE(b.size() % 32, 0u);
  const File f = File::parse(b.b);
  EXPECT_EQ(f.get_u64("a"), 9u);
  EXPECT_EQ(f.data_offset(), f.file_size());
}

std::vector<uint8_t> nested_array_file(int depth) {
  Builder b;
  b.header(3, 0, 1);
  b.key("deep", ValueType::ARRAY);
  for (int i = 1; i < depth; ++i) b.array_header(ValueType::ARRAY, 1);
  b.array_header(ValueType::UINT8, 1);
  b.u8(42);
  b.pad(32);  // as the writer does, so that the two can be compared
  return b.b;
}

Value nested_value(int depth) {
  Value v = Value::make_array(ValueType::UINT8, {Value::make_u8(42)});
  for (int i = 1; i < depth; ++i) v = Value::make_array(ValueType::ARRAY, {v});
  return v;
}

TEST(GgufLayout, ArrayNestingLimit) {
  const File f = File::parse(nested_array_file(8));
  const Value* v = f.find("deep");
  ASSERT_NE(v, nullptr);
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(v->items.size(), 1u);
    v = &v->items[0];
  }
  ASSERT_EQ(v->elem_type, ValueType::UINT8);
  EXPECT_EQ(v->items.at(0).u64, 42u);
  EXPECT_TRUE(contains(parse_error(nested_array_file(9)), "nested"));
  EXPECT_TRUE(contains(parse_error(nested_array_file(1000)), "nested"));

  Writer w;
  w.set("deep", nested_value(8));
  EXPECT_EQ(w.to_bytes(), nested_array_file(8));
  EXPECT_TRUE(contains(error_of([&] { w.set("deeper", nested_value(9)); }), "nested"));
}

// ---------------------------------------------------------------------------
// Opening files

TEST(GgufOpen, Errors) {
  const std::string missing = testing::TempDir() + "tandem_no_such_file.gguf";
  std::string msg = error_of([&] { File::open(missing); });
  EXPECT_TRUE(contains(msg, missing) && contains(msg, "cannot open")) << msg;

  msg = error_of([] { File::open(testing::TempDir()); });
  EXPECT_TRUE(contains(msg, "not a regular file")) << msg;

  TempFile empty;
  { std::ofstream(empty.path(), std::ios::binary); }
  msg = error_of([&] { File::open(empty.path()); });
  EXPECT_TRUE(contains(msg, empty.path()) && contains(msg, "empty")) << msg;

  // A truncated file on disk goes through the mmap path.
  TempFile cut;
  const Corpus c = build_corpus();
  {
    std::ofstream out(cut.path(), std::ios::binary);
    out.write(reinterpret_cast<const char*>(c.bytes.data()),
              static_cast<std::streamsize>(c.data_offset + 10));
  }
  msg = error_of([&] { File::open(cut.path()); });
  EXPECT_TRUE(contains(msg, cut.path()) && contains(msg, "truncated")) << msg;
}

// ---------------------------------------------------------------------------
// Getters

File getter_file() {
  Writer w;
  w.set("general.architecture", Value::make_string("llama"));
  w.set("llama.context_length", Value::make_u32(4096));
  w.set("neg", Value::make_i32(-5));
  w.set("big", Value::make_u64(std::numeric_limits<uint64_t>::max()));
  w.set("half", Value::make_f32(0.5f));
  w.set("dbl", Value::make_f64(-2.25));
  w.set("flag", Value::make_bool(true));
  w.set("tokens", Value::make_string_array({"a", "b"}));
  w.set("scores", Value::make_f32_array({1.5f, -1.0f}));
  w.set("ids", Value::make_i32_array({-7, 9}));
  w.set("u8s", Value::make_array(ValueType::UINT8, {Value::make_u8(200)}));
  w.set("bigs", Value::make_array(ValueType::UINT64, {Value::make_u64(1ull << 40)}));
  w.set("negs", Value::make_array(ValueType::INT64, {Value::make_i64(-(1ll << 40))}));
  return File::parse(w.to_bytes(), "getters.gguf");
}

TEST(GgufGetters, Strings) {
  const File f = getter_file();
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.arch_key("context_length"), "llama.context_length");
  EXPECT_EQ(f.get_string_or("nope", "fb"), "fb");
  std::string msg = error_of([&] { f.get_string("nope"); });
  EXPECT_TRUE(contains(msg, "'nope'") && contains(msg, "getters.gguf") &&
              contains(msg, "not found"))
      << msg;
  msg = error_of([&] { f.get_string("llama.context_length"); });
  EXPECT_TRUE(contains(msg, "llama.context_length") && contains(msg, "string") &&
              contains(msg, "u32"))
      << msg;
  msg = error_of([&] { f.get_string_or("neg", "fb"); });
  EXPECT_TRUE(contains(msg, "i32")) << msg;
}

TEST(GgufGetters, Integers) {
  const File f = getter_file();
  EXPECT_EQ(f.get_u64("llama.context_length"), 4096u);
  EXPECT_EQ(f.get_u64("big"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_u64_or("nope", 3), 3u);
  EXPECT_EQ(f.get_u64_or("llama.context_length", 3), 4096u);
  std::string msg = error_of([&] { f.get_u64("neg"); });
  EXPECT_TRUE(contains(msg, "-5") && contains(msg, "does not fit")) << msg;
  msg = error_of([&] { f.get_u64("half"); });
  EXPECT_TRUE(contains(msg, "integer") && contains(msg, "f32")) << msg;
  EXPECT_TRUE(contains(error_of([&] { f.get_u64("nope"); }), "nope"));
  EXPECT_TRUE(contains(error_of([&] { f.get_u64_or("flag", 1); }), "bool"));

  EXPECT_EQ(f.get_i64_or("neg", 0), -5);
  EXPECT_EQ(f.get_i64_or("llama.context_length", 0), 4096);
  EXPECT_EQ(f.get_i64_or("nope", -9), -9);
  msg = error_of([&] { f.get_i64_or("big", 0); });
  EXPECT_TRUE(contains(msg, "18446744073709551615") && contains(msg, "i64")) << msg;
}

TEST(GgufGetters, FloatsAndBools) {
  const File f = getter_file();
  EXPECT_EQ(f.get_f64("half"), 0.5);
  EXPECT_EQ(f.get_f64("dbl"), -2.25);
  EXPECT_EQ(f.get_f64("llama.context_length"), 4096.0);
  EXPECT_EQ(f.get_f64("neg"), -5.0);
  EXPECT_EQ(f.get_f64_or("nope", 1.25), 1.25);
  EXPECT_TRUE(contains(error_of([&] { f.get_f64("tokens"); }), "array of string"));
  EXPECT_TRUE(contains(error_of([&] { f.get_f64("nope"); }), "not found"));
  EXPECT_TRUE(f.get_bool_or("flag", false));
  EXPECT_FALSE(f.get_bool_or("nope", false));
  EXPECT_TRUE(contains(error_of([&] { f.get_bool_or("llama.context_length", false); }), "bool"));
}

TEST(GgufGetters, Arrays) {
  const File f = getter_file();
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(contains(error_of([&] { f.get_string_array("nope"); }), "not found"));
  std::string msg = error_of([&] { f.get_string_array("scores"); });
  EXPECT_TRUE(contains(msg, "array of f32")) << msg;
  EXPECT_TRUE(
      contains(error_of([&] { f.get_string_array("general.architecture"); }), "array of string"));

  EXPECT_EQ(f.get_f32_array_or_empty("scores"), (std::vector<float>{1.5f, -1.0f}));
  EXPECT_EQ(f.get_f32_array_or_empty("ids"), (std::vector<float>{-7.0f, 9.0f}));
  EXPECT_TRUE(f.get_f32_array_or_empty("nope").empty());
  EXPECT_TRUE(contains(error_of([&] { f.get_f32_array_or_empty("tokens"); }), "numbers"));

  EXPECT_EQ(f.get_i32_array_or_empty("ids"), (std::vector<int32_t>{-7, 9}));
  EXPECT_EQ(f.get_i32_array_or_empty("u8s"), (std::vector<int32_t>{200}));
  EXPECT_TRUE(f.get_i32_array_or_empty("nope").empty());
  msg = error_of([&] { f.get_i32_array_or_empty("bigs"); });
  EXPECT_TRUE(contains(msg, "1099511627776") && contains(msg, "i32")) << msg;
  msg = error_of([&] { f.get_i32_array_or_empty("negs"); });
  EXPECT_TRUE(contains(msg, "-1099511627776")) << msg;
  EXPECT_TRUE(contains(error_of([&] { f.get_i32_array_or_empty("scores"); }), "integers"));
}

TEST(GgufGetters, Tensors) {
  const File f = File::parse(sample_writer(32).to_bytes(), "t.gguf");
  EXPECT_NE(f.find_tensor("f16.2d"), nullptr);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  const std::string msg = error_of([&] { f.tensor("nope"); });
  EXPECT_TRUE(contains(msg, "'nope'") && contains(msg, "t.gguf")) << msg;
}

// ---------------------------------------------------------------------------
// Writer validation

TEST(GgufWriter, RejectsBadTensors) {
  Writer w;
  auto err = [&](const std::string& name, TensorType type, std::vector<uint64_t> dims, size_t n) {
    return error_of([&] { w.add_tensor(name, type, dims, std::vector<uint8_t>(n)); });
  };
  w.add_tensor("ok", TensorType::F32, {2}, std::vector<uint8_t>(8));
  EXPECT_TRUE(contains(err("ok", TensorType::F32, {2}, 8), "twice"));
  std::string msg = err("x", TensorType::F32, {2, 3}, 20);
  EXPECT_TRUE(contains(msg, "24") && contains(msg, "20")) << msg;
  EXPECT_TRUE(contains(err("x", TensorType::Q8_0, {33}, 34), "block size"));
  EXPECT_TRUE(contains(err("x", TensorType::F32, {2, 0}, 0), "zero"));
  EXPECT_TRUE(contains(err("x", TensorType::F32, {}, 0), "dimensions"));
  EXPECT_TRUE(contains(err("x", TensorType::F32, {1, 1, 1, 1, 1}, 4), "dimensions"));
  EXPECT_TRUE(contains(err("x", static_cast<TensorType>(4), {32}, 18), "unknown"));
  EXPECT_TRUE(contains(err("", TensorType::F32, {1}, 4), "empty"));
  EXPECT_TRUE(contains(err(std::string(64, 'n'), TensorType::F32, {1}, 4), "llama.cpp"));
  EXPECT_TRUE(contains(err("x", TensorType::F32, {1ull << 40, 1ull << 40}, 4), "overflow"));
  w.add_tensor(std::string(63, 'n'), TensorType::F32, {1}, std::vector<uint8_t>(4));
  EXPECT_EQ(File::parse(w.to_bytes()).tensors().size(), 2u);
}

TEST(GgufWriter, RejectsBadValues) {
  for (uint64_t a : {0ull, 3ull, 48ull, 1ull << 32}) {
    EXPECT_TRUE(contains(error_of([&] { Writer w(a); }), "alignment")) << a;
  }
  Writer w;
  EXPECT_TRUE(contains(error_of([&] { w.set("general.alignment", Value::make_u64(64)); }), "u32"));
  EXPECT_TRUE(
      contains(error_of([&] { w.set("general.alignment", Value::make_u32(0)); }), "alignment"));
  EXPECT_TRUE(contains(error_of([&] { w.set("", Value::make_u32(1)); }), "empty"));
  Value v = Value::make_u8(1);
  v.u64 = v.i64 = 300;
  EXPECT_TRUE(contains(error_of([&] { w.set("k", v); }), "range"));
  v = Value::make_i32(1);
  v.u64 = 2;  // fields disagree
  EXPECT_TRUE(contains(error_of([&] { w.set("k", v); }), "range"));
  v.type = static_cast<ValueType>(13);
  EXPECT_TRUE(contains(error_of([&] { w.set("k", v); }), "unknown value type"));
  v = Value::make_i32_array({1});
  v.items.push_back(Value::make_u8(1));
  EXPECT_TRUE(contains(error_of([&] { w.set("k", v); }), "holds an item"));
  // Nothing invalid was stored.
  EXPECT_TRUE(File::parse(w.to_bytes()).metadata().empty());
}

TEST(GgufWriter, ReportsIoErrors) {
  const Writer w = sample_writer(32);
  const std::string bad = testing::TempDir() + "no_such_dir/x.gguf";
  const std::string msg = error_of([&] { w.write(bad); });
  EXPECT_TRUE(contains(msg, bad)) << msg;
  struct stat st {};
  if (::stat("/dev/full", &st) == 0) {
    EXPECT_TRUE(contains(error_of([&] { w.write("/dev/full"); }), "/dev/full"));
  }
}

// ---------------------------------------------------------------------------
// Corrupted-file corpus

TEST(GgufCorpus, TruncationAnywhereBeforeTheDataIsAnError) {
  const Corpus c = build_corpus();
  for (size_t cut = 0; cut < c.data_offset; ++cut) {
    const std::vector<uint8_t> bytes(c.bytes.begin(), c.bytes.begin() + cut);
    const std::string msg = parse_error(bytes);
    ASSERT_TRUE(contains(msg, "truncated")) << "cut at " << cut << ": " << msg;
    ASSERT_TRUE(contains(msg, "bad.gguf") && contains(msg, "byte offset")) << msg;
  }
}

TEST(GgufCorpus, TruncationInTheData) {
  const Corpus c = build_corpus();
  const size_t last_end = c.tensor_extent.back().second;
  std::set<size_t> cuts = {c.data_offset, c.bytes.size() - 1, c.bytes.size()};
  for (const auto& [begin, end] : c.tensor_extent) {
    for (size_t cut : {begin, begin + 1, end - 1, end, end + 1}) cuts.insert(cut);
  }
  for (size_t cut : cuts) {
    const std::vector<uint8_t> bytes(c.bytes.begin(), c.bytes.begin() + cut);
    if (cut < last_end) {
      const std::string msg = parse_error(bytes);
      EXPECT_TRUE(contains(msg, "truncated") && contains(msg, "past the end")) << cut << msg;
    } else {
      // Only the padding after the last tensor is missing: every byte is there.
      const File f = File::parse(bytes);
      EXPECT_EQ(f.tensors().size(), 3u);
      check_parsed_invariants(f);
    }
  }
}

bool must_throw(Kind kind, uint64_t v) {
  const uint64_t huge = 1ull << 31;  // far more than the corpus file holds
  switch (kind) {
    case Kind::kVersion: return v != 2 && v != 3;
    case Kind::kTensorCount:
    case Kind::kKvCount:
    case Kind::kStringLength:
    case Kind::kArrayCount: return v >= huge;
    case Kind::kKeyLength:
    case Kind::kNameLength: return v == 0 || v >= huge;
    case Kind::kValueType:
    case Kind::kElemType: return v >= 13;
    case Kind::kNDims: return v == 0 || v > 4;
    case Kind::kDim: return v == 0 || v >= huge;
    case Kind::kTensorType: return !type_is_known(static_cast<TensorType>(v));
    case Kind::kOffset: return v % 32 != 0 || v >= huge;
  }
  return false;
}

// Words one of which the message for a corrupted field of this kind must hold.
std::vector<std::string> expected_words(Kind kind) {
  switch (kind) {
    case Kind::kVersion: return {"version"};
    case Kind::kTensorCount: return {"tensor count"};
    case Kind::kKvCount: return {"key count"};
    case Kind::kKeyLength:
    case Kind::kNameLength: return {"length", "empty"};
    case Kind::kStringLength: return {"length"};
    case Kind::kArrayCount: return {"array count"};
    case Kind::kValueType:
    case Kind::kElemType: return {"value type"};
    case Kind::kNDims: return {"dimensions"};
    case Kind::kDim: return {"size 0", "overflow", "past the end"};
    case Kind::kTensorType: return {"unknown tensor type"};
    case Kind::kOffset: return {"alignment", "past the end"};
  }
  return {};
}

TEST(GgufCorpus, AbsurdFieldValues) {
  const Corpus c = build_corpus();
  const uint64_t values64[] = {~0ull, 1ull << 63, 1ull << 40, 1ull << 31, 0, 1, 2, 31, 32, 64};
  const uint32_t values32[] = {0xffffffffu, 1u << 31, 65536, 0,  1,  2,  4,  5,
                               8,           12,       13,    30, 31, 39, 40, 43};
  int thrown = 0;
  for (const Field& field : c.fields) {
    std::vector<uint64_t> values;
    if (field.width == 8)
      values.assign(std::begin(values64), std::end(values64));
    else
      values.assign(std::begin(values32), std::end(values32));
    for (uint64_t v : values) {
      std::vector<uint8_t> bytes = c.bytes;
      if (field.width == 8)
        put64(bytes, field.at, v);
      else
        put32(bytes, field.at, static_cast<uint32_t>(v));
      SCOPED_TRACE("field kind " + std::to_string(static_cast<int>(field.kind)) + " at " +
                   std::to_string(field.at) + " = " + std::to_string(v));
      if (must_throw(field.kind, v)) {
        const std::string msg = parse_error(bytes);
        ++thrown;
        bool named = false;
        for (const std::string& w : expected_words(field.kind)) named |= contains(msg, w);
        EXPECT_TRUE(named) << msg;
        EXPECT_TRUE(contains(msg, "bad.gguf") && contains(msg, "byte offset")) << msg;
      } else {
        parse_or_error(bytes);
      }
    }
  }
  EXPECT_GT(thrown, 200);
}

TEST(GgufCorpus, TargetedCorruptions) {
  const Corpus c = build_corpus();
  auto patched = [&](const std::function<void(std::vector<uint8_t>&)>& patch) {
    std::vector<uint8_t> bytes = c.bytes;
    patch(bytes);
    return parse_error(bytes);
  };
  std::string msg = patched([](auto& b) { b[0] = 'X'; });
  EXPECT_TRUE(contains(msg, "magic") && contains(msg, "XGUF")) << msg;
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    msg = patched([&](auto& b) { put32(b, 4, v); });
    EXPECT_TRUE(contains(msg, "version " + std::to_string(v)) && contains(msg, "byte offset 4"))
        << msg;
  }
  EXPECT_TRUE(contains(patched([](auto& b) { put32(b, 4, 0x03000000u); }), "big-endian"));

  // Misaligned, overlapping and out-of-range tensor offsets.
  const Field& off1 = nth_field(c, Kind::kOffset, 1);
  msg = patched([&](auto& b) { put64(b, off1.at, 65); });
  EXPECT_TRUE(contains(msg, "alignment") && contains(msg, "out_norm") &&
              contains(msg, "byte offset " + std::to_string(off1.at)))
      << msg;
  msg = patched([&](auto& b) { put64(b, off1.at, 0); });
  EXPECT_TRUE(contains(msg, "overlaps") && contains(msg, "tok_embd")) << msg;
  const Field& off2 = nth_field(c, Kind::kOffset, 2);
  msg = patched([&](auto& b) { put64(b, off2.at, 64); });
  EXPECT_TRUE(contains(msg, "overlaps")) << msg;
  msg = patched([&](auto& b) { put64(b, off2.at, 128); });  // 68 bytes need 4 past the end
  EXPECT_TRUE(contains(msg, "past the end") && contains(msg, "blk0attn")) << msg;

  // Duplicates.
  msg = patched([&](auto& b) { std::memcpy(&b[c.name_at[2]], "tok_embd", 8); });
  EXPECT_TRUE(contains(msg, "duplicate tensor name 'tok_embd'") &&
              contains(msg, "byte offset " + std::to_string(c.name_at[2] - 8)))
      << msg;
  msg = patched([&](auto& b) { std::memcpy(&b[c.key_at[5]], "test.aaa", 8); });
  EXPECT_TRUE(contains(msg, "duplicate metadata key 'test.aaa'")) << msg;

  // Tensor type and shape.
  const Field& type0 = nth_field(c, Kind::kTensorType, 0);
  msg = patched([&](auto& b) { put32(b, type0.at, 40); });
  EXPECT_TRUE(contains(msg, "'tok_embd'") && contains(msg, "unknown tensor type 40")) << msg;
  const Field& q8_dim = nth_field(c, Kind::kDim, 3);
  msg = patched([&](auto& b) { put64(b, q8_dim.at, 33); });
  EXPECT_TRUE(contains(msg, "block size 32")) << msg;
  const Field& ndims = nth_field(c, Kind::kNDims, 0);
  msg = patched([&](auto& b) { put32(b, ndims.at, 5); });
  EXPECT_TRUE(contains(msg, "5 dimensions")) << msg;
  msg = patched([&](auto& b) {
    put64(b, nth_field(c, Kind::kDim, 0).at, 1ull << 32);
    put64(b, nth_field(c, Kind::kDim, 1).at, 1ull << 32);
  });
  EXPECT_TRUE(contains(msg, "overflow")) << msg;

  // Value types and counts.
  msg = patched([&](auto& b) { put32(b, nth_field(c, Kind::kValueType, 1).at, 13); });
  EXPECT_TRUE(contains(msg, "13") && contains(msg, "value type")) << msg;
  msg = patched([&](auto& b) { put64(b, nth_field(c, Kind::kArrayCount, 0).at, 1ull << 40); });
  EXPECT_TRUE(contains(msg, "array count 1099511627776")) << msg;
  msg = patched([&](auto& b) { put64(b, nth_field(c, Kind::kKvCount, 0).at, ~0ull); });
  EXPECT_TRUE(contains(msg, "key count") && contains(msg, "byte offset 16")) << msg;
  msg = patched([&](auto& b) { put64(b, nth_field(c, Kind::kTensorCount, 0).at, ~0ull); });
  EXPECT_TRUE(contains(msg, "tensor count") && contains(msg, "byte offset 8")) << msg;
}

TEST(GgufCorpus, BadAlignmentKey) {
  const AlignedFile a = build_aligned_file();
  auto with = [&](size_t at, uint32_t v) {
    std::vector<uint8_t> bytes = a.bytes;
    put32(bytes, at, v);
    return bytes;
  };
  for (uint32_t v : {0u, 3u, 96u, 0xffffffffu}) {
    const std::string msg = parse_error(with(a.value_at, v));
    EXPECT_TRUE(contains(msg, "alignment") && contains(msg, "power of two")) << msg;
  }
  for (ValueType t : {ValueType::INT32, ValueType::FLOAT32, ValueType::UINT64}) {
    const std::string msg = parse_error(with(a.type_at, static_cast<uint32_t>(t)));
    EXPECT_TRUE(contains(msg, "general.alignment") && contains(msg, "u32") &&
                contains(msg, value_type_name(t)))
        << msg;
  }
  // 32-aligned is not enough when the file asks for 64.
  const std::string msg = parse_error(with(a.offset_at, 32));
  EXPECT_TRUE(contains(msg, "alignment 64")) << msg;
  EXPECT_EQ(File::parse(with(a.value_at, 16)).alignment(), 16u);
}

TEST(GgufCorpus, RandomMutations) {
  const Corpus c = build_corpus();
  std::mt19937_64 rng(20240611);
  int parsed = 0, failed = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<uint8_t> bytes = c.bytes;
    // One byte in most cases, a few bytes in the rest; mostly in the metadata,
    // where a change can matter.
    const int n = i % 4 == 0 ? 1 + static_cast<int>(rng() % 4) : 1;
    for (int k = 0; k < n; ++k) {
      const size_t limit = i % 8 == 0 ? bytes.size() : c.info_end;
      const size_t at = rng() % limit;
      const auto v = static_cast<uint8_t>(rng());
      bytes[at] = v == bytes[at] ? static_cast<uint8_t>(v ^ 0x80) : v;
    }
    if (parse_or_error(bytes))
      ++parsed;
    else
      ++failed;
  }
  // Both outcomes occur: a mutation of a float or a string's bytes is harmless.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(failed, 1000);
}

}  // namespace
}  // namespace tandem::gguf
