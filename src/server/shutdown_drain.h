// The drain a server runs on SIGTERM, once it has stopped admitting (its
// caller does that): requests in flight go on for a bounded time, then
// each is cut off with an error its client sees. Shared by `tandem serve`
// and `tandem router`.
#pragma once

#include <cstdint>
#include <string>

#include "util/function_ref.h"

namespace tandem::server {

// Waits until in_flight() is 0 or timeout_s have passed. Requests left then
// are cut off: cut_off(why) with why = "the <what> shut down before this
// request finished (--shutdown-timeout N s)", then a wait of at most 5 s for
// their responses to end. `log_prefix` starts the line it prints (e.g.
// "tandem router").
void drain_then_cut_off(const char* log_prefix, const char* what, int timeout_s, FunctionRef<int64_t()> in_flight,
                        FunctionRef<void(const std::string&)> cut_off);

}  // namespace tandem::server
