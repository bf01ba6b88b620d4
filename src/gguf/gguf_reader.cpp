// GGUF reader: maps a file, validates every field against the file size and
// builds the metadata table and tensor views.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "gguf/gguf.h"
#include "gguf/gguf_format.h"
#include "util/error.h"

namespace tandem::gguf {

// GGUF is little-endian; reading with memcpy is only correct on such hosts.
static_assert(std::endian::native == std::endian::little,
              "tandem's GGUF reader needs a little-endian host");

namespace {

constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Smallest possible encodings, used to reject counts that the remaining bytes
// could not hold before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key length, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, 1 dim, type, offset

uint64_t min_item_bytes(ValueType type) {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL: return 1;
    case ValueType::UINT16:
    case ValueType::INT16: return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32: return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
    case ValueType::STRING: return 8;     // strings: the length field
    case ValueType::ARRAY: return 4 + 8;  // element type and count
  }
  return 1;
}

// Names from a corrupt file may hold control bytes (a NUL would cut the
// message short) or be huge; messages show them escaped and shortened.
std::string quote(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 || ch == 0x7f) {
      out += "\\x";
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  out += "'";
  if (s.size() > kMaxShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

[[noreturn]] void fail_at(const std::string& file, uint64_t offset, const std::string& what) {
  throw Error(file + ": " + what + " (at byte offset " + std::to_string(offset) + ")");
}

// Bounds-checked little-endian reads over [base, base + size). Every read
// checks the remaining length first, so no field can make it read outside.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(uint64_t offset, const std::string& what) const {
    fail_at(file_, offset, what);
  }

  // `what` is a view so that a successful read builds no message.
  void need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      fail(pos_, "truncated file: " + std::string(what) + " needs " + std::to_string(n) +
                     " bytes but only " + std::to_string(remaining()) + " remain in the " +
                     std::to_string(size_) + "-byte file");
    }
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    if (remaining() < sizeof(uint64_t)) need(sizeof(uint64_t), "length of " + std::string(what));
    const auto len = read<uint64_t>(what);
    if (len > remaining()) {
      fail(at, "length " + std::to_string(len) + " of " + std::string(what) + " is more than the " +
                   std::to_string(remaining()) + " bytes left in the file (truncated or corrupt)");
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

ValueType read_value_type(Cursor& c, const std::string& what) {
  const uint64_t at = c.pos();
  const uint32_t raw = c.read<uint32_t>(what);
  if (raw >= format::kValueTypeCount) {
    c.fail(at, what + " is " + std::to_string(raw) + ", which is not a known GGUF value type");
  }
  return static_cast<ValueType>(raw);
}

Value integer_value(ValueType type, int64_t v) {
  Value out;
  out.type = type;
  out.i64 = v;
  out.u64 = static_cast<uint64_t>(v);
  return out;
}

Value unsigned_value(ValueType type, uint64_t v) {
  Value out;
  out.type = type;
  out.u64 = v;
  out.i64 = static_cast<int64_t>(v);
  return out;
}

Value float_value(ValueType type, double v) {
  Value out;
  out.type = type;
  out.f64 = v;
  return out;
}

// `depth` is the number of arrays enclosing this value.
Value read_value(Cursor& c, ValueType type, int depth, const std::string& what) {
  switch (type) {
    case ValueType::UINT8: return unsigned_value(type, c.read<uint8_t>(what));
    case ValueType::INT8: return integer_value(type, c.read<int8_t>(what));
    case ValueType::UINT16: return unsigned_value(type, c.read<uint16_t>(what));
    case ValueType::INT16: return integer_value(type, c.read<int16_t>(what));
    case ValueType::UINT32: return unsigned_value(type, c.read<uint32_t>(what));
    case ValueType::INT32: return integer_value(type, c.read<int32_t>(what));
    case ValueType::UINT64: return unsigned_value(type, c.read<uint64_t>(what));
    case ValueType::INT64: return integer_value(type, c.read<int64_t>(what));
    case ValueType::FLOAT32: return float_value(type, c.read<float>(what));
    case ValueType::FLOAT64: return float_value(type, c.read<double>(what));
    // Any non-zero byte is true, as in llama.cpp.
    case ValueType::BOOL: return unsigned_value(type, c.read<uint8_t>(what) != 0 ? 1 : 0);
    case ValueType::STRING: {
      Value out;
      out.type = type;
      out.str = c.read_string(what);
      return out;
    }
    case ValueType::ARRAY: {
      const uint64_t at = c.pos();
      if (depth + 1 > format::kMaxArrayDepth) {
        c.fail(at, what + ": arrays nested more than " + std::to_string(format::kMaxArrayDepth) +
                       " deep");
      }
      const ValueType elem = read_value_type(c, "element type of " + what);
      const uint64_t count_at = c.pos();
      const uint64_t count = c.read<uint64_t>("item count of " + what);
      if (count > c.remaining() / min_item_bytes(elem)) {
        c.fail(count_at, "array count " + std::to_string(count) + " of " + what + " (" +
                             value_type_name(elem) + " items) is more than the " +
                             std::to_string(c.remaining()) +
                             " bytes left in the file could hold (truncated or corrupt)");
      }
      Value out;
      out.type = ValueType::ARRAY;
      out.elem_type = elem;
      out.items.reserve(count);
      // One description for all items: a per-item one would cost an allocation
      // per token of a vocabulary; the byte offset locates the bad item anyway.
      const std::string item_what = "an item of " + what;
      for (uint64_t i = 0; i < count; ++i) {
        out.items.push_back(read_value(c, elem, depth + 1, item_what));
      }
      return out;
    }
  }
  // read_value_type() only lets known types through.
  TANDEM_ASSERT(false, "unvalidated GGUF value type");
  return {};
}

std::string describe(const Value& v) {
  if (v.type == ValueType::ARRAY) return "array of " + value_type_name(v.elem_type);
  return value_type_name(v.type);
}

bool is_signed_integer(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
         t == ValueType::INT64;
}

bool is_integer_type(ValueType t) {
  return is_signed_integer(t) || t == ValueType::UINT8 || t == ValueType::UINT16 ||
         t == ValueType::UINT32 || t == ValueType::UINT64;
}

bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

std::string integer_text(const Value& v) {
  return is_signed_integer(v.type) ? std::to_string(v.i64) : std::to_string(v.u64);
}

}  // namespace

File File::open(const std::string& path) {
  File f = open_one(path);
  f.open_split_parts();
  return f;
}

void File::open_split_parts() {
  const uint64_t count = get_u64_or("split.count", 1);
  if (count <= 1) return;
  if (count > 99999) throw Error(path_ + ": split.count " + std::to_string(count) + " is not a number of parts");
  const uint64_t no = get_u64_or("split.no", 0);
  // gguf-split names part i (from 0) "<prefix>-<i+1, 5 digits>-of-<count, 5 digits>.gguf".
  auto part_name = [count](const std::string& prefix, uint64_t i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(i + 1),
                  static_cast<unsigned long long>(count));
    return prefix + buf;
  };
  const std::string suffix = part_name("", no);
  if (path_.size() <= suffix.size() || path_.compare(path_.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw Error(path_ + ": part " + std::to_string(no + 1) + " of a model split in " + std::to_string(count) +
                ", but its name does not end in '" + suffix +
                "', so its other parts cannot be found (keep the names gguf-split gave them)");
  const std::string prefix = path_.substr(0, path_.size() - suffix.size());
  if (no != 0)
    throw Error(path_ + ": part " + std::to_string(no + 1) + " of " + std::to_string(count) +
                " of a split model; open the first part, " + part_name(prefix, 0));
  for (uint64_t i = 1; i < count; ++i) {
    const std::string part_path = part_name(prefix, i);
    struct stat st {};
    if (::stat(part_path.c_str(), &st) != 0)
      throw Error(path_ + ": part " + std::to_string(i + 1) + " of " + std::to_string(count) +
                  " of this split model is missing: " + part_path);
    File part = open_one(part_path);
    const uint64_t part_count = part.get_u64_or("split.count", 0);
    const uint64_t part_no = part.get_u64_or("split.no", 0);
    if (part_count != count || part_no != i)
      throw Error(part_path + ": does not belong with " + path_ + ": it says it is part " +
                  std::to_string(part_no + 1) + " of " + std::to_string(part_count) + ", expected part " +
                  std::to_string(i + 1) + " of " + std::to_string(count));
    for (const TensorInfo& t : part.tensors_) {
      if (find_tensor(t.name) != nullptr)
        throw Error(part_path + ": tensor " + quote(t.name) + " is also in another part of the split model");
      tensors_.push_back(t);
    }
    parts_.push_back(std::move(part));
  }
  const int64_t expected = get_i64_or("split.tensors.count", -1);
  if (expected >= 0 && static_cast<uint64_t>(expected) != tensors_.size())
    throw Error(path_ + ": the " + std::to_string(count) + " parts of this split model hold " +
                std::to_string(tensors_.size()) + " tensors, but split.tensors.count says " +
                std::to_string(expected));
}

uint64_t File::file_size() const {
  uint64_t total = size_;
  for (const File& p : parts_) total += p.size_;
  return total;
}

File File::open_one(const std::string& path) {
  File f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw Error(path + ": file is empty (truncated, or not a GGUF file)");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) throw Error(path + ": cannot mmap: " + std::strerror(err));
  f.mapping_ = m;
  f.base_ = static_cast<const uint8_t*>(m);
  f.size_ = size;
  f.parse_all();  // on failure f's destructor unmaps
  return f;
}

void File::drop_pages(const uint8_t* begin, size_t n_bytes) const {
  for (const File& p : parts_)
    if (begin >= p.base_ && begin < p.base_ + p.size_) return p.drop_pages(begin, n_bytes);
  // Only this file's own mapping: other memory (a copy) is not the file's to drop.
  if (mapping_ == nullptr || n_bytes == 0 || begin < base_ || begin >= base_ + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + n_bytes) / page * page;
  // Advice: if the kernel declines, the pages simply stay resident.
  if (first < last) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

File File::parse(std::span<const uint8_t> bytes, const std::string& name) {
  File f;
  f.path_ = name;
  f.owned_bytes_.assign(bytes.begin(), bytes.end());
  f.base_ = f.owned_bytes_.data();
  f.size_ = f.owned_bytes_.size();
  f.parse_all();
  return f;
}

// Tensor views point into the mapping or into owned_bytes_' heap buffer; both
// move with the object, so the views stay valid.
File::File(File&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapping_(std::exchange(o.mapping_, nullptr)),
      owned_bytes_(std::move(o.owned_bytes_)),
      version_(o.version_),
      alignment_(o.alignment_),
      data_offset_(o.data_offset_),
      kv_(std::move(o.kv_)),
      tensors_(std::move(o.tensors_)),
      parts_(std::move(o.parts_)) {}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (mapping_ != nullptr) ::munmap(mapping_, size_);
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapping_ = std::exchange(o.mapping_, nullptr);
    owned_bytes_ = std::move(o.owned_bytes_);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    parts_ = std::move(o.parts_);
  }
  return *this;
}

File::~File() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

void File::parse_all() {
  Cursor c(base_, size_, path_);

  // Header.
  c.need(4, "the GGUF magic");
  if (std::memcmp(base_, format::kMagic, 4) != 0) {
    std::string shown;
    for (int i = 0; i < 4; ++i) {
      const char ch = static_cast<char>(base_[i]);
      shown += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    }
    c.fail(0, "not a GGUF file: bad magic '" + shown + "' (expected 'GGUF')");
  }
  c.read<uint32_t>("magic");
  const uint64_t version_at = c.pos();
  version_ = c.read<uint32_t>("the version");
  if (version_ < format::kMinReadVersion || version_ > format::kMaxReadVersion) {
    std::string what =
        "unsupported GGUF version " + std::to_string(version_) + " (tandem reads versions 2 and 3)";
    if (version_ == 1) what += "; re-convert the model with a current llama.cpp";
    // A big-endian v2/v3 file reads as 0x02000000/0x03000000.
    if (version_ != 0 && (version_ & 0xffff) == 0) what += "; is this a big-endian file?";
    c.fail(version_at, what);
  }
  const uint64_t tensor_count_at = c.pos();
  const uint64_t tensor_count = c.read<uint64_t>("the tensor count");
  const uint64_t kv_count_at = c.pos();
  const uint64_t kv_count = c.read<uint64_t>("the metadata key count");
  if (kv_count > c.remaining() / kMinKvBytes) {
    c.fail(kv_count_at, "metadata key count " + std::to_string(kv_count) + " is more than the " +
                            std::to_string(c.remaining()) +
                            " bytes left in the file could hold (truncated or corrupt)");
  }

  // Metadata.
  std::vector<uint64_t> kv_at;  // byte offset of each key, for later messages
  std::unordered_map<std::string, uint64_t> key_seen;
  kv_.reserve(kv_count);
  kv_at.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.read_string("metadata key #" + std::to_string(i));
    if (key.empty()) c.fail(at, "metadata key #" + std::to_string(i) + " is empty");
    const auto [it, inserted] = key_seen.emplace(key, at);
    if (!inserted) {
      c.fail(at, "duplicate metadata key " + quote(key) + " (first at byte offset " +
                     std::to_string(it->second) + ")");
    }
    const std::string what = "value of metadata key " + quote(key);
    const ValueType type = read_value_type(c, "type of metadata key " + quote(key));
    Value value = read_value(c, type, 0, what);
    kv_.push_back({std::move(key), std::move(value)});
    kv_at.push_back(at);
  }

  alignment_ = format::kDefaultAlignment;
  for (size_t i = 0; i < kv_.size(); ++i) {
    if (kv_[i].key != format::kAlignmentKey) continue;
    const Value& v = kv_[i].value;
    if (v.type != ValueType::UINT32) {
      c.fail(kv_at[i],
             std::string(format::kAlignmentKey) + " must be of type u32 but is " + describe(v));
    }
    if (!format::is_power_of_two(v.u64)) {
      c.fail(kv_at[i], std::string(format::kAlignmentKey) + " is " + std::to_string(v.u64) +
                           "; the alignment must be a non-zero power of two");
    }
    alignment_ = v.u64;
  }

  // Tensor infos.
  if (tensor_count > c.remaining() / kMinTensorInfoBytes) {
    c.fail(tensor_count_at, "tensor count " + std::to_string(tensor_count) + " is more than the " +
                                std::to_string(c.remaining()) +
                                " bytes left in the file could hold (truncated or corrupt)");
  }
  std::vector<uint64_t> offset_at;  // byte offset of each tensor's offset field
  std::unordered_map<std::string, uint64_t> name_seen;
  tensors_.reserve(tensor_count);
  offset_at.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    const uint64_t name_at = c.pos();
    t.name = c.read_string("name of tensor #" + std::to_string(i));
    if (t.name.empty()) c.fail(name_at, "name of tensor #" + std::to_string(i) + " is empty");
    const auto [it, inserted] = name_seen.emplace(t.name, name_at);
    if (!inserted) {
      c.fail(name_at, "duplicate tensor name " + quote(t.name) + " (first at byte offset " +
                          std::to_string(it->second) + ")");
    }
    const std::string what = "tensor " + quote(t.name);

    const uint64_t dims_at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>("dimension count of " + what);
    if (n_dims < 1 || n_dims > format::kMaxDims) {
      c.fail(dims_at, what + " has " + std::to_string(n_dims) + " dimensions; must be 1 to " +
                          std::to_string(format::kMaxDims));
    }
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = c.pos();
      const uint64_t dim = c.read<uint64_t>("dimension " + std::to_string(d) + " of " + what);
      // Zero-sized tensors are useless to a model, and rejecting them keeps
      // every partial product of the shape bounded by the total.
      if (dim == 0) c.fail(dim_at, what + " has dimension " + std::to_string(d) + " of size 0");
      if (__builtin_mul_overflow(n_elements, dim, &n_elements) || n_elements > kMaxI64) {
        c.fail(dim_at, what + " dimension " + std::to_string(d) + " of size " +
                           std::to_string(dim) + " makes the element count overflow 2^63");
      }
      t.dims.push_back(dim);
    }

    const uint64_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>("type of " + what);
    t.type = static_cast<TensorType>(type_id);
    if (!type_is_known(t.type)) {
      c.fail(type_at, what + " has unknown tensor type " + std::to_string(type_id));
    }
    const uint64_t block = type_block_elements(t.type);
    if (t.dims[0] % block != 0) {
      c.fail(type_at, what + " of type " + type_name(t.type) + " has " + std::to_string(t.dims[0]) +
                          " elements per row, not a multiple of the block size " +
                          std::to_string(block));
    }
    t.n_bytes = row_bytes(t.type, t.dims[0]);
    for (size_t d = 1; d < t.dims.size(); ++d) {
      if (__builtin_mul_overflow(t.n_bytes, t.dims[d], &t.n_bytes)) {
        c.fail(type_at, what + " of type " + type_name(t.type) + " and shape " + t.shape_string() +
                            " has a byte size that overflows 64 bits");
      }
    }

    offset_at.push_back(c.pos());
    t.offset = c.read<uint64_t>("data offset of " + what);
    if (t.offset % alignment_ != 0) {
      c.fail(offset_at.back(), what + " data offset " + std::to_string(t.offset) +
                                   " is not a multiple of the alignment " +
                                   std::to_string(alignment_));
    }
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t info_end = c.pos();
  data_offset_ = format::align_up(info_end, alignment_);
  if (data_offset_ > size_) {
    // llama.cpp skips the padding when there are no tensors; so do we.
    if (tensor_count > 0) {
      c.fail(info_end, "truncated file: the data section would start at byte offset " +
                           std::to_string(data_offset_) + ", past the end of the " +
                           std::to_string(size_) + "-byte file");
    }
    data_offset_ = size_;
  }
  const uint64_t data_size = size_ - data_offset_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& t = tensors_[i];
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      c.fail(offset_at[i], "tensor " + quote(t.name) + " data (offset " + std::to_string(t.offset) +
                               ", " + std::to_string(t.n_bytes) + " bytes) extends past the " +
                               "end of the " + std::to_string(data_size) +
                               "-byte data section (truncated or corrupt file)");
    }
    t.data = base_ + data_offset_ + t.offset;
  }

  // No two tensors may share bytes: a writer that overlaps them is broken, and
  // a model would silently read one tensor's weights as another's.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors_[order[k - 1]];
    const TensorInfo& cur = tensors_[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset) {
      c.fail(offset_at[order[k]], "tensor " + quote(cur.name) + " data at offset " +
                                      std::to_string(cur.offset) + " overlaps tensor " +
                                      quote(prev.name) + " (offset " + std::to_string(prev.offset) +
                                      ", " + std::to_string(prev.n_bytes) + " bytes)");
    }
  }
}

const Value* File::find(std::string_view key) const {
  for (const KeyValue& kv : kv_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) throw Error(path_ + ": tensor " + quote(name) + " not found");
  return *t;
}

namespace {

[[noreturn]] void missing_key(const std::string& file, std::string_view key) {
  throw Error(file + ": metadata key " + quote(key) + " not found");
}

[[noreturn]] void wrong_type(const std::string& file, std::string_view key,
                             const std::string& expected, const Value& v) {
  throw Error(file + ": metadata key " + quote(key) + " should be " + expected + " but is " +
              describe(v));
}

[[noreturn]] void does_not_fit(const std::string& file, std::string_view key,
                               const std::string& value, const std::string& target) {
  throw Error(file + ": metadata key " + quote(key) + " has value " + value +
              ", which does not fit in " + target);
}

uint64_t to_u64(const std::string& file, std::string_view key, const Value& v) {
  if (!v.is_integer()) wrong_type(file, key, "an integer", v);
  if (is_signed_integer(v.type) && v.i64 < 0) does_not_fit(file, key, integer_text(v), "u64");
  return v.u64;
}

int64_t to_i64(const std::string& file, std::string_view key, const Value& v) {
  if (!v.is_integer()) wrong_type(file, key, "an integer", v);
  if (!is_signed_integer(v.type) && v.u64 > kMaxI64) {
    does_not_fit(file, key, integer_text(v), "i64");
  }
  return v.i64;
}

double to_f64(const std::string& file, std::string_view key, const Value& v) {
  if (v.is_float()) return v.f64;
  if (v.is_integer()) {
    return is_signed_integer(v.type) ? static_cast<double>(v.i64) : static_cast<double>(v.u64);
  }
  wrong_type(file, key, "a number", v);
}

}  // namespace

std::string File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) missing_key(path_, key);
  if (v->type != ValueType::STRING) wrong_type(path_, key, "a string", *v);
  return v->str;
}

std::string File::get_string_or(std::string_view key, const std::string& fallback) const {
  return find(key) == nullptr ? fallback : get_string(key);
}

uint64_t File::get_u64(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) missing_key(path_, key);
  return to_u64(path_, key, *v);
}

uint64_t File::get_u64_or(std::string_view key, uint64_t fallback) const {
  const Value* v = find(key);
  return v == nullptr ? fallback : to_u64(path_, key, *v);
}

int64_t File::get_i64_or(std::string_view key, int64_t fallback) const {
  const Value* v = find(key);
  return v == nullptr ? fallback : to_i64(path_, key, *v);
}

double File::get_f64(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) missing_key(path_, key);
  return to_f64(path_, key, *v);
}

double File::get_f64_or(std::string_view key, double fallback) const {
  const Value* v = find(key);
  return v == nullptr ? fallback : to_f64(path_, key, *v);
}

bool File::get_bool_or(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (v == nullptr) return fallback;
  if (v->type != ValueType::BOOL) wrong_type(path_, key, "a bool", *v);
  return v->u64 != 0;
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) missing_key(path_, key);
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING) {
    wrong_type(path_, key, "an array of string", *v);
  }
  std::vector<std::string> out;
  out.reserve(v->items.size());
  for (const Value& item : v->items) out.push_back(item.str);
  return out;
}

std::vector<float> File::get_f32_array_or_empty(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return {};
  if (v->type != ValueType::ARRAY ||
      !(is_integer_type(v->elem_type) || is_float_type(v->elem_type))) {
    wrong_type(path_, key, "an array of numbers", *v);
  }
  std::vector<float> out;
  out.reserve(v->items.size());
  for (const Value& item : v->items) out.push_back(static_cast<float>(to_f64(path_, key, item)));
  return out;
}

std::vector<int32_t> File::get_i32_array_or_empty(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return {};
  if (v->type != ValueType::ARRAY || !is_integer_type(v->elem_type)) {
    wrong_type(path_, key, "an array of integers", *v);
  }
  std::vector<int32_t> out;
  out.reserve(v->items.size());
  for (const Value& item : v->items) {
    const bool negative = is_signed_integer(item.type) && item.i64 < 0;
    const bool fits = negative
                          ? item.i64 >= std::numeric_limits<int32_t>::min()
                          : item.u64 <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    if (!fits) does_not_fit(path_, key, integer_text(item), "i32");
    out.push_back(static_cast<int32_t>(item.i64));
  }
  return out;
}

std::string File::arch_key(std::string_view suffix) const {
  return architecture() + "." + std::string(suffix);
}

}  // namespace tandem::gguf
