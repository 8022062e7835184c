#include "slime/http/metrics_route.h"

#include "slime/http/response_writer.h"

namespace slime::http {

void AddMetricsRoute(Router& router, const metrics::Registry& registry, std::string path) {
  router.Add("GET", std::move(path),
             [&registry](const Request&, std::shared_ptr<ResponseWriter> writer) {
               writer->Send(200, registry.Exposition(), kPrometheusContentType);
             });
}

}  // namespace slime::http
