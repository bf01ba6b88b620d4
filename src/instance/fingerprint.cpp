#include "instance/fingerprint.h"

#include <algorithm>
#include <cstring>

#include "transport/sha256.h"

namespace tandem::instance {

uint64_t model_hash(const gguf::File& file) {
  constexpr uint64_t kSampleBytes = 256;
  transport::Sha256 h;
  for (const gguf::TensorInfo& t : file.tensors()) {
    h.update(t.name);
    h.update(std::to_string(static_cast<int>(t.type)) + ":" + t.shape_string() + ";");
    if (t.data != nullptr) h.update(std::span(t.data, std::min(t.n_bytes, kSampleBytes)));
  }
  transport::Digest d = h.finish();
  uint64_t v = 0;
  std::memcpy(&v, d.data(), sizeof(v));
  return v;
}

transport::Fingerprint make_fingerprint(const gguf::File& file, const KvPoolShape& shape, pd::TransferMode mode) {
  transport::Fingerprint f;
  f.model_hash = model_hash(file);
  f.kv_dtype = static_cast<uint8_t>(shape.dtype);
  f.block_size = shape.block_size;
  f.kv_layout = kKvLayoutVersion;
  f.n_layers = shape.n_layers;
  f.n_kv_heads = shape.n_kv_heads;
  f.head_dim = shape.head_dim;
  f.mode = mode;
  return f;
}

}  // namespace tandem::instance
