#include "util/shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem {

void* map_shared_file(const std::string& path, size_t bytes, bool create, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0600);
  if (fd < 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st{};
  if (create ? ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 : ::fstat(fd, &st) != 0) {
    *error = "cannot size " + path + ": " + std::strerror(errno);
    ::close(fd);
    return nullptr;
  }
  if (!create && static_cast<size_t>(st.st_size) < bytes) {
    *error = path + " holds " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(bytes) + " expected";
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = "cannot map " + path + ": " + std::strerror(err);
    return nullptr;
  }
  return p;
}

}  // namespace tandem
