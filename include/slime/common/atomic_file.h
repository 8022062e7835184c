// Durable, atomic file replacement: what every state file we write goes through (data source
// and coordinator state, driver.json, demo data).
#ifndef SLIME_COMMON_ATOMIC_FILE_H_
#define SLIME_COMMON_ATOMIC_FILE_H_

#include <string>

#include "slime/common/status.h"

namespace slime {

// Writes `contents` to `path` through `path`.tmp.<pid>: write, fsync, rename, fsync of the
// directory. Readers see the old file or the new one, never a part. The parent directory must
// exist. Errors name the file and the system error.
Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace slime

#endif  // SLIME_COMMON_ATOMIC_FILE_H_
