// gRPC plumbing shared by the head, the node agents and the workers: the job token, message
// size limits, channels and servers built the same way everywhere, and the head's discovery
// file (`<run_dir>/head.json`).
//
// Security model (docs/operations.md, "Multi-node"): the head generates a random job token;
// every RPC carries it in the metadata key `x-slime-token` and every handler calls Authorize()
// first, which rejects a missing or wrong token with UNAUTHENTICATED. Servers listen on one
// configured interface, never on all of them unless the user asks for 0.0.0.0. Messages above
// `RpcOptions::max_message_bytes` are rejected by gRPC itself (RESOURCE_EXHAUSTED) on both sides.
//
// TLS (RpcTls): with SLIME_TLS_CA, SLIME_TLS_CERT and SLIME_TLS_KEY set (PEM files), every server
// presents CERT/KEY and every channel verifies its peer against CA (the certificate must name the
// address dialled: an IP SAN for IP addresses); SLIME_TLS_MUTUAL=1 also makes servers require and
// verify a client certificate (each process presents its CERT/KEY). The job token is checked as
// without TLS. The variables are read once per process; agents pass them on to their workers,
// SLURM to the agents. Unset: plaintext, and each server says so in the log.
//
// Thread-safety: all functions are thread-safe.
#ifndef SLIME_RUNTIME_RPC_H_
#define SLIME_RUNTIME_RPC_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "slime/common/status.h"

namespace slime::runtime {

inline constexpr char kTokenMetadataKey[] = "x-slime-token";
// Environment variables a worker process receives from its agent.
inline constexpr char kTokenEnv[] = "SLIME_JOB_TOKEN";
inline constexpr char kIncarnationEnv[] = "SLIME_ACTOR_INCARNATION";
inline constexpr char kBindHostEnv[] = "SLIME_BIND_HOST";
inline constexpr char kTlsCaEnv[] = "SLIME_TLS_CA";
inline constexpr char kTlsCertEnv[] = "SLIME_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "SLIME_TLS_KEY";
inline constexpr char kTlsMutualEnv[] = "SLIME_TLS_MUTUAL";

// This process's TLS material (file comment), read from the environment on first use.
struct RpcTls {
  bool enabled = false;
  bool mutual = false;
  std::string ca_pem, cert_pem, key_pem;
};
// An error names the variable and file when only some variables are set, a file cannot be read
// or is not PEM, or SLIME_TLS_MUTUAL is not 0/1.
const StatusOr<RpcTls>& ProcessTls();

struct RpcOptions {
  std::string token;                          // the job token; must not be empty
  int max_message_bytes = 64 << 20;           // per message, both directions
};

// 32 random bytes as 64 hex characters (from the kernel's random source).
std::string GenerateToken();

// OK when the call's metadata carries `token`; UNAUTHENTICATED otherwise. Compares in constant
// time.
grpc::Status Authorize(const grpc::CallbackServerContext* context, const std::string& token);

// A client context carrying the token, with a deadline `timeout` from now.
std::unique_ptr<grpc::ClientContext> MakeContext(const std::string& token,
                                                 std::chrono::milliseconds timeout);

// A channel to host:port with the message size limits set: TLS per ProcessTls(), else plaintext
// (a ProcessTls() error gives a channel whose calls fail with UNAVAILABLE; StartServer reports it).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const RpcOptions& options);

// Builds and starts a server on host:port (port 0 = any free port) with `services` and the size
// limits, TLS per ProcessTls() (an error there is returned). On success `*bound_address` is
// host:actual_port.
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& host, int port,
                                                    const std::vector<grpc::Service*>& services,
                                                    const RpcOptions& options,
                                                    std::string* bound_address);

// Runs `attempt` (one unary call, with its own context) until it succeeds, retrying after
// `pause` while it fails with UNAVAILABLE (the server may still be starting) and `give_up` has
// not passed. Returns the last status.
grpc::Status CallWhileUnavailable(const std::function<grpc::Status()>& attempt,
                                  std::chrono::steady_clock::time_point give_up,
                                  std::chrono::milliseconds pause);

// The heartbeat period and head-lost timeout a registration reply hands out (seconds), with the
// floors every node and worker applies (10 ms, 100 ms).
struct HeartbeatTimings {
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds head_lost_timeout{10000};
};
HeartbeatTimings HeartbeatTimingsFrom(double interval_s, double head_lost_timeout_s);

// grpc::Status <-> absl::Status (same code numbers); `what` prefixes the message.
Status FromGrpc(const grpc::Status& status, const std::string& what);
grpc::Status ToGrpc(const Status& status);

// "host:port" -> (host, port); the error names the bad value.
StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// The address of this host's interface that routes to `peer_host` (a name or an IP): what an
// agent binds to by default so that it listens on the job's network only.
StatusOr<std::string> LocalAddressFor(const std::string& peer_host);

// The head's discovery file: {"address": "host:port", "token": "...", "pid": N}. Written
// atomically (temp + rename) with mode 0600, since it holds the token.
Status WriteHeadFile(const std::string& path, const std::string& address,
                     const std::string& token);
struct HeadFile {
  std::string address;
  std::string token;
};
StatusOr<HeadFile> ReadHeadFile(const std::string& path);

// A token from a file: either a head.json (its "token") or a file holding just the token.
StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_RPC_H_
