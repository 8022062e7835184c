// AddMetricsRoute: serves a metrics::Registry at GET /metrics for Prometheus to scrape.
//
// The registry must outlive the server the router is given to (the route keeps a reference).
// Threads: the route calls Registry::Exposition, which is thread-safe, on an I/O thread.
#ifndef SLIME_HTTP_METRICS_ROUTE_H_
#define SLIME_HTTP_METRICS_ROUTE_H_

#include <string>

#include "slime/http/router.h"
#include "slime/metrics/registry.h"

namespace slime::http {

// The Content-Type of the Prometheus text format.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4";

// Adds GET (and so HEAD) `path` answering 200 with registry.Exposition().
void AddMetricsRoute(Router& router, const metrics::Registry& registry,
                     std::string path = "/metrics");

}  // namespace slime::http

#endif  // SLIME_HTTP_METRICS_ROUTE_H_
