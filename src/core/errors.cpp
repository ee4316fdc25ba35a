// Names of the error kinds, as bindings and the C ABI report them.
#include "kvflash/errors.h"

namespace kvflash {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_value: return "invalid_value";
    case ErrorKind::invalid_type: return "invalid_type";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::device_failure: return "device_failure";
  }
  return "unknown";
}

}  // namespace kvflash
