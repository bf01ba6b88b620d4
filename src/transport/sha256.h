// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the transfer
// hand-shake's challenge and response: the cluster secret never crosses the
// wire, only a MAC over fresh nonces. Small and dependency-free on purpose
// (no crypto library is among tandem's dependencies).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tandem::transport {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  void update(std::string_view text);
  Digest finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(std::span<const uint8_t> bytes);

// Lower-case hexadecimal of bytes (digests in headers and logs).
std::string to_hex(std::span<const uint8_t> bytes);

// HMAC-SHA256 of the concatenation of `parts` under `key`.
Digest hmac_sha256(std::string_view key, std::initializer_list<std::span<const uint8_t>> parts);

}  // namespace tandem::transport
