// Starting a child tandem process (the cluster's instances, a host's
// data-parallel ranks): fork and exec with everything built before the
// fork (a child of a multi-threaded process may not allocate before exec),
// the parent's blocked signals unblocked, and the child bound to die with
// its parent, however the parent ends.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace tandem::cli {

// This program's path (from /proc/self/exe); throws Error if unknown.
std::string self_exe();

// args[0] is the program; `extra_env` entries ("NAME=value") are added to
// (or replace those of) this process's environment. Throws Error if fork fails.
pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {},
                  int parent_death_signal = SIGTERM);

}  // namespace tandem::cli
