// A directory for the files one test process generates (tiny models, split
// parts), removed when the process exits. ctest runs every test case as a
// process of its own, so a directory per process that nobody removes is a few
// megabytes left in /tmp per test case, gigabytes per CI run.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

namespace tandem::testing {

inline const std::filesystem::path& process_scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    pid_t owner = ::getpid();
    Dir() {
      path = std::filesystem::temp_directory_path() / ("tandem-test-" + std::to_string(owner));
      std::filesystem::remove_all(path);  // a reused pid's leftovers from a killed run
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      // Only the creating process: a forked child that returned through exit()
      // instead of _exit() must not delete its parent's files.
      std::error_code ignored;
      if (::getpid() == owner) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

}  // namespace tandem::testing
