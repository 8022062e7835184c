// model_compare: DecoderModel logits against a reference (HF transformers) on the same weights.
//
//   model_compare --model DIR --reference FILE [--device cuda|cpu] [--dtype bf16|fp32]
//   model_compare --model DIR --write-reference FILE [--seqs 1,17,128] [--seed N] [...]
//
// FILE is a safetensors holding, for i = 0..n-1, "input_ids.<i>" (I64 [L]) and "logits.<i>"
// (F32 [L, vocab]); scripts/device/compare_model_hf.py writes it from transformers. Each
// sequence runs alone through ForwardPacked, then all of them in one packed call. Prints one
// markdown table: max / mean |logit error| and max / mean |logprob error| of the actual next
// tokens (log_softmax in fp32 of both sides, gathered at input_ids[t+1]); all in fp32 on the
// device. Exit status 1 on any load / forward error.
//
// --write-reference (test-only): writes a FILE of random ids (fixed seed) and our own fp32-cast
// logits instead of comparing, so the comparison path can be checked without transformers.
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "slime/model/decoder.h"
#include "slime/model/safetensors.h"

namespace {

using slime::model::DecoderModel;
using slime::model::SafetensorsDType;
using slime::model::SafetensorsFile;
using slime::model::SafetensorsTensorInfo;

struct Options {
  std::string model;
  std::string reference;
  std::string write_reference;
  std::string device = "cuda";
  std::string dtype = "bf16";
  std::vector<int64_t> seqs = {1, 17, 128};
  int64_t seed = 0;
};

[[noreturn]] void Fail(const std::string& message) {
  fmt::print(stderr, "model_compare: {}\n", message);
  std::exit(1);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  CLI::App app{"model_compare: DecoderModel logits and next-token log-probs vs a reference"};
  app.add_option("--model", o.model, "HF model directory")->required();
  auto* reference = app.add_option("--reference", o.reference, "reference safetensors to compare");
  auto* write = app.add_option("--write-reference", o.write_reference,
                               "write our own logits as a reference (self-check)");
  reference->excludes(write);
  app.add_option("--device", o.device)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--seqs", o.seqs, "sequence lengths for --write-reference")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", o.seed);
  try {
    app.parse(argc, argv);
    if (o.reference.empty() && o.write_reference.empty()) {
      throw CLI::ValidationError("exactly one of --reference and --write-reference is required");
    }
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return o;
}

template <typename T>
T Check(slime::StatusOr<T> v) {
  if (!v.ok()) Fail(std::string(v.status().message()));
  return *std::move(v);
}

// Logits [T, vocab] in fp32 of the packed batch `ids` with boundaries `cu`.
torch::Tensor OurLogits(DecoderModel& m, const torch::Tensor& ids, const std::vector<int64_t>& cu) {
  torch::NoGradGuard no_grad;
  torch::Tensor h = Check(m.ForwardPacked(ids, cu));
  return Check(m.Logits(h)).to(torch::kFloat32);
}

struct Row {
  std::string name;
  double max_logit = 0, mean_logit = 0, max_lp = 0, mean_lp = 0;
  int64_t next_tokens = 0;
};

// Errors of `got` vs `want` ([L, V] fp32) for one sequence `ids` [L] (same device).
void Accumulate(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& ids,
                torch::Tensor& logit_err, std::vector<torch::Tensor>& lp_err) {
  logit_err = (got - want).abs();
  const int64_t len = ids.size(0);
  if (len < 2) return;
  torch::Tensor next = ids.slice(0, 1).unsqueeze(1);
  torch::Tensor a = torch::log_softmax(got.slice(0, 0, len - 1), -1).gather(1, next);
  torch::Tensor b = torch::log_softmax(want.slice(0, 0, len - 1), -1).gather(1, next);
  lp_err.push_back((a - b).abs().flatten());
}

Row Summarize(const std::string& name, const std::vector<torch::Tensor>& logit_errs,
              const std::vector<torch::Tensor>& lp_errs) {
  Row r;
  r.name = name;
  double sum = 0;
  int64_t count = 0;
  for (const torch::Tensor& e : logit_errs) {
    r.max_logit = std::max(r.max_logit, e.max().item<double>());
    sum += e.sum(torch::kFloat64).item<double>();
    count += e.numel();
  }
  r.mean_logit = count > 0 ? sum / count : 0;
  if (!lp_errs.empty()) {
    torch::Tensor lp = torch::cat(lp_errs);
    r.max_lp = lp.max().item<double>();
    r.mean_lp = lp.mean(torch::kFloat64).item<double>();
    r.next_tokens = lp.numel();
  }
  return r;
}

int WriteReference(const Options& o, DecoderModel& m, const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  std::vector<torch::Tensor> ids, logits;
  for (int64_t len : o.seqs) {
    ids.push_back(torch::randint(0, m.config().vocab_size, {len}, torch::kLong));
    logits.push_back(OurLogits(m, ids.back().to(device), {0, len}).cpu().contiguous());
  }
  std::vector<slime::model::SafetensorsWriteEntry> entries;
  for (size_t i = 0; i < ids.size(); ++i) {
    entries.push_back({fmt::format("input_ids.{}", i), SafetensorsDType::kI64,
                       ids[i].sizes().vec(), ids[i].data_ptr(), ids[i].nbytes()});
    entries.push_back({fmt::format("logits.{}", i), SafetensorsDType::kF32,
                       logits[i].sizes().vec(), logits[i].data_ptr(), logits[i].nbytes()});
  }
  slime::Status s = slime::model::WriteSafetensors(o.write_reference, entries);
  if (!s.ok()) Fail(std::string(s.message()));
  fmt::print("model_compare: wrote {} sequences to {}\n", ids.size(), o.write_reference);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  if (o.device == "cuda" && !torch::cuda::is_available()) Fail("--device cuda: no CUDA device");
  const torch::Device device = o.device == "cuda" ? torch::Device(torch::kCUDA) : torch::kCPU;
  const torch::ScalarType dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  std::unique_ptr<DecoderModel> m = Check(DecoderModel::Load(o.model, dtype, device));
  if (!o.write_reference.empty()) return WriteReference(o, *m, device);

  std::shared_ptr<const SafetensorsFile> file = Check(SafetensorsFile::Open(o.reference));
  std::vector<torch::Tensor> ids, want;
  for (int i = 0;; ++i) {
    const SafetensorsTensorInfo* id = file->Find(fmt::format("input_ids.{}", i));
    const SafetensorsTensorInfo* lg = file->Find(fmt::format("logits.{}", i));
    if (id == nullptr && lg == nullptr) break;
    if (id == nullptr || lg == nullptr || id->dtype != SafetensorsDType::kI64 ||
        lg->dtype != SafetensorsDType::kF32 || id->shape.size() != 1 || lg->shape.size() != 2 ||
        lg->shape[0] != id->shape[0] || id->shape[0] < 1 ||
        lg->shape[1] != m->config().vocab_size) {
      Fail(fmt::format("{}: sequence {} needs input_ids.{} I64 [L>=1] and logits.{} F32 [L, {}]",
                       o.reference, i, i, i, m->config().vocab_size));
    }
    auto blob = [](const SafetensorsFile& f, const SafetensorsTensorInfo& t, torch::Dtype d) {
      return torch::from_blob(const_cast<uint8_t*>(f.Data(t)), t.shape, d);
    };
    ids.push_back(blob(*file, *id, torch::kLong).to(device, /*non_blocking=*/false, /*copy=*/true));
    want.push_back(
        blob(*file, *lg, torch::kFloat32).to(device, /*non_blocking=*/false, /*copy=*/true));
  }
  if (ids.empty()) Fail(o.reference + ": no input_ids.0 / logits.0");

  std::vector<Row> rows;
  std::vector<torch::Tensor> all_ids, all_logit_err, all_lp_err;
  std::vector<int64_t> cu = {0};
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t len = ids[i].size(0);
    torch::Tensor logit_err;
    std::vector<torch::Tensor> lp_err;
    Accumulate(OurLogits(*m, ids[i], {0, len}), want[i], ids[i], logit_err, lp_err);
    rows.push_back(Summarize(fmt::format("seq {} (L={})", i, len), {logit_err}, lp_err));
    all_ids.push_back(ids[i]);
    cu.push_back(cu.back() + len);
  }
  torch::Tensor packed = OurLogits(*m, torch::cat(all_ids), cu);
  for (size_t i = 0; i < ids.size(); ++i) {
    torch::Tensor logit_err;
    Accumulate(packed.slice(0, cu[i], cu[i + 1]), want[i], ids[i], logit_err, all_lp_err);
    all_logit_err.push_back(logit_err);
  }
  rows.push_back(
      Summarize(fmt::format("packed {} seqs (T={})", ids.size(), cu.back()), all_logit_err,
                all_lp_err));

  fmt::print("model_compare: {} vs {} ({}, {}, vocab {})\n\n", o.model, o.reference, o.device,
             o.dtype, m->config().vocab_size);
  fmt::print("| case | max abs logit err | mean abs logit err | next tokens | "
             "max abs logprob err | mean abs logprob err |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const std::string lp_max = r.next_tokens > 0 ? fmt::format("{:.3e}", r.max_lp) : "-";
    const std::string lp_mean = r.next_tokens > 0 ? fmt::format("{:.3e}", r.mean_lp) : "-";
    fmt::print("| {} | {:.3e} | {:.3e} | {} | {} | {} |\n", r.name, r.max_logit, r.mean_logit,
               r.next_tokens, lp_max, lp_mean);
  }
  return 0;
}
