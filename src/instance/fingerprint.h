// The compatibility fingerprint of this instance's model and KV layout (what a
// peer must share before KV bytes may move between them).
#pragma once

#include "gguf/gguf.h"
#include "kv/kv_pool.h"
#include "transport/handshake.h"

namespace tandem::instance {

// Version of the block placement in kernels/kv_layout.h; bump when it changes.
constexpr int32_t kKvLayoutVersion = 2;

// The model hash covers the tensor table (names, types, shapes) and the first
// bytes of every tensor, so two files with the same shapes but other weights
// (another seed, another fine-tune) differ too.
uint64_t model_hash(const gguf::File& file);

transport::Fingerprint make_fingerprint(const gguf::File& file, const KvPoolShape& shape, pd::TransferMode mode);

}  // namespace tandem::instance
