#include "cli/tensor_wire.h"

#include <cstring>

#include "util/error.h"

namespace tandem::cli {

namespace {

void put(std::vector<uint8_t>& out, int32_t v) {
  const size_t at = out.size();
  out.resize(at + sizeof(v));
  std::memcpy(out.data() + at, &v, sizeof(v));
}

void put_all(std::vector<uint8_t>& out, const std::vector<int32_t>& v) {
  put(out, static_cast<int32_t>(v.size()));
  const size_t at = out.size();
  out.resize(at + v.size() * sizeof(int32_t));
  if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(int32_t));
}

struct Reader {
  std::span<const uint8_t> in;
  size_t at = 0;
  int32_t get() {
    if (at + sizeof(int32_t) > in.size()) throw Error("a truncated tensor-parallel step message");
    int32_t v;
    std::memcpy(&v, in.data() + at, sizeof(v));
    at += sizeof(v);
    return v;
  }
  std::vector<int32_t> get_all() {
    const int32_t n = get();
    if (n < 0 || at + static_cast<size_t>(n) * sizeof(int32_t) > in.size())
      throw Error("a tensor-parallel step message with a bad length");
    std::vector<int32_t> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), in.data() + at, v.size() * sizeof(int32_t));
    at += v.size() * sizeof(int32_t);
    return v;
  }
};

}  // namespace

std::vector<uint8_t> encode_batch(const Batch& b) {
  std::vector<uint8_t> out;
  put_all(out, b.tokens);
  put_all(out, b.positions);
  put_all(out, b.logit_rows);
  put(out, static_cast<int32_t>(b.sequences.size()));
  for (const BatchSequence& s : b.sequences) {
    put(out, s.first_row);
    put(out, s.n_tokens);
    put(out, s.state_slot);
    put_all(out, s.block_table);
  }
  return out;
}

Batch decode_batch(std::span<const uint8_t> bytes) {
  Reader r{bytes};
  Batch b;
  b.tokens = r.get_all();
  b.positions = r.get_all();
  b.logit_rows = r.get_all();
  const int32_t n = r.get();
  if (n < 0 || n > static_cast<int32_t>(b.tokens.size())) throw Error("a tensor-parallel step message with a bad sequence count");
  for (int32_t i = 0; i < n; ++i) {
    BatchSequence s;
    s.first_row = r.get();
    s.n_tokens = r.get();
    s.state_slot = r.get();
    s.block_table = r.get_all();
    b.sequences.push_back(std::move(s));
  }
  if (r.at != bytes.size()) throw Error("a tensor-parallel step message with trailing bytes");
  return b;
}

uint64_t max_batch_bytes(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq) {
  const auto n = static_cast<uint64_t>(4 + 2 * max_tokens + max_seqs + max_seqs * (4 + max_blocks_per_seq));
  return n * sizeof(int32_t);
}

}  // namespace tandem::cli
