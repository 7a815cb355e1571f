// Diagnostics on stderr, prefixed with "[pycyxwiz rank r/N]" once the rank is known, so that lines
// from N processes sharing one terminal (or one launcher) can be told apart.
#pragma once

#include <string>

namespace cyxwiz {

// Notice: an INFO line shown by default (a setting that is ignored, a decision the user should know).
enum class LogLevel { Debug, Info, Notice, Warning };

// Called by init/finalize; before init (and after finalize) the prefix is just "[pycyxwiz]".
void setLogRank(int rank, int worldSize);
void clearLogRank();
// "[rank r/N] " for error messages ("" in a world of one before init).
std::string rankPrefix();

// CYXWIZ_LOG_LEVEL=debug|info|warning decides what is printed; by default warnings and notices.
void log(LogLevel level, const std::string& message);
// Whether `level` is printed: check it before building a message on a hot path.
bool logEnabled(LogLevel level);
inline void logWarning(const std::string& message) { log(LogLevel::Warning, message); }
inline void logNotice(const std::string& message) { log(LogLevel::Notice, message); }
inline void logInfo(const std::string& message) { log(LogLevel::Info, message); }
inline void logDebug(const std::string& message) { log(LogLevel::Debug, message); }

}  // namespace cyxwiz
