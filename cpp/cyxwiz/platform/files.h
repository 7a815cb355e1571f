// Durable files: what writing a model or checkpoint so that it survives a crash or a power loss
// needs from the system, and the cleanup of temporary files whose writers died.
#pragma once

#include <cstdio>
#include <string>

namespace cyxwiz::platform {

// fopen(path, "wb") whose descriptor child processes do not inherit; nullptr and errno on failure.
std::FILE* openForWriting(const std::string& path);
// Marks a file being written (an exclusive advisory lock: flock / LockFileEx) for cleaners elsewhere;
// released when it is closed. Best effort.
void lockWhileWriting(std::FILE* f);
// Flushes the C buffer and the system's cache of the file to the disk; false and errno on failure.
bool syncToDisk(std::FILE* f);
// Renames `from` over `to` atomically and, where the system offers it, durably
// (MoveFileExW(MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)); 0 or an errno code.
int replaceFile(const std::string& from, const std::string& to);
// Syncs a directory so that a rename in it survives a power loss; 0, or an errno code (EINVAL,
// ENOTSUP: a file system without directory sync; nothing to do on Windows).
int syncDirectory(const std::string& dir);
// Removes `path` if it is a regular file no process holds the writing lock on and its first bytes
// are a prefix of `magic` (n bytes): a temporary file whose writer died mid-write. Best effort.
void removeAbandonedFile(const std::string& path, const char* magic, size_t n);
// True when `path` names a directory.
bool isDirectory(const std::string& path);

}  // namespace cyxwiz::platform
