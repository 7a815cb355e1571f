#include "cyxwiz/common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cyxwiz/common/error.h"

namespace cyxwiz {

namespace {

std::mutex gMutex;
int gRank = -1;
int gWorld = 0;

LogLevel thresholdFromEnvironment() {
  const char* v = std::getenv("CYXWIZ_LOG_LEVEL");
  if (v == nullptr) return LogLevel::Notice;
  if (std::strcmp(v, "debug") == 0 || std::strcmp(v, "DEBUG") == 0) return LogLevel::Debug;
  if (std::strcmp(v, "info") == 0 || std::strcmp(v, "INFO") == 0) return LogLevel::Info;
  if (std::strcmp(v, "warning") == 0 || std::strcmp(v, "WARNING") == 0) return LogLevel::Warning;
  return LogLevel::Notice;
}

}  // namespace

void setLogRank(int rank, int worldSize) {
  std::lock_guard<std::mutex> lock(gMutex);
  gRank = rank;
  gWorld = worldSize;
}

void clearLogRank() { setLogRank(-1, 0); }

std::string rankPrefix() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gRank < 0) return "";
  return makeString("[rank ", gRank, "/", gWorld, "] ");
}

void log(LogLevel level, const std::string& message) {
  static const LogLevel threshold = thresholdFromEnvironment();
  if (level < threshold) return;
  const char* name = level == LogLevel::Warning ? "WARNING" : level >= LogLevel::Info ? "INFO" : "DEBUG";
  std::lock_guard<std::mutex> lock(gMutex);
  if (gRank >= 0) {
    std::fprintf(stderr, "[pycyxwiz rank %d/%d] %s: %s\n", gRank, gWorld, name, message.c_str());
  } else {
    std::fprintf(stderr, "[pycyxwiz] %s: %s\n", name, message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace cyxwiz
