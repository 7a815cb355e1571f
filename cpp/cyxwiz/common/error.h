// Error hierarchy of the engine. Exceptions cross the C++ API; the bindings map each class to one
// Python exception (see bindings/module.cpp), so a message written here is what the user reads.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace cyxwiz {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad argument from the caller: wrong shape, dtype, value. Python: ValueError.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An argument of the wrong kind (e.g. a float array where class indices are required). Python: TypeError.
class TypeMismatch : public Error {
 public:
  using Error::Error;
};

// A file that exists but is not a valid pycyxwiz file. Python: pycyxwiz.ModelFormatError (ValueError).
class FileFormatError : public Error {
 public:
  using Error::Error;
};

// The operating system refused a file operation. Python: OSError (FileNotFoundError when missing).
class IoError : public Error {
 public:
  IoError(const std::string& what, int err) : Error(what), errno_(err) {}
  int errnoValue() const { return errno_; }

 private:
  int errno_;
};

// Distributed errors. Python: pycyxwiz.distributed.DistError (RuntimeError) and the subclasses below.
class DistError : public Error {
 public:
  using Error::Error;
};

// A peer closed or reset its connection, or could not be reached. Python: DistNetworkError (ConnectionError).
class NetworkError : public DistError {
 public:
  using DistError::DistError;
};

// A peer went silent past the timeout. Python: DistTimeoutError (TimeoutError).
class TimeoutError : public DistError {
 public:
  using DistError::DistError;
};

// The rendezvous store refused or lost a request. Python: DistStoreError.
class StoreError : public DistError {
 public:
  using DistError::DistError;
};

// A collective could not run as called (ranks disagree on it, unsupported op). Python: DistBackendError.
class BackendError : public DistError {
 public:
  using DistError::DistError;
};

// The user interrupted a blocking call (Ctrl-C). Python: the pending KeyboardInterrupt.
class Interrupted : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
std::string makeString(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace cyxwiz

// Invariant on caller input: throws InvalidArgument with the message pieces streamed together.
#define CYX_CHECK(cond, ...)                                              \
  do {                                                                    \
    if (!(cond)) throw ::cyxwiz::InvalidArgument(::cyxwiz::makeString(__VA_ARGS__)); \
  } while (0)
