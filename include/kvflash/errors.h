// kvflash::Error: every rejected call throws one, naming the argument, what was expected and
// what was given. The kind maps onto the natural exception of a binding (Python: ValueError,
// TypeError, NotImplementedError, RuntimeError).
#pragma once

#include <stdexcept>
#include <string>

namespace kvflash {

enum class ErrorKind {
  invalid_value,   // a shape, length, index or flag that is out of the contract
  invalid_type,    // a dtype or device that is not accepted
  unsupported,     // valid by the contract, not implemented by this build or backend
  device_failure,  // the device (CUDA) reported an error
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, const std::string& message)
      : std::runtime_error(message), kind_(kind), argument_(std::move(argument)) {}
  ErrorKind kind() const { return kind_; }
  // The argument the message is about ("k_cache", "page_table", ...); may be empty.
  const std::string& argument() const { return argument_; }

 private:
  ErrorKind kind_;
  std::string argument_;
};

const char* error_kind_name(ErrorKind kind);

}  // namespace kvflash
