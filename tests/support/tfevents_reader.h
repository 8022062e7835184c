// A reader of TensorBoard event files for tests, written from the format (TFRecord framing:
// uint64 length, masked CRC-32C of the length bytes, data, masked CRC-32C of the data; the data
// an Event message) and independent of the writer's code: its CRC-32C is computed bit by bit
// here, not with the library the writer uses.
#ifndef SLIME_TESTS_SUPPORT_TFEVENTS_READER_H_
#define SLIME_TESTS_SUPPORT_TFEVENTS_READER_H_

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "slime/v1/tensorboard.pb.h"

namespace slime::testing {

// CRC-32C, reflected polynomial 0x82f63b78, one bit at a time.
inline uint32_t BitwiseCrc32c(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t MaskedCrc(std::string_view data) {
  const uint32_t crc = BitwiseCrc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

inline uint64_t LittleEndian(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

struct TfRecords {
  std::vector<std::string> records;  // the data of each complete record, in file order
  size_t tail_bytes = 0;             // bytes after them too few for a record: not yet written
  std::string error;                 // a CRC mismatch: where and which; empty when none
};

inline TfRecords ParseTfRecords(std::string_view file) {
  TfRecords out;
  size_t at = 0;
  while (at < file.size()) {
    const size_t left = file.size() - at;
    if (left < 12) break;
    const std::string_view length_bytes = file.substr(at, 8);
    if (LittleEndian(file.substr(at + 8, 4)) != MaskedCrc(length_bytes)) {
      out.error = fmt::format("offset {}: the CRC of the length does not match", at);
      return out;
    }
    const uint64_t length = LittleEndian(length_bytes);
    if (left - 12 < length || left - 12 - length < 4) break;
    const std::string_view data = file.substr(at + 12, length);
    if (LittleEndian(file.substr(at + 12 + length, 4)) != MaskedCrc(data)) {
      out.error = fmt::format("offset {}: the CRC of the data does not match", at);
      return out;
    }
    out.records.emplace_back(data);
    at += 12 + length + 4;
  }
  out.tail_bytes = file.size() - at;
  return out;
}

inline std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct EventFile {
  std::vector<slime::v1::tensorboard::Event> events;
  size_t tail_bytes = 0;
  std::string error;  // framing or a record that is no Event
};

inline EventFile ReadEventFile(const std::filesystem::path& path) {
  EventFile out;
  TfRecords framed = ParseTfRecords(ReadBytes(path));
  out.tail_bytes = framed.tail_bytes;
  out.error = framed.error;
  for (size_t i = 0; i < framed.records.size(); ++i) {
    slime::v1::tensorboard::Event event;
    if (!event.ParseFromString(framed.records[i])) {
      out.error = fmt::format("record {} is not an Event", i);
      break;
    }
    out.events.push_back(std::move(event));
  }
  return out;
}

// The files TensorBoard would read in `dir` ("tfevents" in the name), in name order.
inline std::vector<std::filesystem::path> EventFilesIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TFEVENTS_READER_H_
