#include "slime/runtime/rpc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "fmt/format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace slime::runtime {

std::string GenerateToken() {
  std::random_device rd;  // reads the kernel's random source on Linux
  std::string token;
  for (int i = 0; i < 8; ++i) token += fmt::format("{:08x}", rd());
  return token;
}

grpc::Status Authorize(const grpc::CallbackServerContext* context, const std::string& token) {
  const auto& md = context->client_metadata();
  auto it = md.find(kTokenMetadataKey);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        fmt::format("missing job token (metadata '{}')", kTokenMetadataKey));
  }
  const grpc::string_ref& got = it->second;
  // Constant-time comparison over the expected length.
  unsigned diff = got.size() == token.size() ? 0u : 1u;
  for (size_t i = 0; i < token.size(); ++i) {
    const char c = i < got.size() ? got.data()[i] : 0;
    diff |= static_cast<unsigned>(c ^ token[i]);
  }
  if (diff != 0) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong job token");
  return grpc::Status::OK;
}

std::unique_ptr<grpc::ClientContext> MakeContext(const std::string& token,
                                                 std::chrono::milliseconds timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata(kTokenMetadataKey, token);
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  return context;
}

namespace {

StatusOr<std::string> ReadPem(const char* variable, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(fmt::format("{}={}: cannot read the file", variable, path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(fmt::format("{}={}: not a PEM file", variable, path));
  }
  return text.str();
}

StatusOr<RpcTls> ReadTlsEnvironment() {
  RpcTls tls;
  const char* names[] = {kTlsCaEnv, kTlsCertEnv, kTlsKeyEnv};
  std::string values[3];
  int set = 0;
  for (int i = 0; i < 3; ++i) {
    const char* v = std::getenv(names[i]);
    if (v != nullptr && *v != '\0') {
      values[i] = v;
      ++set;
    }
  }
  const char* mutual = std::getenv(kTlsMutualEnv);
  const std::string m = mutual != nullptr ? mutual : "";
  if (!m.empty() && m != "0" && m != "1") {
    return absl::InvalidArgumentError(fmt::format("{}={}: expected 0 or 1", kTlsMutualEnv, m));
  }
  if (set == 0) {
    if (m == "1") {
      return absl::InvalidArgumentError(fmt::format(
          "{}=1 needs {}, {} and {} (PEM files)", kTlsMutualEnv, kTlsCaEnv, kTlsCertEnv, kTlsKeyEnv));
    }
    return tls;  // plaintext
  }
  for (int i = 0; i < 3; ++i) {
    if (values[i].empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "TLS for the runtime's gRPC needs {}, {} and {} together; {} is not set", kTlsCaEnv,
          kTlsCertEnv, kTlsKeyEnv, names[i]));
    }
  }
  SLIME_ASSIGN_OR_RETURN(tls.ca_pem, ReadPem(kTlsCaEnv, values[0]));
  SLIME_ASSIGN_OR_RETURN(tls.cert_pem, ReadPem(kTlsCertEnv, values[1]));
  SLIME_ASSIGN_OR_RETURN(tls.key_pem, ReadPem(kTlsKeyEnv, values[2]));
  tls.enabled = true;
  tls.mutual = m == "1";
  return tls;
}

}  // namespace

const StatusOr<RpcTls>& ProcessTls() {
  static const StatusOr<RpcTls>* tls = new StatusOr<RpcTls>(ReadTlsEnvironment());
  return *tls;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const RpcOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Reconnect quickly after a worker restarts on a new port or a peer comes back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  const StatusOr<RpcTls>& tls = ProcessTls();
  if (!tls.ok() || !tls->enabled) {
    // With a TLS error the server side of this process failed already; a plaintext channel to a
    // TLS server fails its calls (UNAVAILABLE), never silently downgrades one.
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls->ca_pem;
  if (tls->mutual) {
    ssl.pem_private_key = tls->key_pem;
    ssl.pem_cert_chain = tls->cert_pem;
  }
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& host, int port,
                                                    const std::vector<grpc::Service*>& services,
                                                    const RpcOptions& options,
                                                    std::string* bound_address) {
  if (options.token.empty()) return absl::InvalidArgumentError("runtime: empty job token");
  grpc::ServerBuilder builder;
  int selected_port = 0;
  const std::string listen =
      host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                          : fmt::format("{}:{}", host, port);
  const StatusOr<RpcTls>& tls = ProcessTls();
  if (!tls.ok()) return tls.status();
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls->enabled) {
    grpc::SslServerCredentialsOptions ssl(
        tls->mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_root_certs = tls->ca_pem;
    ssl.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  builder.AddListeningPort(listen, credentials, &selected_port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || selected_port == 0) {
    return absl::UnavailableError(
        fmt::format("cannot listen on {} (address in use, or not an interface of this host)",
                    listen));
  }
  *bound_address = host.find(':') != std::string::npos
                       ? fmt::format("[{}]:{}", host, selected_port)
                       : fmt::format("{}:{}", host, selected_port);
  if (tls->enabled) {
    spdlog::info("runtime: gRPC on {} with TLS{}", *bound_address,
                 tls->mutual ? " (mutual: clients present certificates)" : "");
  } else {
    spdlog::info("runtime: gRPC on {} in plaintext (the job token is checked, traffic is not "
                 "encrypted; set {}, {}, {} for TLS between nodes)",
                 *bound_address, kTlsCaEnv, kTlsCertEnv, kTlsKeyEnv);
  }
  return server;
}

grpc::Status CallWhileUnavailable(const std::function<grpc::Status()>& attempt,
                                  std::chrono::steady_clock::time_point give_up,
                                  std::chrono::milliseconds pause) {
  while (true) {
    grpc::Status s = attempt();
    if (s.ok() || s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() > give_up) {
      return s;
    }
    std::this_thread::sleep_for(pause);
  }
}

HeartbeatTimings HeartbeatTimingsFrom(double interval_s, double head_lost_timeout_s) {
  HeartbeatTimings t;
  t.interval = std::chrono::milliseconds(
      std::max<int64_t>(10, static_cast<int64_t>(interval_s * 1000)));
  t.head_lost_timeout = std::chrono::milliseconds(
      std::max<int64_t>(100, static_cast<int64_t>(head_lost_timeout_s * 1000)));
  return t;
}

Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(status.error_code()),
                fmt::format("{}: {}", what, status.error_message()));
}

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        fmt::format("'{}' is not HOST:PORT (e.g. 10.0.0.1:50051)", address));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) {
      return absl::InvalidArgumentError(
          fmt::format("'{}': port must be a number in 0..65535", address));
    }
    port = port * 10 + (c - '0');
  }
  if (port > 65535) {
    return absl::InvalidArgumentError(fmt::format("'{}': port must be in 0..65535", address));
  }
  return std::make_pair(host, port);
}

StatusOr<std::string> LocalAddressFor(const std::string& peer_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(peer_host.c_str(), "9", &hints, &found); rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("cannot resolve host '{}': {}", peer_host, gai_strerror(rc)));
  }
  std::string result;
  for (addrinfo* ai = found; ai != nullptr && result.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // A UDP connect sends nothing; it only picks the route and so the local address.
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, addr, buf, sizeof(buf)) != nullptr) result = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (result.empty()) {
    return absl::UnavailableError(fmt::format("no route from this host to '{}'", peer_host));
  }
  return result;
}

Status WriteHeadFile(const std::string& path, const std::string& address,
                     const std::string& token) {
  nlohmann::json j = {{"address", address}, {"token", token}, {"pid", ::getpid()}};
  const std::string text = j.dump(2) + "\n";
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(fmt::format("cannot write {}: {}", tmp, strerror(errno)));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(fmt::format("cannot write {}: {}", path, strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {
StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("cannot read {}", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

StatusOr<HeadFile> ReadHeadFile(const std::string& path) {
  SLIME_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("address") || !j["address"].is_string() ||
      !j.contains("token") || !j["token"].is_string()) {
    return absl::InvalidArgumentError(fmt::format(
        "{} is not a head file (want a JSON object with string \"address\" and \"token\")", path));
  }
  return HeadFile{j["address"].get<std::string>(), j["token"].get<std::string>()};
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  SLIME_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  if (!text.empty() && text.front() == '{') {
    SLIME_ASSIGN_OR_RETURN(HeadFile head, ReadHeadFile(path));
    return head.token;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  if (text.empty()) return absl::InvalidArgumentError(fmt::format("{}: empty token file", path));
  return text;
}

}  // namespace slime::runtime
