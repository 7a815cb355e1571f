// Byte-level encoding for pycyxwiz files, and the container every file uses:
//
//   magic (8 bytes) | format version (u32) | reserved (u32) | payload size (u64) | payload | crc32(payload) (u32)
//
// All integers little-endian. Writes go to "<path>.tmp.<pid>.<n>", are synced, renamed over <path>,
// and the directory is synced, so a crash never leaves half a file under the real name and a
// published file survives a power loss. Reads check magic, version, size and checksum before a
// single payload byte is interpreted, and ByteReader bounds-checks every field after that: no length
// read from a file allocates more than the bytes that are left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz {

class ByteWriter {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s);
  void tensor(const Tensor& t);  // dtype, rank, dims, bytes
  void raw(const void* data, size_t n);
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  // `what` names the file in errors.
  ByteReader(const std::vector<uint8_t>& bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64();
  double f64();
  std::string str();
  Tensor tensor();
  // A count of items that take at least `minBytesEach` bytes each: fails (naming `what`) when more
  // than `max` or more than the bytes left could hold, so a container of `count` items is safe to size.
  uint32_t count(const std::string& what, size_t minBytesEach, uint32_t max);
  size_t remaining() const { return bytes_.size() - pos_; }
  bool atEnd() const { return pos_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& problem) const;

 private:
  void raw(void* out, size_t n);
  const std::vector<uint8_t>& bytes_;
  std::string what_;
  size_t pos_ = 0;
};

struct FileKind {
  const char* magic;    // exactly 8 characters
  const char* name;     // "pycyxwiz model", for messages
  uint32_t version;     // the newest version this build writes and reads
};

// Also removes the temporary files of this kind that writers which died (their pid is gone and no
// process holds their lock) left in the directory.
void writeContainer(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& payload);
// Returns the payload; throws IoError (cannot open) or FileFormatError (anything else wrong).
std::vector<uint8_t> readContainer(const std::string& path, const FileKind& kind, uint32_t* versionOut = nullptr);

}  // namespace cyxwiz
