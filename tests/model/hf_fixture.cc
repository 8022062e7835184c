#include "hf_fixture.h"

#include <cstring>
#include <filesystem>

#include "slime/model/safetensors.h"
#include "test_util.h"

namespace slime::model::testing {

StatusOr<HfFixture> LoadHfFixture(const std::string& name) {
  HfFixture f;
  f.dir = ModelTestDataDir() + "/" + name;
  const std::string ref_path = f.dir + "/reference.safetensors";
  for (const std::string& p : {f.dir + "/config.json", f.dir + "/model.safetensors", ref_path}) {
    if (!std::filesystem::exists(p)) {
      return absl::NotFoundError(
          "HF fixture file " + p +
          " is missing: run scripts/device/make_model_fixtures.py (needs transformers) and "
          "commit tests/data/model/");
    }
  }
  SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> file,
                         SafetensorsFile::Open(ref_path));
  for (int i = 0;; ++i) {
    const SafetensorsTensorInfo* ids = file->Find("input_ids." + std::to_string(i));
    const SafetensorsTensorInfo* logits = file->Find("logits." + std::to_string(i));
    if (ids == nullptr || logits == nullptr) break;
    if (ids->dtype != SafetensorsDType::kI64 || logits->dtype != SafetensorsDType::kF32 ||
        ids->shape.size() != 1 || logits->shape.size() != 2 || logits->shape[0] != ids->shape[0]) {
      return absl::DataLossError(ref_path + ": sequence " + std::to_string(i) +
                                 " has unexpected dtypes or shapes");
    }
    std::vector<int64_t> id_values(ids->shape[0]);
    std::memcpy(id_values.data(), file->Data(*ids), ids->nbytes());
    f.inputs.push_back(std::move(id_values));
    f.logits.push_back(
        torch::from_blob(const_cast<uint8_t*>(file->Data(*logits)), logits->shape, torch::kFloat32)
            .clone());
  }
  if (f.inputs.empty()) return absl::DataLossError(ref_path + ": no input_ids.0 / logits.0");
  return f;
}

}  // namespace slime::model::testing
