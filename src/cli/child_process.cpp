#include "cli/child_process.h"

#include <sys/prctl.h>
#include <unistd.h>

#include "util/error.h"

extern char** environ;

namespace tandem::cli {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  buf[n] = 0;
  return buf;
}

pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                  int parent_death_signal) {
  std::vector<std::string> arg_strings = args;
  std::vector<char*> argv;
  for (std::string& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = extra_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const std::string& x : extra_env) replaced = replaced || entry.rfind(x.substr(0, x.find('=') + 1), 0) == 0;
    if (!replaced) env_strings.push_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  sigset_t none;
  sigemptyset(&none);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("cannot start " + args.at(0) + ": fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, parent_death_signal);
    if (::getppid() != parent) ::_exit(1);  // the parent died before the line above
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace tandem::cli
