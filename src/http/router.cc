#include "slime/http/router.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <string_view>

#include "fmt/format.h"
#include "slime/http/response_writer.h"
#include "slime/http/util.h"
#include "spdlog/spdlog.h"

namespace slime::http {

std::optional<std::string> Request::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() != name.size()) continue;
    bool equal = true;
    for (size_t i = 0; equal && i < key.size(); ++i) {
      equal = std::tolower(static_cast<unsigned char>(key[i])) ==
              std::tolower(static_cast<unsigned char>(name[i]));
    }
    if (equal) return value;
  }
  return std::nullopt;
}

void Router::Add(std::string method, std::string path, Handler handler) {
  if (path.empty() || path[0] != '/') {
    spdlog::warn("http: route path \"{}\" does not start with '/'; it can never match", path);
  }
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

void Router::AddPrefix(std::string method, std::string prefix, Handler handler) {
  if (prefix.empty() || prefix.front() != '/' || prefix.back() != '/') {
    spdlog::warn("http: route prefix \"{}\" must start and end with '/'; it is ignored", prefix);
    return;
  }
  prefixes_[std::move(prefix)][std::move(method)] = std::move(handler);
}

const std::map<std::string, Handler>* Router::Find(const std::string& path) const {
  auto it = routes_.find(path);
  if (it != routes_.end()) return &it->second;
  const std::map<std::string, Handler>* best = nullptr;
  size_t best_size = 0;
  for (const auto& [prefix, methods] : prefixes_) {
    if (path.size() >= prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
        prefix.size() > best_size) {
      best = &methods;
      best_size = prefix.size();
    }
  }
  return best;
}

std::vector<std::string> Router::AllowedMethods(const std::string& path) const {
  std::vector<std::string> methods;
  const auto* found = Find(path);
  if (found == nullptr) return methods;
  for (const auto& [method, handler] : *found) methods.push_back(method);
  if (found->count("GET") && !found->count("HEAD")) methods.push_back("HEAD");
  std::sort(methods.begin(), methods.end());
  return methods;
}

namespace {

// Equal without an early exit, so the time taken does not tell how much of a key matched.
bool SameKey(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

bool Router::Authorized(const Request& request, ResponseWriter& writer) const {
  if (keys_.api_key.empty() && keys_.admin_key.empty()) return true;
  if (keys_.open_paths.count(request.path)) return true;
  const bool admin = keys_.admin_paths.count(request.path) > 0;
  const std::string& needed = admin && !keys_.admin_key.empty() ? keys_.admin_key : keys_.api_key;
  if (needed.empty()) return true;  // an admin key alone leaves the other routes open
  std::string token;
  if (auto auth = request.Header("Authorization")) {
    constexpr std::string_view kBearer = "Bearer ";
    if (auth->size() > kBearer.size() &&
        std::equal(kBearer.begin(), kBearer.end(), auth->begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) ==
                                               std::tolower(static_cast<unsigned char>(b)); })) {
      token = auth->substr(kBearer.size());
    }
  }
  if (SameKey(token, needed)) return true;
  // Any other key on a non-admin route: the admin key also opens the user routes.
  if (!admin && !keys_.admin_key.empty() && SameKey(token, keys_.admin_key)) return true;
  if (admin && !keys_.api_key.empty() && SameKey(token, keys_.api_key)) {
    writer.SendJson(403, ErrorBody(fmt::format(
                             "{} changes the server's state and needs the admin API key",
                             request.path)));
    return false;
  }
  writer.SetHeader("WWW-Authenticate", "Bearer");
  writer.SendJson(401, ErrorBody(fmt::format(
                           "{}: missing or wrong API key (send 'Authorization: Bearer <key>')",
                           request.path)));
  return false;
}

void Router::Dispatch(const Request& request, std::shared_ptr<ResponseWriter> writer) const {
  if (!Authorized(request, *writer)) return;
  const auto* found = Find(request.path);
  if (found == nullptr) {
    writer->SendJson(404,
                     ErrorBody(fmt::format("no route for {} {}", request.method, request.path)));
    return;
  }
  const auto& methods = *found;
  auto handler = methods.find(request.method);
  if (handler == methods.end()) handler = methods.find("*");
  if (handler == methods.end() && request.method == "HEAD") handler = methods.find("GET");
  if (handler == methods.end()) {
    std::string allowed = fmt::format("{}", fmt::join(AllowedMethods(request.path), ", "));
    writer->SetHeader("Allow", allowed);
    writer->SendJson(405, ErrorBody(fmt::format("method {} not allowed for {}; allowed: {}",
                                                request.method, request.path, allowed)));
    return;
  }
  std::string error;
  try {
    handler->second(request, writer);
    return;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  spdlog::error("http: handler for {} {} threw: {}", request.method, request.path, error);
  if (!writer->started()) {
    writer->SendJson(500, ErrorBody(fmt::format("handler for {} {} failed: {}", request.method,
                                                request.path, error)));
  } else if (!writer->answered()) {
    writer->Finish();  // the status is already out; end the stream cleanly
  }
}

}  // namespace slime::http
