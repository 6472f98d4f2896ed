// Reading an entry's arguments on the host: the struct behind the address the core passed, after its header
// (fp8gemm/backend.hpp Wire) was checked. Host code only: kernels include backend.hpp alone.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8gemm/backend.hpp"

namespace fp8gemm {

// The arguments behind `address`, after checking they were packed for this protocol (std::invalid_argument otherwise: a ValueError in Python).
template <class Args>
const Args& read_wire(uintptr_t address, const char* entry) {
  if (!address) throw std::invalid_argument(std::string(entry) + ": no argument struct (address 0)");
  const auto* wire = reinterpret_cast<const Wire<Args>*>(address);
  if (wire->version != kProtocolVersion || wire->size != sizeof(Wire<Args>))
    throw std::invalid_argument(std::string(entry) + ": arguments of protocol version " + std::to_string(wire->version) +
                                " (" + std::to_string(wire->size) + " bytes), this build reads version " +
                                std::to_string(kProtocolVersion) + " (" + std::to_string(sizeof(Wire<Args>)) +
                                " bytes); install an fp8gemm-core and arch package of the same release");
  return wire->args;
}

}  // namespace fp8gemm
