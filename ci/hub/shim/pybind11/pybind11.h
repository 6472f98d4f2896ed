// pybind11 stand-in for kernel-builder's Torch-extension build of an arch package (ci/build_hub.py puts it on the
// include path of each arch's kernel component, never beside the real pybind11). An arch's unchanged module.cpp and
// fp8gemm/backend_module.hpp then register torch ops instead of a Python module: PYBIND11_MODULE(_C, m) becomes a
// TORCH_LIBRARY_FRAGMENT of the extension's namespace (TORCH_EXTENSION_NAME, defined by kernel-builder's
// define_gpu_extension_target, huggingface/kernels@8ac69fc kernel-builder/src/pyproject/templates/utils.cmake), and
// each m.def(name, f) the op `<arch>__<name>`, its schema inferred from f: integer arguments (addresses of the wire
// structs included) as int, bool as bool, floating as float; a dict/list/tuple result as a JSON str. The op
// `<arch>__entries() -> str` lists them ({"name": "value" | "json"}) for the adapter (ci/hub/_C.py), which gives the
// core the same names as the pybind11 _C. An entry added with m.def needs nothing here.
// fp8gemm_hub_arch.h (generated per arch by ci/build_hub.py) defines FP8GEMM_HUB_ARCH and the build_info macros.
#pragma once
#include <torch/library.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fp8gemm_hub_arch.h"
#include "torch_binding.h"

namespace pybind11 {

class object {
 public:
  const std::string& json() const { return json_; }

 protected:
  std::string json_ = "null";
};

namespace detail {

inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

template <class T>
std::string to_json(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_base_of_v<object, D>) {
    return v.json();
  } else if constexpr (std::is_same_v<D, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<D> || std::is_enum_v<D>) {
    return std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_floating_point_v<D>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(v));
    return buf;
  } else {
    return quote(std::string(v));  // std::string, const char*
  }
}

inline std::string join(const std::vector<std::string>& items, const char* open, const char* close) {
  std::string out = open;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + close;
}

// Torch's types for an entry's argument and result (schema inference, torch/library.h).
template <class T, class D = std::decay_t<T>>
using torch_arg_t = std::conditional_t<std::is_same_v<D, bool>, bool,
                                       std::conditional_t<std::is_floating_point_v<D>, double, int64_t>>;
template <class R, class D = std::decay_t<R>>
using torch_result_t = std::conditional_t<
    std::is_void_v<D>, void,
    std::conditional_t<std::is_same_v<D, bool>, bool,
                       std::conditional_t<std::is_floating_point_v<D>, double,
                                          std::conditional_t<std::is_integral_v<D> || std::is_enum_v<D>, int64_t,
                                                             std::string>>>>;

template <class F>
struct signature : signature<decltype(&F::operator())> {};
template <class R, class... A>
struct signature<R (*)(A...)> {
  using result = R;
  using args = std::tuple<A...>;
};
template <class R, class... A>
struct signature<R(A...)> : signature<R (*)(A...)> {};
template <class C, class R, class... A>
struct signature<R (C::*)(A...) const> : signature<R (*)(A...)> {};
template <class C, class R, class... A>
struct signature<R (C::*)(A...)> : signature<R (*)(A...)> {};

template <class F, class R, class... A>
auto torch_kernel(F f, std::tuple<A...>*) {
  static_assert(((std::is_arithmetic_v<std::decay_t<A>> || std::is_enum_v<std::decay_t<A>>) && ...),
                "fp8gemm hub shim: an entry's arguments are integers, bools or floats");
  return [f](torch_arg_t<A>... a) -> torch_result_t<R> {
    try {
      if constexpr (std::is_void_v<R>) {
        f(static_cast<std::decay_t<A>>(a)...);
      } else if constexpr (std::is_same_v<torch_result_t<R>, std::string>) {
        return to_json(f(static_cast<std::decay_t<A>>(a)...));
      } else {
        return static_cast<torch_result_t<R>>(f(static_cast<std::decay_t<A>>(a)...));
      }
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());  // a ValueError in Python, as pybind11 raises it
    }
  };
}

}  // namespace detail

class tuple : public object {
  template <class... T>
  friend tuple make_tuple(const T&... v);
};

template <class... T>
tuple make_tuple(const T&... v) {
  tuple t;
  t.json_ = detail::join({detail::to_json(v)...}, "[", "]");
  return t;
}

class list : public object {
 public:
  list() { json_ = "[]"; }
  template <class T>
  void append(const T& v) {
    items_.push_back(detail::to_json(v));
    json_ = detail::join(items_, "[", "]");
  }

 private:
  std::vector<std::string> items_;
};

class dict : public object {
  struct item {
    dict& d;
    std::string key;
    template <class T>
    item& operator=(const T& v) {
      d.set(key, detail::to_json(v));
      return *this;
    }
  };

 public:
  dict() { json_ = "{}"; }
  item operator[](const char* key) { return item{*this, key}; }
  item operator[](const std::string& key) { return item{*this, key}; }

 private:
  void set(const std::string& key, std::string value) {
    bool found = false;
    for (auto& kv : items_) found = found || (kv.first == key && (kv.second = value, true));
    if (!found) items_.emplace_back(key, std::move(value));
    std::vector<std::string> parts;
    for (auto& kv : items_) parts.push_back(detail::quote(kv.first) + ": " + kv.second);
    json_ = detail::join(parts, "{", "}");
  }
  std::vector<std::pair<std::string, std::string>> items_;
};

// What PYBIND11_MODULE's body sees as `m`: def() registers an op of the extension's namespace.
class module_ {
 public:
  module_(torch::Library& lib, const char* arch) : lib_(lib), arch_(arch) {}

  std::string& doc() { return doc_; }

  template <class F, class... Extra>
  module_& def(const char* name, F f, const Extra&...) {
    using Sig = detail::signature<std::remove_pointer_t<F>>;
    using R = typename Sig::result;
    const std::string op = arch_ + "__" + name;
    lib_.def(op.c_str(), detail::torch_kernel<F, R>(f, static_cast<typename Sig::args*>(nullptr)));
    entries_.push_back(detail::quote(name) + ": " +
                       (std::is_same_v<detail::torch_result_t<R>, std::string> ? "\"json\"" : "\"value\""));
    return *this;
  }

  // The arch's `<arch>__entries` op, once its module body has run.
  void finish() {
    const std::string listing = detail::join(entries_, "{", "}");
    lib_.def((arch_ + "__entries").c_str(), [listing]() -> std::string { return listing; });
    fp8gemm_hub::compiled_arches().push_back(arch_);
  }

 private:
  torch::Library& lib_;
  std::string arch_, doc_;
  std::vector<std::string> entries_;
};

}  // namespace pybind11

#define FP8GEMM_HUB_STR_(x) #x
#define FP8GEMM_HUB_STR(x) FP8GEMM_HUB_STR_(x)
#define FP8GEMM_HUB_FRAGMENT(NS, LIB) TORCH_LIBRARY_FRAGMENT(NS, LIB)

#define PYBIND11_MODULE(name, variable)                                                   \
  static void fp8gemm_hub_module_body(pybind11::module_& variable);                      \
  FP8GEMM_HUB_FRAGMENT(TORCH_EXTENSION_NAME, fp8gemm_hub_lib) {                           \
    pybind11::module_ fp8gemm_hub_module(fp8gemm_hub_lib, FP8GEMM_HUB_STR(FP8GEMM_HUB_ARCH)); \
    fp8gemm_hub_module_body(fp8gemm_hub_module);                                          \
    fp8gemm_hub_module.finish();                                                          \
  }                                                                                       \
  static void fp8gemm_hub_module_body(pybind11::module_& variable)
