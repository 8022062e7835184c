#include "slime/app/job_plan.h"

#include "fmt/format.h"

namespace slime::app {

StatusOr<JobPlan> PlanJob(const config::Config& config, bool cuda_available) {
  const config::ClusterConfig& cluster = config.cluster;
  JobPlan job;
  runtime::DeviceKind kind = runtime::DeviceKind::kCpuSlot;
  if (cluster.device == "cuda") {
    kind = runtime::DeviceKind::kGpu;
    job.device_note = "cluster.device=cuda";
  } else if (cluster.device == "cpu") {
    job.device_note = "cluster.device=cpu";
  } else {
    kind = cuda_available ? runtime::DeviceKind::kGpu : runtime::DeviceKind::kCpuSlot;
    job.device_note = cuda_available ? "cluster.device=auto: CUDA device visible, using GPUs"
                                     : "cluster.device=auto: no CUDA device, using CPU slots";
  }

  for (int i = 0; i < cluster.num_nodes; ++i) {
    job.nodes.push_back({.name = fmt::format("node{}", i),
                         .num_gpus = kind == runtime::DeviceKind::kGpu ? cluster.num_gpus_per_node : 0,
                         .num_cpu_slots = cluster.cpu_slots_per_node});
  }

  runtime::PlacementRequest& r = job.request;
  r.colocate = cluster.colocate;
  r.strategy = cluster.placement_strategy == "spread" ? runtime::PlacementStrategy::kSpread
                                                      : runtime::PlacementStrategy::kPack;
  r.device_kind = kind;
  r.actor_num_nodes = cluster.actor_num_nodes;
  r.actor_num_gpus_per_node = cluster.actor_num_gpus_per_node;
  r.tensor_parallel = config.train.tensor_model_parallel_size;
  r.pipeline_parallel = config.train.pipeline_model_parallel_size;
  r.context_parallel = config.train.context_parallel_size;
  r.expert_parallel = config.train.expert_model_parallel_size;
  r.with_critic = config::UseCritic(config);
  r.rollout_num_gpus = cluster.rollout_num_gpus;
  r.rollout_num_gpus_per_engine = cluster.rollout_num_gpus_per_engine;
  r.num_gpus_per_node = kind == runtime::DeviceKind::kGpu ? cluster.num_gpus_per_node
                                                          : cluster.cpu_slots_per_node;

  SLIME_ASSIGN_OR_RETURN(job.plan, runtime::PlanPlacement(r, job.nodes));
  return job;
}

}  // namespace slime::app
