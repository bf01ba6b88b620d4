// The KV cache memory of one instance: one contiguous allocation, block-major.
//
// Block b holds every layer's K and V for block_size consecutive token slots:
//   block b = [layer 0: K part, V part][layer 1: ...]...
// so moving a request's KV to another instance is one copy (one RMA operation
// later) per block, not one per block per layer. A part holds block_size x
// kv_dim elements of the pool dtype (kv_dim = n_kv_heads * head_dim), laid out
// per head as kernels/kv_layout.h says (K transposed).
//
// A hybrid model's recurrent layers keep no KV: their state lives beside the
// blocks, n_state_slots slots of state_slot_bytes each, one per live sequence
// (the model lays a slot out; kv/state_slots.h hands slots out). The slots
// are the tail of the same registered mapping, each spanning
// state_slot_blocks() whole block-sized units numbered after the last block:
// to the P/D transport a slot is more blocks of the request, so the state
// moves with the KV by the same rules (no reuse before Free, quarantine when
// a peer may still reach it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dtype.h"

namespace tandem {

struct KvPoolShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // token slots per block
  kernels::DType dtype = kernels::DType::kF16;
  int64_t n_blocks = 0;
  int64_t n_state_slots = 0;   // recurrent-state slots (0: the model has none)
  size_t state_slot_bytes = 0;
};

// Where a pool's memory lives: anonymous (one process), or a file in
// /dev/shm that the tensor-parallel workers map too (each writes its own KV
// heads; the layout is the same whatever the split, so the P/D transport
// moves a TP instance's blocks as any other's).
struct KvPoolBacking {
  std::string shared_path;  // empty: anonymous
  bool create = true;       // create (and size) the file, else map an existing one
};

class KvPool {
 public:
  explicit KvPool(const KvPoolShape& shape, const KvPoolBacking& backing = {});
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvPoolShape& shape() const { return shape_; }
  size_t block_bytes() const { return block_bytes_; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }

  uint8_t* block(int32_t b);
  // A layer's K and V parts of a block.
  uint8_t* k_part(int32_t block, int layer);
  uint8_t* v_part(int32_t block, int layer);
  // The view attention needs for one layer.
  kernels::PagedKvLayer layer_view(int layer) const;

  // Recurrent-state slot `slot`: state_slot_bytes at block id state_slot_block(slot).
  uint8_t* state_slot(int32_t slot);
  // Block-sized units per state slot (0 without slots).
  int32_t state_slot_blocks() const { return state_slot_blocks_; }
  // The block ids a slot spans for a transfer: [first, first + state_slot_blocks()).
  int32_t state_slot_block(int32_t slot) const;
  // The slot whose span holds block id `block` (>= n_blocks), or -1 for a KV block.
  int32_t slot_of_block(int32_t block) const;
  // What the transport registers: the KV blocks and the state slots after them.
  int64_t n_transfer_blocks() const { return shape_.n_blocks + shape_.n_state_slots * state_slot_blocks_; }
  size_t transfer_bytes() const { return block_bytes_ * static_cast<size_t>(n_transfer_blocks()); }

  // Bytes needed per block for a shape (used to size the pool from a memory budget).
  static size_t bytes_per_block(const KvPoolShape& shape);

 private:
  KvPoolShape shape_;
  size_t part_bytes_ = 0;  // one layer's K (or V) part of a block
  size_t block_bytes_ = 0;
  int32_t state_slot_blocks_ = 0;
  uint8_t* data_ = nullptr;
};

// A minimal free-list allocator over a pool's blocks, for tests and the CLI.
// The serving engine has its own reference-counted block manager.
class SimpleBlockAllocator {
 public:
  explicit SimpleBlockAllocator(int64_t n_blocks);
  // Takes n blocks (lowest ids first unless shuffled); throws tandem::Error when
  // fewer than n are free.
  std::vector<int32_t> allocate(int64_t n);
  void free(const std::vector<int32_t>& blocks);
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  // Reorders the free list with a seeded shuffle, so tests can scatter blocks.
  void shuffle(uint64_t seed);

 private:
  std::vector<int32_t> free_;  // used as a stack: back() is handed out next
  std::vector<bool> in_use_;
};

}  // namespace tandem
