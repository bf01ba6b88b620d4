// GGUF: the model file format shared with llama.cpp (versions 2 and 3).
//
// Reader: the file is mmap'd and parsed once; tensor data are zero-copy views
// into the mapping. Every count, length, offset and size read from the file is
// validated against the file size before use, so a truncated or corrupted file
// is a tandem::Error naming what is wrong, never an out-of-bounds read.
// Writer: produces files that llama.cpp loads (keys and tensors in insertion
// order, so the same inputs give the same bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::gguf {

// ggml tensor types, numbered as in ggml.h. Those kernels::DType lists can
// be computed with; the rest are known so that errors can name them.
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
  IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Name as llama.cpp prints it ("f16", "q8_0", ...), or "type<N>" if unknown.
std::string type_name(TensorType type);
bool type_is_known(TensorType type);
// Elements per block and bytes per block (1 and element size for plain types).
// Both are 0 for an unknown type.
uint64_t type_block_elements(TensorType type);
uint64_t type_block_bytes(TensorType type);
// Byte size of a row of `n` elements, or 0 if n is not a multiple of the block size.
uint64_t row_bytes(TensorType type, uint64_t n);

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string value_type_name(ValueType type);

// One metadata value. Integers are kept in both `u64` and `i64` (the same
// bits), floats in `f64`, booleans in `u64` (0/1). Arrays keep their element
// type in `elem_type` and items in `items`; arrays may nest.
struct Value {
  ValueType type = ValueType::UINT32;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  double f64 = 0;
  std::string str;
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;

  static Value make_u8(uint8_t v);
  static Value make_i8(int8_t v);
  static Value make_u16(uint16_t v);
  static Value make_i16(int16_t v);
  static Value make_u32(uint32_t v);
  static Value make_i32(int32_t v);
  static Value make_u64(uint64_t v);
  static Value make_i64(int64_t v);
  static Value make_f32(float v);
  static Value make_f64(double v);
  static Value make_bool(bool v);
  static Value make_string(std::string v);
  static Value make_string_array(const std::vector<std::string>& v);
  static Value make_f32_array(const std::vector<float>& v);
  static Value make_i32_array(const std::vector<int32_t>& v);
  // Generic array; every item must have type `elem` (an Error otherwise).
  static Value make_array(ValueType elem, std::vector<Value> items);

  bool is_integer() const;
  bool is_float() const;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::F32;
  std::vector<uint64_t> dims;  // dims[0] is the contiguous (innermost) dimension
  uint64_t offset = 0;         // from the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // view into the mapped file

  uint64_t n_elements() const;
  // Shape as text, e.g. "[1024, 32000]".
  std::string shape_string() const;
};

class File {
 public:
  // Maps and parses a file. Throws tandem::Error on any problem. The first
  // part of a model split by llama.cpp's gguf-split
  // ("name-00001-of-00003.gguf", the split.* keys) opens the other parts
  // beside it: their tensors join this file's, the metadata is the first
  // part's. A missing, foreign or out-of-order part is an Error naming it.
  static File open(const std::string& path);
  // Parses a buffer held in memory (tests, corrupted-file corpus). The bytes are copied.
  static File parse(std::span<const uint8_t> bytes, const std::string& name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const;  // of every part, for a split model
  size_t split_count() const { return 1 + parts_.size(); }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;
  // Like find_tensor, but a missing tensor is an Error naming it and the file.
  const TensorInfo& tensor(std::string_view name) const;

  // Typed getters. A missing key or a value of the wrong type is an Error
  // naming the key; the *_or variants return the fallback when the key is missing
  // (but still throw on a wrong type). Integer getters accept any integer type
  // whose value fits.
  std::string get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, const std::string& fallback) const;
  uint64_t get_u64(std::string_view key) const;
  uint64_t get_u64_or(std::string_view key, uint64_t fallback) const;
  int64_t get_i64_or(std::string_view key, int64_t fallback) const;
  double get_f64(std::string_view key) const;  // any float or integer type
  double get_f64_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::vector<std::string> get_string_array(std::string_view key) const;  // missing -> Error
  std::vector<float> get_f32_array_or_empty(std::string_view key) const;    // any numeric array
  std::vector<int32_t> get_i32_array_or_empty(std::string_view key) const;  // any integer array

  // Tells the kernel this process no longer needs the mapped pages wholly
  // inside [begin, begin + n_bytes) (after the model copied them elsewhere).
  // The bytes stay readable: touching them reads them from the file again.
  // A no-op for a parsed buffer.
  void drop_pages(const uint8_t* begin, size_t n_bytes) const;

  // general.architecture, and "<arch>.<suffix>" keys.
  std::string architecture() const { return get_string("general.architecture"); }
  std::string arch_key(std::string_view suffix) const;

 private:
  File() = default;
  static File open_one(const std::string& path);
  void parse_all();
  void open_split_parts();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;           // mmap'd region, or nullptr
  std::vector<uint8_t> owned_bytes_;  // for parse()
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<File> parts_;  // the other parts of a split model (their tensors are in tensors_)
};

class Writer {
 public:
  // `alignment` must be a power of two; any value but 32 is stored as the
  // first key, general.alignment. Setting that key later changes it.
  explicit Writer(uint64_t alignment = 32);

  // Adds or replaces a key (insertion order is kept for new keys).
  void set(const std::string& key, Value value);
  // Adds a tensor. `data` must hold exactly row_bytes(type, dims[0]) * rows bytes.
  void add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                  std::vector<uint8_t> data);
  // Writes a version 3 file. Throws tandem::Error on I/O failure.
  void write(const std::string& path) const;
  // The same bytes as write() would produce.
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
  uint64_t alignment_;
  std::vector<KeyValue> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem::gguf
