// Test helpers for the http tests: a blocking raw TCP client (to send exactly the bytes we want
// and see exactly what comes back) and a Parker that collects writers from handlers that do not
// answer, so a test can wait until N requests are in flight and then answer them.
#ifndef SLIME_TESTS_HTTP_TEST_SUPPORT_H_
#define SLIME_TESTS_HTTP_TEST_SUPPORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slime/http/response_writer.h"
#include "slime/http/router.h"

namespace slime::http::testing {

// A blocking socket to 127.0.0.1:port. Reads give up after 10 s (a failure guard, never a
// synchronization device) and then return what they have.
class RawSocket {
 public:
  explicit RawSocket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Close();
  }
  ~RawSocket() { Close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One response: head, then a Content-Length body, a chunked body (returned de-chunked), or
  // (neither, and not 1xx/HEAD-like) everything until the server closes. "" on EOF/timeout.
  // `head_only`: the request was HEAD, so there is no body whatever the headers say.
  std::string ReadResponse(bool head_only = false) {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return "";
    }
    std::string head = buffer_.substr(0, end + 4);
    buffer_.erase(0, end + 4);
    if (head_only || head.starts_with("HTTP/1.1 1")) return head;
    if (size_t pos = head.find("Content-Length: "); pos != std::string::npos) {
      size_t length = std::stoul(head.substr(pos + 16));
      while (buffer_.size() < length) {
        if (!Fill()) return "";
      }
      std::string body = buffer_.substr(0, length);
      buffer_.erase(0, length);
      return head + body;
    }
    if (head.find("Transfer-Encoding: chunked") != std::string::npos) {
      std::string body;
      for (;;) {
        size_t eol;
        while ((eol = buffer_.find("\r\n")) == std::string::npos) {
          if (!Fill()) return "";
        }
        size_t size = std::stoul(buffer_.substr(0, eol), nullptr, 16);
        while (buffer_.size() < eol + 2 + size + 2) {
          if (!Fill()) return "";
        }
        body += buffer_.substr(eol + 2, size);
        buffer_.erase(0, eol + 2 + size + 2);
        if (size == 0) return head + body;
      }
    }
    return head + ReadUntilClose();
  }

  // Everything until EOF (or the 10 s guard).
  std::string ReadUntilClose() {
    while (Fill()) {
    }
    std::string out = std::move(buffer_);
    buffer_.clear();
    return out;
  }

  // True when the server has closed the connection (EOF or reset) and nothing is buffered.
  bool ServerClosed() {
    if (!buffer_.empty()) return false;
    return !Fill() && buffer_.empty();
  }

 private:
  bool Fill() {
    char chunk[16384];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buffer_;
};

// The body of a raw response (after the blank line).
inline std::string BodyOf(const std::string& response) {
  size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

// A handler that parks every request's writer; tests wait for N and answer them.
class Parker {
 public:
  Handler handler() {
    return [this](const Request& request, std::shared_ptr<ResponseWriter> writer) {
      std::lock_guard<std::mutex> lock(mu_);
      parked_.emplace_back(request, std::move(writer));
      cv_.notify_all();
    };
  }
  // Waits until `n` requests are parked; false after `limit` (a failure guard).
  bool WaitFor(size_t n, std::chrono::seconds limit = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return parked_.size() >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return parked_.size();
  }
  std::vector<std::pair<Request, std::shared_ptr<ResponseWriter>>> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(parked_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<Request, std::shared_ptr<ResponseWriter>>> parked_;
};

// Threads of this process, from /proc/self/task.
inline size_t CountThreads() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

}  // namespace slime::http::testing

#endif  // SLIME_TESTS_HTTP_TEST_SUPPORT_H_
