// Little-endian byte writer and bounds-checked reader for the transport's wire
// formats. The reader never reads past its input: a short or malformed frame
// sets `ok() == false` and every later read returns zero, so a decoder checks
// once at the end instead of after every field.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace tandem::transport {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    if constexpr (std::is_enum_v<T>) {
      put(static_cast<std::underlying_type_t<T>>(value));
    } else {
      static_assert(std::is_integral_v<T>);
      using U = std::make_unsigned_t<T>;
      U u = static_cast<U>(value);
      for (size_t i = 0; i < sizeof(U); ++i) bytes_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    }
  }
  // A length-prefixed (u32) byte string.
  void put_bytes(std::span<const uint8_t> data) {
    put(static_cast<uint32_t>(data.size()));
    bytes_.insert(bytes_.end(), data.begin(), data.end());
  }
  void put_bytes(const std::string& data) {
    put_bytes(std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> data) : data_(data) {}

  template <typename T>
  T get() {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    if (!take(sizeof(U))) return T{};
    U u = 0;
    for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(U{data_[pos_ - sizeof(U) + i]} << (8 * i));
    return static_cast<T>(u);
  }
  // A length-prefixed byte string of at most max_size_bytes.
  std::vector<uint8_t> get_bytes(size_t max_size_bytes) {
    uint32_t n = get<uint32_t>();
    if (n > max_size_bytes || !take(n)) {
      ok_ = false;
      return {};
    }
    return {data_.begin() + static_cast<ptrdiff_t>(pos_ - n), data_.begin() + static_cast<ptrdiff_t>(pos_)};
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }
  size_t remaining() const { return data_.size() - pos_; }
  void fail() { ok_ = false; }

 private:
  bool take(size_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace tandem::transport
