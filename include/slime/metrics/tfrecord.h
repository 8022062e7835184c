// TFRecord framing, the container of TensorBoard event files (docs/operations.md
// "TensorBoard"), and the CRC-32C it uses.
//
// A file is a sequence of records, each:
//   uint64 length            little endian, the number of data bytes
//   uint32 masked_crc(length bytes)
//   byte   data[length]
//   uint32 masked_crc(data)
// where crc is CRC-32C (Castagnoli, the iSCSI checksum of RFC 3720) and
// masked_crc(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (32-bit arithmetic). A reader that
// meets fewer bytes than a record needs treats the rest as not yet written, so a writer that
// appends whole records never damages the records before.
//
// Threads: the functions are pure.
#ifndef SLIME_METRICS_TFRECORD_H_
#define SLIME_METRICS_TFRECORD_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace slime::metrics {

// CRC-32C of `data` (initial value and final xor 0xffffffff, reflected): "123456789" gives
// 0xe3069283.
uint32_t Crc32c(std::string_view data);

// The masked form TFRecord stores (a CRC of data that itself holds CRCs is then not trivial).
uint32_t MaskCrc32c(uint32_t crc);

// Appends `data` as one framed record to `out`.
void AppendTfRecord(std::string_view data, std::string* out);

}  // namespace slime::metrics

#endif  // SLIME_METRICS_TFRECORD_H_
