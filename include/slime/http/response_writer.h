// ResponseWriter: how a handler answers one request — a complete response (Send) or a chunked
// stream (StartStream, Write..., Finish) such as Server-Sent Events.
//
// Ownership: shared. The server creates one writer per request and hands a shared_ptr to the
// handler, which may keep it and answer later from another thread. The writer keeps its
// connection object alive (not the socket: a disconnect closes that regardless).
//
// Threads: every method may be called from any thread. Calls are serialized by the writer's
// mutex and their bytes reach the socket in call order (the connection writes them on its
// strand). Nothing blocks on the network: Write queues the chunk and returns (there is no
// back-pressure beyond the socket buffers; a streaming producer that must not outrun a slow
// client should pace itself).
//
// Life cycle: New -> Send -> Done, or New -> StartStream -> Write* -> Finish -> Done.
// A call out of order (a second Send, Write before StartStream) is logged and ignored.
// If the last reference is dropped before Done, the destructor completes the response:
// a 500 if nothing was sent yet, the terminating chunk for an open stream.
//
// HEAD: the server routes HEAD to the GET handler when no HEAD route exists; the writer then
// sends the status and headers (Send: with the Content-Length the body would have) and no
// body bytes. A HEAD stream is complete once its headers are sent; later Writes are dropped.
//
// HTTP/1.0 clients get `Connection: close` unless they asked for keep-alive, and a stream is
// sent as a raw body ended by closing the connection (1.0 has no chunked encoding).
#ifndef SLIME_HTTP_RESPONSE_WRITER_H_
#define SLIME_HTTP_RESPONSE_WRITER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "nlohmann/json.hpp"

namespace slime::http {

// The transport under a writer: implemented by the server's connections (and by test fakes).
// Enqueue may be called from any thread; the bytes of one connection are written in the order
// of the Enqueue calls. `last` marks the end of the response; `close_after` asks the transport
// to close the connection once those bytes are out.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Enqueue(uint64_t request_seq, std::string bytes, bool last, bool close_after) = 0;
};

class ResponseWriter {
 public:
  // What the writer must know about the request it answers.
  struct Context {
    uint64_t request_seq = 0;  // echoed to the sink, so it can drop a stale writer's bytes
    std::string method = "GET";
    std::string path = "/";
    int version = 11;        // 10 or 11
    bool keep_alive = true;  // the request allows the connection to stay open
    std::string server_name = "slime-cpp";
  };

  // Created by the server (or a test with a fake sink).
  ResponseWriter(std::shared_ptr<ResponseSink> sink, Context context);
  ~ResponseWriter();
  ResponseWriter(const ResponseWriter&) = delete;
  ResponseWriter& operator=(const ResponseWriter&) = delete;

  // Adds a response header (e.g. Retry-After, Allow) to the response not yet started.
  // Content-Length, Transfer-Encoding and Connection are managed by the writer.
  void SetHeader(std::string name, std::string value);

  // A complete response with Content-Length. Status must be 100..599 (else sent as 500).
  void Send(int status, std::string body, std::string content_type = "application/json");
  void SendJson(int status, const nlohmann::json& body);

  // Sends status and headers now; the body follows as chunks (Transfer-Encoding: chunked).
  void StartStream(int status = 200, std::string content_type = "text/event-stream");
  // Queues one chunk (an empty string sends nothing). False once the client is gone (or the
  // writer is not streaming); the caller should then stop producing.
  bool Write(std::string data);
  // Sends the terminating chunk; the connection then serves its next keep-alive request.
  void Finish();

  // The client disconnected (or the server stopped) before the response was completely sent.
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Send or Finish has been called (the response is complete from the handler's side).
  bool answered() const { return answered_.load(std::memory_order_acquire); }
  // Status and headers have been committed (Send or StartStream was called).
  bool started() const;

  // `fn` runs once, on an I/O thread, if the client disconnects (or the server stops) before
  // Send/Finish was called; immediately on the calling thread if that already happened.
  // A later OnClose replaces an earlier, not yet called, one.
  void OnClose(std::function<void()> fn);

  // Called by the transport (on its I/O thread) when the connection is gone.
  void NotifyClosed();

  const Context& context() const { return context_; }

 private:
  enum class State { kNew, kStreaming, kDone };

  std::string Head(int status, std::string_view content_type, bool chunked, bool close,
                   const size_t* content_length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLocked(int status, std::string body, std::string content_type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<ResponseSink> sink_;
  const Context context_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> answered_{false};
  mutable std::mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  bool stream_closes_ ABSL_GUARDED_BY(mu_) = false;  // HTTP/1.0 stream: end = close
  std::vector<std::pair<std::string, std::string>> headers_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_close_ ABSL_GUARDED_BY(mu_);
};

// The reason phrase for a status code ("OK", "Not Found"; "Unknown" for unlisted codes).
std::string_view ReasonPhrase(int status);

}  // namespace slime::http

#endif  // SLIME_HTTP_RESPONSE_WRITER_H_
