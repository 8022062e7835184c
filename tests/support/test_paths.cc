// The configure-time fallbacks of test_paths.h (compile definitions of this target only).
#include "test_paths.h"

namespace slime::testing {

const char* SourceDirDefault() { return SLIME_SOURCE_DIR_DEFAULT; }
const char* TrainBinDefault() { return SLIME_TRAIN_BIN_DEFAULT; }

}  // namespace slime::testing
