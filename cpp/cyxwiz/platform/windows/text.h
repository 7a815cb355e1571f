// Windows helpers shared by this folder: UTF-8 <-> UTF-16 for paths, and messages for error codes.
#pragma once

#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

#include <string>

namespace cyxwiz::platform::win {

std::wstring widen(const std::string& utf8);
std::string narrow(const std::wstring& utf16);
// FormatMessage's text for a GetLastError()/WSAGetLastError() code, with the code: "... (error 5)".
std::string systemMessage(unsigned long code);
// The errno-domain code closest to a GetLastError() code of a file operation (EIO when none is).
int errnoFromWin32(unsigned long code);

}  // namespace cyxwiz::platform::win
