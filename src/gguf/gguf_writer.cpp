// GGUF writer: version 3 files laid out as llama.cpp writes them (tensor data
// packed in order, each tensor padded to the alignment), so llama.cpp, which
// requires exactly that layout, loads them.

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "gguf/gguf.h"
#include "gguf/gguf_format.h"
#include "util/error.h"

namespace tandem::gguf {

static_assert(std::endian::native == std::endian::little,
              "tandem's GGUF writer needs a little-endian host");

namespace {

// Destination of the serialized bytes; write() and to_bytes() share one
// serializer so that they cannot disagree.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void put(const void* data, size_t n) = 0;
  uint64_t written() const { return written_; }

 protected:
  uint64_t written_ = 0;
};

class VectorSink final : public ByteSink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  void put(const void* data, size_t n) override {
    // resize + memcpy rather than insert(): GCC 12 at -O3 reports a false
    // -Wstringop-overflow for the inlined range insert.
    if (n == 0) return;
    const size_t old_size = out_.size();
    out_.resize(old_size + n);
    std::memcpy(out_.data() + old_size, data, n);
    written_ += n;
  }

 private:
  std::vector<uint8_t>& out_;
};

// Streams through stdio with a large buffer; tensor data go straight from the
// caller's vectors to the file, never through a whole-file copy.
class FileSink final : public ByteSink {
 public:
  explicit FileSink(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) fail("cannot open for writing");
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  }
  ~FileSink() override {
    if (file_ != nullptr) std::fclose(file_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void put(const void* data, size_t n) override {
    if (n != 0 && std::fwrite(data, 1, n, file_) != n) fail("write failed");
    written_ += n;
  }

  void close() {
    const bool flushed = std::fflush(file_) == 0;
    const int err = errno;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!flushed) errno = err;
    if (!flushed || !closed) fail("write failed");
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(path_ + ": " + what + ": " + std::strerror(errno));
  }

  std::string path_;
  std::FILE* file_ = nullptr;
};

template <class T>
void put_le(ByteSink& out, T v) {
  out.put(&v, sizeof v);
}

void put_string(ByteSink& out, const std::string& s) {
  put_le<uint64_t>(out, s.size());
  out.put(s.data(), s.size());
}

void put_zeros(ByteSink& out, uint64_t n) {
  static constexpr uint8_t kZeros[256] = {};
  while (n > 0) {
    const uint64_t chunk = n < sizeof kZeros ? n : sizeof kZeros;
    out.put(kZeros, chunk);
    n -= chunk;
  }
}

void pad_to(ByteSink& out, uint64_t alignment) {
  put_zeros(out, format::align_up(out.written(), alignment) - out.written());
}

// The payload of a value (no type tag): array items carry no tag either.
void put_value(ByteSink& out, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8: put_le(out, static_cast<uint8_t>(v.u64)); break;
    case ValueType::INT8: put_le(out, static_cast<int8_t>(v.i64)); break;
    case ValueType::UINT16: put_le(out, static_cast<uint16_t>(v.u64)); break;
    case ValueType::INT16: put_le(out, static_cast<int16_t>(v.i64)); break;
    case ValueType::UINT32: put_le(out, static_cast<uint32_t>(v.u64)); break;
    case ValueType::INT32: put_le(out, static_cast<int32_t>(v.i64)); break;
    case ValueType::UINT64: put_le(out, v.u64); break;
    case ValueType::INT64: put_le(out, v.i64); break;
    case ValueType::FLOAT32: put_le(out, static_cast<float>(v.f64)); break;
    case ValueType::FLOAT64: put_le(out, v.f64); break;
    case ValueType::BOOL: put_le(out, static_cast<uint8_t>(v.u64 != 0 ? 1 : 0)); break;
    case ValueType::STRING: put_string(out, v.str); break;
    case ValueType::ARRAY:
      put_le(out, static_cast<uint32_t>(v.elem_type));
      put_le<uint64_t>(out, v.items.size());
      for (const Value& item : v.items) put_value(out, item);
      break;
  }
}

// Generic over the tensor record so that Writer's private type stays private.
template <class Tensor>
void serialize(ByteSink& out, uint64_t alignment, const std::vector<KeyValue>& kv,
               const std::vector<Tensor>& tensors) {
  out.put(format::kMagic, sizeof format::kMagic);
  put_le<uint32_t>(out, format::kWriteVersion);
  put_le<uint64_t>(out, tensors.size());
  put_le<uint64_t>(out, kv.size());
  for (const KeyValue& entry : kv) {
    put_string(out, entry.key);
    put_le(out, static_cast<uint32_t>(entry.value.type));
    put_value(out, entry.value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    put_string(out, t.name);
    put_le<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put_le(out, d);
    put_le(out, static_cast<uint32_t>(t.type));
    put_le(out, offset);
    offset = format::align_up(offset + t.data.size(), alignment);
  }
  pad_to(out, alignment);
  const uint64_t data_start = out.written();
  for (const Tensor& t : tensors) {
    out.put(t.data.data(), t.data.size());
    // llama.cpp pads after every tensor, the last included, and reads the
    // padded size back.
    put_zeros(out, format::align_up(out.written() - data_start, alignment) -
                       (out.written() - data_start));
  }
}

bool in_range(const Value& v) {
  // The two integer fields must agree, or which one is written would matter.
  if (v.u64 != static_cast<uint64_t>(v.i64)) return false;
  switch (v.type) {
    case ValueType::UINT8: return v.u64 <= std::numeric_limits<uint8_t>::max();
    case ValueType::UINT16: return v.u64 <= std::numeric_limits<uint16_t>::max();
    case ValueType::UINT32: return v.u64 <= std::numeric_limits<uint32_t>::max();
    case ValueType::INT8:
      return v.i64 >= std::numeric_limits<int8_t>::min() &&
             v.i64 <= std::numeric_limits<int8_t>::max();
    case ValueType::INT16:
      return v.i64 >= std::numeric_limits<int16_t>::min() &&
             v.i64 <= std::numeric_limits<int16_t>::max();
    case ValueType::INT32:
      return v.i64 >= std::numeric_limits<int32_t>::min() &&
             v.i64 <= std::numeric_limits<int32_t>::max();
    case ValueType::BOOL: return v.u64 <= 1;
    default: return true;
  }
}

// Rejects values the serializer could not write faithfully or the reader
// would refuse. `depth` is the number of enclosing arrays.
void validate_value(const std::string& key, const Value& v, int depth) {
  const auto bad = [&](const std::string& why) {
    throw Error("GGUF writer: metadata key '" + key + "': " + why);
  };
  if (static_cast<uint32_t>(v.type) >= format::kValueTypeCount) {
    bad("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
  const bool integer = v.is_integer() || v.type == ValueType::BOOL;
  if (integer && !in_range(v)) bad("value out of range for type " + value_type_name(v.type));
  if (v.type != ValueType::ARRAY) return;
  if (depth + 1 > format::kMaxArrayDepth) {
    bad("arrays nested more than " + std::to_string(format::kMaxArrayDepth) + " deep");
  }
  if (static_cast<uint32_t>(v.elem_type) >= format::kValueTypeCount) {
    bad("unknown array element type " + std::to_string(static_cast<uint32_t>(v.elem_type)));
  }
  for (const Value& item : v.items) {
    if (item.type != v.elem_type) {
      bad("array of " + value_type_name(v.elem_type) + " holds an item of type " +
          value_type_name(item.type));
    }
    validate_value(key, item, depth + 1);
  }
}

void check_alignment(uint64_t alignment) {
  if (!format::is_power_of_two(alignment) || alignment > std::numeric_limits<uint32_t>::max()) {
    throw Error("GGUF writer: alignment " + std::to_string(alignment) +
                " must be a power of two that fits in 32 bits");
  }
}

}  // namespace

Writer::Writer(uint64_t alignment) : alignment_(alignment) {
  check_alignment(alignment);
  // Readers assume 32 unless the file says otherwise.
  if (alignment != format::kDefaultAlignment) {
    kv_.push_back(
        {std::string(format::kAlignmentKey), Value::make_u32(static_cast<uint32_t>(alignment))});
  }
}

void Writer::set(const std::string& key, Value value) {
  if (key.empty()) throw Error("GGUF writer: metadata keys must not be empty");
  validate_value(key, value, 0);
  if (key == format::kAlignmentKey) {
    if (value.type != ValueType::UINT32) {
      throw Error("GGUF writer: " + key + " must be of type u32, not " +
                  value_type_name(value.type));
    }
    check_alignment(value.u64);
    alignment_ = value.u64;
  }
  for (KeyValue& kv : kv_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kv_.push_back({key, std::move(value)});
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                        std::vector<uint8_t> data) {
  const std::string what = "GGUF writer: tensor '" + name + "'";
  if (name.empty()) throw Error("GGUF writer: tensor names must not be empty");
  if (name.size() > format::kMaxTensorNameBytes) {
    throw Error(what + ": name longer than " + std::to_string(format::kMaxTensorNameBytes) +
                " bytes (llama.cpp cannot load it)");
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) throw Error(what + " added twice");
  }
  if (!type_is_known(type)) {
    throw Error(what + ": unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
  }
  if (dims.empty() || dims.size() > format::kMaxDims) {
    throw Error(what + ": " + std::to_string(dims.size()) + " dimensions; must be 1 to " +
                std::to_string(format::kMaxDims));
  }
  uint64_t n_elements = 1;
  for (uint64_t d : dims) {
    if (d == 0) throw Error(what + ": zero-sized dimension");
    if (__builtin_mul_overflow(n_elements, d, &n_elements) ||
        n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(what + ": element count overflows");
    }
  }
  uint64_t expected = row_bytes(type, dims[0]);
  if (expected == 0) {
    throw Error(what + ": row of " + std::to_string(dims[0]) + " elements is not a multiple of " +
                type_name(type) + "'s block size " + std::to_string(type_block_elements(type)));
  }
  for (size_t i = 1; i < dims.size(); ++i) {
    if (__builtin_mul_overflow(expected, dims[i], &expected)) {
      throw Error(what + ": byte size overflows");
    }
  }
  if (data.size() != expected) {
    throw Error(what + " of type " + type_name(type) + ": shape needs " + std::to_string(expected) +
                " bytes but " + std::to_string(data.size()) + " were given");
  }
  tensors_.push_back({name, type, std::move(dims), std::move(data)});
}

void Writer::write(const std::string& path) const {
  FileSink out(path);
  serialize(out, alignment_, kv_, tensors_);
  out.close();
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> bytes;
  VectorSink out(bytes);
  serialize(out, alignment_, kv_, tensors_);
  return bytes;
}

}  // namespace tandem::gguf
