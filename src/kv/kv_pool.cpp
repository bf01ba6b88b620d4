#include "kv/kv_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <string>

#include "util/error.h"
#include "util/shared_file.h"

namespace tandem {

namespace {

// One layer's K (or V) part of a block: block_size tokens of kv_dim elements.
size_t part_bytes(const KvPoolShape& s) {
  return kernels::dtype_row_bytes(s.dtype, static_cast<int64_t>(s.n_kv_heads) * s.head_dim) *
         static_cast<size_t>(s.block_size);
}

}  // namespace

size_t KvPool::bytes_per_block(const KvPoolShape& s) { return part_bytes(s) * 2 * static_cast<size_t>(s.n_layers); }

namespace {

// An anonymous mapping of n bytes: page-aligned (ready to register for RMA)
// and zeroed, every page backed now. Huge pages where the kernel has them
// (attention reads short pieces of many blocks). Backing every page now
// matters: otherwise each step that writes into untouched pages takes a page
// fault and a page clear per page, inside the forward pass (small F16, 64
// sequences: about 9 ms of a 150 ms step in the QKV epilogue), and a pool the
// machine cannot back fails later instead of at start.
uint8_t* map_backed(size_t n, const std::string& what) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error("cannot allocate the " + what + " (" + std::to_string(n >> 20) + " MiB): lower the block count");
  auto* data = static_cast<uint8_t*>(p);
  (void)madvise(p, n, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return data;
  if (errno != EINVAL) {  // (EINVAL: a kernel before 5.14, touched below)
    munmap(p, n);
    throw Error("cannot back the " + what + " (" + std::to_string(n >> 20) +
                " MiB) with memory: lower the block count or the KV cache size");
  }
#endif
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t off = 0; off < n; off += static_cast<size_t>(page)) data[off] = 0;
  return data;
}

// The same, MAP_SHARED over a file: created and sized (then backed like the
// anonymous one), or an existing one of that size mapped.
uint8_t* map_shared(size_t n, const KvPoolBacking& b) {
  std::string error;
  void* p = map_shared_file(b.shared_path, n, b.create, &error);
  if (p == nullptr)
    throw Error("the shared KV pool (" + std::to_string(n >> 20) + " MiB; is /dev/shm large enough?): " + error);
#ifdef MADV_POPULATE_WRITE
  if (b.create && madvise(p, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    munmap(p, n);
    throw Error("cannot back the shared KV pool (" + std::to_string(n >> 20) + " MiB) with memory: lower the KV cache size");
  }
#endif
  return static_cast<uint8_t*>(p);
}

}  // namespace

KvPool::KvPool(const KvPoolShape& shape, const KvPoolBacking& backing) : shape_(shape) {
  if (!kernels::is_float_dtype(shape.dtype)) throw Error("the KV cache dtype must be f32, f16 or bf16");
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size <= 0 ||
      shape.n_blocks <= 0 || shape.n_state_slots < 0 || (shape.n_state_slots > 0 && shape.state_slot_bytes == 0))
    throw Error("KV pool shape must be positive in every dimension");
  part_bytes_ = part_bytes(shape);
  block_bytes_ = bytes_per_block(shape);
  if (shape.n_state_slots > 0)
    state_slot_blocks_ = static_cast<int32_t>((shape.state_slot_bytes + block_bytes_ - 1) / block_bytes_);
  data_ = backing.shared_path.empty() ? map_backed(transfer_bytes(), "KV pool") : map_shared(transfer_bytes(), backing);
}

KvPool::~KvPool() {
  if (data_ != nullptr) munmap(data_, transfer_bytes());
}

int32_t KvPool::state_slot_block(int32_t slot) const {
  TANDEM_ASSERT(slot >= 0 && slot < shape_.n_state_slots, "state slot out of range");
  return static_cast<int32_t>(shape_.n_blocks + static_cast<int64_t>(slot) * state_slot_blocks_);
}

int32_t KvPool::slot_of_block(int32_t block) const {
  TANDEM_ASSERT(block >= 0 && block < n_transfer_blocks(), "block id out of range");
  if (block < shape_.n_blocks) return -1;
  return static_cast<int32_t>((block - shape_.n_blocks) / state_slot_blocks_);
}

uint8_t* KvPool::state_slot(int32_t slot) {
  return data_ + static_cast<size_t>(state_slot_block(slot)) * block_bytes_;
}

uint8_t* KvPool::block(int32_t b) {
  TANDEM_ASSERT(b >= 0 && b < shape_.n_blocks, "block id out of range");
  return data_ + static_cast<size_t>(b) * block_bytes_;
}

uint8_t* KvPool::k_part(int32_t b, int layer) {
  TANDEM_ASSERT(layer >= 0 && layer < shape_.n_layers);
  return block(b) + static_cast<size_t>(layer) * 2 * part_bytes_;
}

uint8_t* KvPool::v_part(int32_t b, int layer) { return k_part(b, layer) + part_bytes_; }

kernels::PagedKvLayer KvPool::layer_view(int layer) const {
  kernels::PagedKvLayer v;
  v.base = data_;
  v.block_bytes = block_bytes_;
  v.k_offset = static_cast<size_t>(layer) * 2 * part_bytes_;
  v.v_offset = v.k_offset + part_bytes_;
  v.block_size = shape_.block_size;
  v.dtype = shape_.dtype;
  return v;
}

SimpleBlockAllocator::SimpleBlockAllocator(int64_t n_blocks) : in_use_(static_cast<size_t>(n_blocks), false) {
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::vector<int32_t> SimpleBlockAllocator::allocate(int64_t n) {
  if (n > n_free())
    throw Error("KV pool exhausted: " + std::to_string(n) + " blocks needed, " + std::to_string(n_free()) +
                " free; raise the block count or shorten the request");
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    TANDEM_ASSERT(!in_use_[static_cast<size_t>(b)]);
    in_use_[static_cast<size_t>(b)] = true;
    out.push_back(b);
  }
  return out;
}

void SimpleBlockAllocator::free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    TANDEM_ASSERT(b >= 0 && static_cast<size_t>(b) < in_use_.size() && in_use_[static_cast<size_t>(b)],
                  "double free of KV block " + std::to_string(b));
    in_use_[static_cast<size_t>(b)] = false;
    free_.push_back(b);
  }
}

void SimpleBlockAllocator::shuffle(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::shuffle(free_.begin(), free_.end(), rng);
}

}  // namespace tandem
