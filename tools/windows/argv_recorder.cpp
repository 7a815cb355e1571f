// argv_recorder.exe: a stand-in for python.exe when testing Windows launch scripts
// (launch_distributed.bat) under Wine or on Windows. It records how it was started, as one JSON
// object (UTF-8), in the file named by the environment variable ARGV_RECORD:
//
//   {"cmdline": "<GetCommandLineW(), verbatim>",
//    "argv": [...],      // CommandLineToArgvW(GetCommandLineW()): the shell32 parse
//    "crt_argv": [...],  // wmain's argv: the C runtime's parse, the one python.exe's sys.argv gets
//    "env": {"NAME": "value" or null, ...},   // the variables named in ARGV_RECORD_ENV
//    "cwd": "<current directory>"}
//
// ARGV_RECORD_ENV: variable names separated by ',' or ';' (default: LAUNCH_ARGS,PYTHON).
// ARGV_RECORD_EXIT: the exit status to return (default 0), to test that a script passes it on.
// Without ARGV_RECORD it writes nothing. It prints "argv_recorder: <n> arguments" to stdout.
// Exit status 3 if the record could not be written.
//
// Build (one line): x86_64-w64-mingw32-g++-posix -std=c++17 -O1 -municode -static
//                    tools/windows/argv_recorder.cpp -o argv_recorder.exe
#ifndef UNICODE
#define UNICODE
#endif
#include <windows.h>
#include <shellapi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string utf8(const wchar_t* w) {
  if (!w || !*w) return std::string();
  const int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, nullptr, 0, nullptr, nullptr);
  if (n <= 1) return std::string();
  std::string s(static_cast<size_t>(n), '\0');
  WideCharToMultiByte(CP_UTF8, 0, w, -1, &s[0], n, nullptr, nullptr);
  s.resize(static_cast<size_t>(n - 1));
  return s;
}

std::string json(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// The value of an environment variable; found=false if it is not set (an empty value is found).
std::wstring getenv_w(const std::wstring& name, bool& found) {
  // With no buffer: the size the value needs, terminator included (1 for an empty value), 0 if unset.
  const DWORD n = GetEnvironmentVariableW(name.c_str(), nullptr, 0);
  found = n != 0;
  if (!found) return std::wstring();
  std::wstring v(n, L'\0');
  const DWORD got = GetEnvironmentVariableW(name.c_str(), &v[0], n);
  v.resize(got < n ? got : 0);
  return v;
}

std::string json_array(int n, wchar_t** v) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + json(utf8(v[i]));
  return out + "]";
}

}  // namespace

int wmain(int argc, wchar_t** argv) {
  const wchar_t* cmdline = GetCommandLineW();
  int n = 0;
  wchar_t** parsed = CommandLineToArgvW(cmdline, &n);

  bool has_record = false;
  const std::wstring record = getenv_w(L"ARGV_RECORD", has_record);
  bool has_names = false;
  std::wstring names = getenv_w(L"ARGV_RECORD_ENV", has_names);
  if (!has_names) names = L"LAUNCH_ARGS,PYTHON";
  bool has_exit = false;
  const std::wstring exit_s = getenv_w(L"ARGV_RECORD_EXIT", has_exit);
  const int status = has_exit ? static_cast<int>(std::wcstol(exit_s.c_str(), nullptr, 10)) : 0;

  std::string env = "{";
  size_t start = 0;
  bool first = true;
  while (start <= names.size()) {
    size_t end = names.find_first_of(L",;", start);
    if (end == std::wstring::npos) end = names.size();
    const std::wstring name = names.substr(start, end - start);
    if (!name.empty()) {
      bool found = false;
      const std::wstring value = getenv_w(name, found);
      env += (first ? "" : ", ") + json(utf8(name.c_str())) + ": " + (found ? json(utf8(value.c_str())) : "null");
      first = false;
    }
    start = end + 1;
  }
  env += "}";

  wchar_t cwd[MAX_PATH * 4];
  if (!GetCurrentDirectoryW(sizeof cwd / sizeof cwd[0], cwd)) cwd[0] = L'\0';

  std::printf("argv_recorder: %d arguments\n", argc - 1);
  std::fflush(stdout);

  if (has_record && !record.empty()) {
    const std::string text = "{\"cmdline\": " + json(utf8(cmdline)) + ",\n \"argv\": " +
                             (parsed ? json_array(n, parsed) : std::string("null")) + ",\n \"crt_argv\": " +
                             json_array(argc, argv) + ",\n \"env\": " + env + ",\n \"cwd\": " + json(utf8(cwd)) +
                             "}\n";
    FILE* f = _wfopen(record.c_str(), L"wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "argv_recorder: cannot write %s\n", utf8(record.c_str()).c_str());
      return 3;
    }
  }
  if (parsed) LocalFree(parsed);
  return status;
}
