#include "cli/tensor_wire.h"

#include <cstring>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <type_traits>

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
  put_all(out, b.block_copies);
  put_all(out, b.state_copies);
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
  b.block_copies = r.get_all();
  b.state_copies = r.get_all();
  if (b.block_copies.size() % 2 != 0 || b.state_copies.size() % 2 != 0)
    throw Error("a tensor-parallel step message with an odd copy list");
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
  const auto n = static_cast<uint64_t>(6 + 2 * max_tokens + 5 * max_seqs + max_seqs * (4 + max_blocks_per_seq));
  return n * sizeof(int32_t);
}

namespace {

// The status fields that travel, in this order.
template <typename F>
void each_status_field(WorkerStatus& s, F f) {
  f(s.pid), f(s.phase), f(s.step_id), f(s.steps_done), f(s.op_kind), f(s.op_seq), f(s.op_since_ns), f(s.op_arrived),
      f(s.op_data_phase), f(s.ops), f(s.gathers), f(s.gather_bytes), f(s.gather_ns), f(s.consensus_ns), f(s.step_ns);
}
constexpr size_t kStatusFields = 15;
constexpr size_t kOpSinceField = 6;  // sent as an age: the two hosts' monotonic clocks differ

}  // namespace

std::vector<uint8_t> encode_status(const WorkerStatus& s, int64_t now_ns) {
  std::vector<uint8_t> out;
  out.reserve(kStatusFields * sizeof(int64_t));
  each_status_field(const_cast<WorkerStatus&>(s), [&](auto& field) {
    const auto v = static_cast<int64_t>(field.load());
    const size_t at = out.size();
    out.resize(at + sizeof(v));
    std::memcpy(out.data() + at, &v, sizeof(v));
  });
  const int64_t age = s.op_kind.load() == 0 ? 0 : now_ns - s.op_since_ns.load();
  std::memcpy(out.data() + kOpSinceField * sizeof(int64_t), &age, sizeof(age));
  return out;
}

void decode_status(std::span<const uint8_t> bytes, WorkerStatus& into, int64_t arrived_ns) {
  if (bytes.size() != kStatusFields * sizeof(int64_t)) throw Error("a tensor-parallel status message of the wrong size");
  size_t at = 0;
  each_status_field(into, [&](auto& field) {
    int64_t v = 0;
    std::memcpy(&v, bytes.data() + at, sizeof(v));
    at += sizeof(v);
    using T = typename std::remove_reference_t<decltype(field)>::value_type;
    field.store(static_cast<T>(v));
  });
  int64_t age = 0;
  std::memcpy(&age, bytes.data() + kOpSinceField * sizeof(int64_t), sizeof(age));
  into.op_since_ns.store(arrived_ns - age);
  into.heartbeat_ns.store(arrived_ns);
}

std::vector<uint8_t> encode_job(const TensorJob& j) {
  std::string s;
  const auto kv = [&](const char* k, const std::string& v) { s += std::string(k) + "=" + v + "\n"; };
  kv("model_path", j.model_path);
  kv("model_hash", std::to_string(j.model_hash));
  kv("rank", std::to_string(j.rank));
  kv("size", std::to_string(j.size));
  kv("generation", std::to_string(j.generation));
  kv("threads", std::to_string(j.threads));
  kv("rendezvous_dir", j.rendezvous_dir);
  kv("shared_memory_frames", j.shared_memory_frames ? "1" : "0");
  kv("block_size", std::to_string(j.block_size));
  kv("kv_blocks", std::to_string(j.kv_blocks));
  kv("state_slots", std::to_string(j.state_slots));
  kv("timeout_ms", std::to_string(j.timeout_ms));
  kv("kv_dtype", j.kv_dtype);
  return {s.begin(), s.end()};
}

TensorJob decode_job(std::span<const uint8_t> bytes) {
  std::map<std::string, std::string> f;
  const std::string s(bytes.begin(), bytes.end());
  for (size_t at = 0; at < s.size();) {
    const size_t nl = s.find('\n', at);
    const std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? s.size() : nl + 1;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw Error("a tensor-parallel job with a malformed line");
    f[line.substr(0, eq)] = line.substr(eq + 1);
  }
  const auto text = [&](const char* k) {
    auto it = f.find(k);
    if (it == f.end()) throw Error(std::string("a tensor-parallel job without ") + k);
    return it->second;
  };
  const auto number = [&](const char* k, int64_t lo, int64_t hi) {
    const std::string v = text(k);
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || n < lo || n > hi)
      throw Error(std::string("a tensor-parallel job with a bad ") + k + ": '" + v + "'");
    return static_cast<int64_t>(n);
  };
  TensorJob j;
  j.dir.clear();
  j.model_path = text("model_path");
  j.model_hash = std::strtoull(text("model_hash").c_str(), nullptr, 10);
  j.size = static_cast<int>(number("size", 2, 64));
  j.rank = static_cast<int>(number("rank", 0, j.size - 1));
  j.generation = static_cast<int>(number("generation", 1, int64_t{1} << 30));
  j.threads = static_cast<int>(number("threads", 1, 4096));
  j.rendezvous_dir = text("rendezvous_dir");
  j.shared_memory_frames = number("shared_memory_frames", 0, 1) == 1;
  j.block_size = static_cast<int>(number("block_size", 1, 4096));
  j.kv_blocks = number("kv_blocks", 1, int64_t{1} << 32);
  j.state_slots = number("state_slots", 0, int64_t{1} << 20);
  j.timeout_ms = number("timeout_ms", 1, int64_t{1} << 32);
  j.kv_dtype = text("kv_dtype");
  return j;
}

}  // namespace tandem::cli
