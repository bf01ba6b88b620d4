// Where the engine's forward passes run when not on its own thread pool:
// tensor parallelism hands each step to worker processes (cli/tensor_parallel.h).
// The engine core keeps the scheduler, the KV accounting and sampling; an
// executor runs the batch over the engine's KV pool (which its workers map)
// and returns the logits.
#pragma once

#include <stdexcept>
#include <string>

#include "model/batch.h"

namespace tandem {

// A step the executor could not run: its requests fail with this message;
// the executor recovers by itself (ready() says when it can serve again).
class ExecutorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  // Runs `batch` and stores the logits of batch.logit_rows, in order, into
  // `logits` (logit_rows.size() x n_vocab floats). Throws ExecutorError.
  // Called on the engine thread only.
  virtual void forward(const Batch& batch, float* logits) = 0;
  // Thread-safe: whether it can run a step now; else *why says why.
  virtual bool ready(std::string* why) const = 0;
  // On the engine thread, when it has no step to run: a chance to recover
  // (restart workers) without a request waiting on it.
  virtual void idle() {}
  // On the engine thread, after forward() or idle(): true once (then reset)
  // when the KV of every block was lost with a worker that was replaced; the
  // engine then fails every live request and forgets its prefix cache.
  virtual bool take_kv_lost() { return false; }
};

}  // namespace tandem
