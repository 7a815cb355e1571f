#include "cyxwiz/common/logging.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <mutex>
#include <optional>

#include "cyxwiz/common/env.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz {

namespace {

std::mutex gMutex;
int gRank = -1;
int gWorld = 0;

// An unknown level is not an error (logging must never throw): it is said once, on stderr.
LogLevel thresholdFromEnvironment() {
  std::optional<std::string> v = envString("CYXWIZ_LOG_LEVEL");
  if (!v || v->empty()) return LogLevel::Notice;
  std::string s;
  for (char c : *v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "debug") return LogLevel::Debug;
  if (s == "info") return LogLevel::Info;
  if (s == "warning") return LogLevel::Warning;
  std::fprintf(stderr, "[pycyxwiz] WARNING: CYXWIZ_LOG_LEVEL='%s' is not a log level: expected debug, info or warning; "
               "using the default (warnings and notices)\n", v->c_str());
  return LogLevel::Notice;
}

LogLevel threshold() {
  static const LogLevel level = thresholdFromEnvironment();
  return level;
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

bool logEnabled(LogLevel level) { return level >= threshold(); }

void log(LogLevel level, const std::string& message) {
  if (!logEnabled(level)) return;
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
