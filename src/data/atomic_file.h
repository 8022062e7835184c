// Data-module internal: durable, atomic file replacement (not a public header).
#ifndef SLIME_SRC_DATA_ATOMIC_FILE_H_
#define SLIME_SRC_DATA_ATOMIC_FILE_H_

#include <string>

#include "slime/common/status.h"

namespace slime::data::internal {

// Writes `contents` to `path` through `path`.tmp.<pid>: write, fsync, rename, fsync of the
// directory. Readers see the old file or the new one, never a part. The parent directory must
// exist. Errors name the file and the system error.
Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace slime::data::internal

#endif  // SLIME_SRC_DATA_ATOMIC_FILE_H_
