#include "subprocess.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace tessera::testing {

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Started start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  Started s;
  s.started_at = now_s();
  s.pid = fork();
  if (s.pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  s.output_fd = fds[0];
  return s;
}

RunResult finish(const Started& s, double timeout_s) {
  RunResult r;
  char buf[4096];
  bool open = true;
  while (open) {
    double left = s.started_at + timeout_s - now_s();
    if (left <= 0) {
      r.timed_out = true;
      kill(-s.pid, SIGKILL);
      break;
    }
    pollfd p{s.output_fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min(left, 0.2) * 1000) + 1);
    if (ready > 0) {
      ssize_t n = read(s.output_fd, buf, sizeof(buf));
      if (n <= 0) open = false;
      else r.output.append(buf, n);
    }
  }
  close(s.output_fd);
  int status = 0;
  waitpid(s.pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = now_s() - s.started_at;
  return r;
}

RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, double timeout_s) {
  return finish(start(argv, env), timeout_s);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TempDir::TempDir() {
  char pattern[] = "/tmp/tessera_test_XXXXXX";
  const char* made = ::mkdtemp(pattern);
  if (!made) throw std::runtime_error("TempDir: mkdtemp failed");
  path = made;
}

TempDir::~TempDir() {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ::unlink(file(e->d_name).c_str());
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

// The kernel's ephemeral ports [low, high] (ip_local_port_range), which outgoing connections take.
static std::pair<int, int> ephemeral_ports() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  in >> low >> high;
  return {low, high};
}

// A port below the ephemeral range: one the kernel hands out (bind to port 0) can be taken as the
// local end of another test's connection before the job listens on it ("Address already in use"),
// while ports below the range are only ever taken by a bind. Random, and bindable now.
int free_port() {
  const int below = ephemeral_ports().first;
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, std::max(10001, below - 1));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(random);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("free_port: socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(port));
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (bound) return port;
  }
  throw std::runtime_error("free_port: no port below the ephemeral range could be bound in 200 tries");
}

}  // namespace tessera::testing
