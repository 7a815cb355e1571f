#include "cyxwiz/common/binary_io.h"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cyxwiz/common/crc32.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/files.h"
#include "cyxwiz/platform/process.h"

namespace cyxwiz {

namespace {
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8;
constexpr size_t kMaxStringSize = 1 << 20;
constexpr uint32_t kMaxRank = 8;

std::string directoryOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// The writer's pid in a temporary file name "<name>.tmp.<pid>.<n>", or -1 for any other name.
long tempFilePid(const std::string& name) {
  size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return -1;
  std::string rest = name.substr(at + 5);
  size_t dot = rest.find('.');
  if (dot == 0 || dot > 9 || dot == std::string::npos || dot + 1 == rest.size()) return -1;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (i != dot && !std::isdigit(static_cast<unsigned char>(rest[i]))) return -1;
  }
  return std::stol(rest.substr(0, dot));
}

// Removes the temporary files of `kind` in `dir` whose writers died mid-write (a crash, a kill): the
// pid in the name is not a live process here, and no process holds the lock each writer keeps on its
// file while writing (a writer on another host sharing the directory; flock reaches NFS servers).
// The content must be a start of this kind's file (empty or the magic), so other programs' files
// that happen to match the name pattern stay. Best effort: anything unexpected leaves the file.
void removeDeadWritersFiles(const std::string& dir, const FileKind& kind) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long pid = tempFilePid(name);
    if (pid < 0 || !platform::processGone(pid)) continue;
    platform::removeAbandonedFile(it->path().string(), kind.magic, 8);
  }
}

// After a rename the directory entry lives only in the page cache until the directory is synced.
void syncDirectory(const std::string& dir, const std::string& path, const FileKind& kind) {
  int err = platform::syncDirectory(dir);
  if (err != 0 && err != EINVAL && err != ENOTSUP) {  // EINVAL: a file system without directory sync
    throw IoError(makeString(kind.name, " file '", path, "' was written but syncing its directory failed: ",
                             std::strerror(err), "; it may not survive a power loss, check the disk"), err);
  }
}

}  // namespace

void ByteWriter::raw(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), p, p + n);
}

void ByteWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  raw(s.data(), s.size());
}

void ByteWriter::tensor(const Tensor& t) {
  u8(static_cast<uint8_t>(t.dtype()));
  u32(static_cast<uint32_t>(t.dim()));
  for (int64_t d : t.shape()) i64(d);
  const Tensor host = t.to(Device{});  // GPU parameters and optimizer state are written from a host copy
  raw(host.rawData(), host.nbytes());
}

void ByteReader::fail(const std::string& problem) const {
  throw FileFormatError(makeString(what_, ": ", problem, " (at byte ", pos_, " of the payload); the file is corrupt"));
}

void ByteReader::raw(void* out, size_t n) {
  if (n > bytes_.size() - pos_) fail(makeString("field of ", n, " bytes runs past the end of the data"));
  std::memcpy(out, bytes_.data() + pos_, n);
  pos_ += n;
}

uint8_t ByteReader::u8() { uint8_t v; raw(&v, 1); return v; }
uint32_t ByteReader::u32() { uint32_t v; raw(&v, 4); return v; }
uint64_t ByteReader::u64() { uint64_t v; raw(&v, 8); return v; }
int64_t ByteReader::i64() { int64_t v; raw(&v, 8); return v; }
double ByteReader::f64() { double v; raw(&v, 8); return v; }

std::string ByteReader::str() {
  uint32_t n = u32();
  if (n > kMaxStringSize) fail(makeString("string length ", n, " is implausible"));
  if (n > remaining()) fail(makeString("string of ", n, " bytes runs past the end of the data"));
  std::string s(n, '\0');
  raw(s.data(), n);
  return s;
}

Tensor ByteReader::tensor() {
  uint8_t code = u8();
  if (code > static_cast<uint8_t>(DType::Int64)) fail(makeString("unknown dtype code ", int(code)));
  uint32_t rank = u32();
  if (rank > kMaxRank) fail(makeString("tensor rank ", rank, " is implausible"));
  Shape shape(rank);
  uint64_t numel = 1;
  for (auto& d : shape) {
    d = i64();
    if (d < 0 || (d > 0 && numel > (uint64_t(1) << 40) / uint64_t(d))) fail("tensor dimensions are implausible");
    numel *= uint64_t(d);
  }
  DType dtype = static_cast<DType>(code);
  if (numel * itemSize(dtype) > bytes_.size() - pos_) fail("tensor data runs past the end of the data");
  Tensor t = Tensor::empty(shape, dtype);
  raw(t.rawData(), t.nbytes());
  return t;
}

uint32_t ByteReader::count(const std::string& what, size_t minBytesEach, uint32_t max) {
  uint32_t n = u32();
  if (n > max) fail(makeString(what, " ", n, " is implausible (at most ", max, ")"));
  if (uint64_t(n) * minBytesEach > remaining()) {
    fail(makeString(what, " ", n, " runs past the end of the data (at least ", uint64_t(n) * minBytesEach, " bytes, ",
                    remaining(), " left)"));
  }
  return n;
}

void writeContainer(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& payload) {
  ByteWriter header;
  header.raw(kind.magic, 8);
  header.u32(kind.version);
  header.u32(0);
  header.u64(payload.size());
  uint32_t checksum = crc32(payload.data(), payload.size());

  // Unique per process and per call, so concurrent saves (threads or ranks) never share a temp file.
  static std::atomic<uint64_t> counter{0};
  const std::string dir = directoryOf(path);
  removeDeadWritersFiles(dir, kind);
  std::string tmp = makeString(path, ".tmp.", platform::currentPid(), ".", counter.fetch_add(1));
  std::FILE* f = platform::openForWriting(tmp);
  if (!f) {
    int err = errno;
    throw IoError(makeString("cannot write ", kind.name, " file '", path, "': ", std::strerror(err),
                             "; check that the directory exists and is writable"), err);
  }
  platform::lockWhileWriting(f);  // "being written" for cleaners elsewhere; released by fclose
  bool ok = std::fwrite(header.bytes().data(), 1, header.bytes().size(), f) == header.bytes().size() &&
            std::fwrite(payload.data(), 1, payload.size(), f) == payload.size() &&
            std::fwrite(&checksum, 1, 4, f) == 4 && platform::syncToDisk(f);
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  const int renamed = ok ? platform::replaceFile(tmp, path) : 0;
  if (!ok || renamed != 0) {
    if (ok) err = renamed;
    std::remove(tmp.c_str());
    throw IoError(makeString("writing ", kind.name, " file '", path, "' failed: ", std::strerror(err),
                             "; the previous file (if any) is untouched"), err);
  }
  syncDirectory(dir, path, kind);
}

std::vector<uint8_t> readContainer(const std::string& path, const FileKind& kind, uint32_t* versionOut) {
  if (platform::isDirectory(path)) {
    throw IoError(makeString("cannot read ", kind.name, " file '", path, "': it is a directory"), EISDIR);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    int err = errno;
    throw IoError(makeString("cannot open ", kind.name, " file '", path, "': ", std::strerror(err)), err);
  }
  std::string what = makeString(kind.name, " file '", path, "'");
  std::fseek(f.get(), 0, SEEK_END);
  long fileSize = std::ftell(f.get());
  std::fseek(f.get(), 0, SEEK_SET);
  if (fileSize == 0) throw FileFormatError(what + " is empty");
  uint8_t head[kHeaderSize];
  size_t got = std::fread(head, 1, kHeaderSize, f.get());
  if (got < 8 || std::memcmp(head, kind.magic, 8) != 0) {
    throw FileFormatError(what + " is not a " + kind.name + " file (wrong magic bytes at the start)");
  }
  if (got < kHeaderSize) throw FileFormatError(makeString(what, " is truncated: ", fileSize, " bytes, shorter than its header"));
  uint32_t version;
  uint64_t payloadSize;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&payloadSize, head + 16, 8);
  if (version == 0) throw FileFormatError(what + " has the invalid format version 0; the file is corrupt");
  if (version > kind.version) {
    throw FileFormatError(makeString(what, " has format version ", version, "; this pycyxwiz reads versions 1 to ",
                                     kind.version, ". Upgrade pycyxwiz to read it"));
  }
  uint64_t expected = kHeaderSize + payloadSize + 4;
  if (uint64_t(fileSize) != expected) {
    throw FileFormatError(makeString(what, " is ", uint64_t(fileSize) < expected ? "truncated" : "too long", ": expected ",
                                     expected, " bytes, found ", fileSize));
  }
  std::vector<uint8_t> payload(payloadSize);
  uint32_t stored = 0;
  if (std::fread(payload.data(), 1, payloadSize, f.get()) != payloadSize || std::fread(&stored, 1, 4, f.get()) != 4) {
    throw FileFormatError(what + " could not be read completely");
  }
  uint32_t actual = crc32(payload.data(), payload.size());
  if (stored != actual) {
    throw FileFormatError(makeString(what, " failed its checksum (stored ", stored, ", computed ", actual,
                                     "): the file is corrupt; use another copy"));
  }
  if (versionOut) *versionOut = version;
  return payload;
}

}  // namespace cyxwiz
