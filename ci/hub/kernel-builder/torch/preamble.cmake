cmake_minimum_required(VERSION 3.26)

# Set Intel SYCL compiler before project() call
find_program(ICX_COMPILER icx)
find_program(ICPX_COMPILER icpx)

if(ICX_COMPILER OR ICPX_COMPILER)
  set(CMAKE_C_COMPILER ${ICX_COMPILER})

 if(WIN32)
    set(CMAKE_CXX_COMPILER ${ICX_COMPILER})
  else()
    set(CMAKE_CXX_COMPILER ${ICPX_COMPILER})
  endif()
endif()

project({{name}} LANGUAGES CXX)

install(CODE "set(CMAKE_INSTALL_LOCAL_ONLY TRUE)" ALL_COMPONENTS)

include(FetchContent)
file(MAKE_DIRECTORY ${FETCHCONTENT_BASE_DIR}) # Ensure the directory exists
message(STATUS "FetchContent base directory: ${FETCHCONTENT_BASE_DIR}")

set(HIP_SUPPORTED_ARCHS "gfx906;gfx908;gfx90a;gfx942;gfx950;gfx1030;gfx1100;gfx1101;gfx1200;gfx1201")

# Make Torch CMake machinery happy. Whatever we use does not matter, since
# we set the arches per-file later anyway.
set(ENV{PYTORCH_ROCM_ARCH} "${HIP_SUPPORTED_ARCHS}")

include(CheckCXXCompilerFlag)
include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cmake/kernel.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cmake/get_gpu_lang.cmake)

if(DEFINED Python3_EXECUTABLE)
  # Allow passing through the interpreter (e.g. from setup.py).
  find_package(Python3 COMPONENTS Development Development.SABIModule Interpreter)
  if (NOT Python3_FOUND)
    message(FATAL_ERROR "Unable to find python matching: ${EXECUTABLE}.")
  endif()
else()
  find_package(Python3 REQUIRED COMPONENTS Development Development.SABIModule Interpreter)
endif()

get_gpu_lang(DETECTED_GPU_LANG)
set(GPU_LANG "${DETECTED_GPU_LANG}" CACHE STRING "GPU language")
gpu_lang_to_backend(BACKEND "${GPU_LANG}")
message(STATUS "Using backend: ${BACKEND}, GPU language: ${GPU_LANG}")

set(OPS_NAME "_{{kernel_name}}_${BACKEND}_{{ kernel_unique_id }}")

append_cmake_prefix_path("torch" "torch.utils.cmake_prefix_path")

find_package(Torch REQUIRED)

run_python(TORCH_VERSION "import torch; print(torch.__version__.split('+')[0])" "Failed to get Torch version")

{% if torch_minver %}
if (TORCH_VERSION VERSION_LESS {{ torch_minver }})
  message(FATAL_ERROR "Torch version ${TORCH_VERSION} is too old. "
    "Minimum required version is {{ torch_minver }}.")
endif()
{% endif %}

{% if torch_maxver %}
if (TORCH_VERSION VERSION_GREATER {{ torch_maxver }})
  message(FATAL_ERROR "Torch version ${TORCH_VERSION} is too new. "
    "Maximum supported version is {{ torch_maxver }}.")
endif()
{% endif %}

{% if stable_abi %}
# `stable-abi` may cover only some backends, so select the version for the
# backend detected at configure time (empty when it does not use the stable ABI).
{% for entry in stable_abi %}
set(_STABLE_ABI_VERSION_{{ entry.backend }} "{{ entry.version }}")
{% endfor %}
set(_STABLE_ABI_VERSION "${_STABLE_ABI_VERSION_${BACKEND}}")

if(_STABLE_ABI_VERSION)
  if (TORCH_VERSION VERSION_LESS ${_STABLE_ABI_VERSION})
    message(FATAL_ERROR "Torch version ${TORCH_VERSION} is less than the stable ABI "
      "version ${_STABLE_ABI_VERSION}. Cannot build with stable ABI targeting a newer version of Torch.")
  endif()

  # From the Torch docs: TORCH_TARGET_VERSION (((0ULL + major) << 56) | ((0ULL + minor) << 48))
  string(REPLACE "." ";" _STABLE_ABI_VERSION_LIST "${_STABLE_ABI_VERSION}")
  list(GET _STABLE_ABI_VERSION_LIST 0 _STABLE_ABI_MAJOR)
  list(GET _STABLE_ABI_VERSION_LIST 1 _STABLE_ABI_MINOR)
  math(EXPR _STABLE_ABI_HEX "(${_STABLE_ABI_MAJOR} << 56) | (${_STABLE_ABI_MINOR} << 48)" OUTPUT_FORMAT HEXADECIMAL)

  add_compile_definitions(-DTORCH_TARGET_VERSION=${_STABLE_ABI_HEX})
endif()
{% endif %}

option(BUILD_ALL_SUPPORTED_ARCHS "Build all supported architectures" off)

if(DEFINED CMAKE_CUDA_COMPILER_VERSION AND
   CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0)
 set(CUDA_DEFAULT_KERNEL_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;10.0;11.0;12.0;12.1+PTX")
elseif(DEFINED CMAKE_CUDA_COMPILER_VERSION AND
   CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
 set(CUDA_DEFAULT_KERNEL_ARCHS "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;12.0+PTX")
else()
  set(CUDA_DEFAULT_KERNEL_ARCHS "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0+PTX")
endif()

# Basic checks for each GPU language.
if(GPU_LANG STREQUAL "CUDA")
  if(NOT CUDA_FOUND)
    message(FATAL_ERROR "GPU language is set to CUDA, but cannot find CUDA toolkit")
  endif()

  {% if cuda_minver %}
    if (CUDA_VERSION VERSION_LESS {{ cuda_minver }})
      message(FATAL_ERROR "CUDA version ${CUDA_VERSION} is too old. "
        "Minimum required version is {{ cuda_minver }}.")
    endif()
  {% endif %}

  {% if cuda_maxver %}
    if (CUDA_VERSION VERSION_GREATER {{ cuda_maxver }})
      message(FATAL_ERROR "CUDA version ${CUDA_VERSION} is too new. "
        "Maximum version is {{ cuda_maxver }}.")
    endif()
  {% endif %}

  # This clears out -gencode arguments from `CMAKE_CUDA_FLAGS`, which we need
  # to set our own set of capabilities.
  clear_gencode_flags()

  # Get the capabilities without +PTX suffixes, so that we can use them as
  # the target archs in the loose intersection with a kernel's capabilities.
  cuda_remove_ptx_suffixes(CUDA_ARCHS "${CUDA_DEFAULT_KERNEL_ARCHS}")
  message(STATUS "CUDA base archs used for intersection with kernel archs: ${CUDA_ARCHS}")

  if(BUILD_ALL_SUPPORTED_ARCHS)
    set(CUDA_KERNEL_ARCHS "${CUDA_DEFAULT_KERNEL_ARCHS}")
  else()
    try_run_python(CUDA_KERNEL_ARCHS SUCCESS "import torch; cc=torch.cuda.get_device_capability(); print(f\"{cc[0]}.{cc[1]}\")" "Failed to get CUDA capability")
    if(NOT SUCCESS)
      message(WARNING "Failed to detect CUDA capability, using default capabilities.")
      set(CUDA_KERNEL_ARCHS "${CUDA_DEFAULT_KERNEL_ARCHS}")
    endif()
  endif()

  message(STATUS "Default CUDA kernel architectures: ${CUDA_KERNEL_ARCHS}")

  if(NVCC_THREADS AND GPU_LANG STREQUAL "CUDA")
    message(STATUS "Using nvcc with: -threads=${NVCC_THREADS}")
    list(APPEND GPU_FLAGS "--threads=${NVCC_THREADS}")
  endif()

  # TODO: deprecate one of these settings.
  add_compile_definitions(USE_CUDA=1)
  add_compile_definitions(CUDA_KERNEL)
elseif(GPU_LANG STREQUAL "HIP")
  if(NOT HIP_FOUND AND NOT PYTORCH_FOUND_HIP)
    message(FATAL_ERROR "GPU language is set to HIP, but cannot find ROCm toolkit")
  endif()

  # Importing torch recognizes and sets up some HIP/ROCm configuration but does
  # not let cmake recognize .hip files. In order to get cmake to understand the
  # .hip extension automatically, HIP must be enabled explicitly.
  enable_language(HIP)

  set(ROCM_ARCHS ${HIP_SUPPORTED_ARCHS})
  message(STATUS "ROCM supported target architectures: ${ROCM_ARCHS}")

  # TODO: deprecate one of these settings.
  add_compile_definitions(USE_ROCM=1)
  add_compile_definitions(ROCM_KERNEL)
elseif(GPU_LANG STREQUAL "CPU")
  add_compile_definitions(CPU_KERNEL)
  set(CMAKE_OSX_DEPLOYMENT_TARGET "15.0" CACHE STRING "Minimum macOS deployment version")
elseif(GPU_LANG STREQUAL "METAL")
  set(CMAKE_OSX_DEPLOYMENT_TARGET "26.0" CACHE STRING "Minimum macOS deployment version")
  enable_language(C OBJC OBJCXX)

  add_compile_definitions(METAL_KERNEL)

  # Initialize lists for Metal shader sources and their include directories
  set(ALL_METAL_SOURCES)
  set(METAL_INCLUDE_DIRS)
elseif(GPU_LANG STREQUAL "SYCL")
  if(NOT ICX_COMPILER AND NOT ICPX_COMPILER)
    message(FATAL_ERROR "Intel SYCL C++ compiler (icpx) and/or C compiler (icx) not found. Please install Intel oneAPI toolkit.")
  endif()

  execute_process(
    COMMAND ${ICPX_COMPILER} --version
    OUTPUT_VARIABLE ICPX_VERSION_OUTPUT
    OUTPUT_STRIP_TRAILING_WHITESPACE
  )
  string(REGEX MATCH "[0-9]+\\.[0-9]+" DPCPP_VERSION "${ICPX_VERSION_OUTPUT}")
  set(DPCPP_VERSION "${DPCPP_VERSION}" CACHE STRING "DPCPP major.minor version")

  # On Windows, use icx (MSVC-compatible) for C++ to work with Ninja generator
  # On Linux, use icpx (GNU-compatible) for C++
  if(WIN32)
    message(STATUS "Using Intel SYCL C++ compiler: ${ICX_COMPILER} and C compiler: ${ICX_COMPILER} Version: ${DPCPP_VERSION} (Windows MSVC-compatible mode)")
  else()
    message(STATUS "Using Intel SYCL C++ compiler: ${ICPX_COMPILER} and C compiler: ${ICX_COMPILER} Version: ${DPCPP_VERSION}")
  endif()


  # --- SYCL fat-binary flags ------------------------------------------------
  # One .so carries an AOT image per GPU in SYCL_AOT_DEVICES plus a spir64 JIT
  # fallback; the runtime picks the matching image at load time.
  # These variables are the single source of truth: a dependency may change them
  # and call xpu_compose_sycl_flags() again to rebuild the flags.
  set(SYCL_OFFLOAD_TARGETS "spir64_gen,spir64")
  set(SYCL_AOT_DEVICES "pvc,xe-lpg,ats-m150")
  set(SYCL_AOT_BACKEND_OPTIONS " -cl-intel-enable-auto-large-GRF-mode -cl-poison-unsupported-fp64-kernels -cl-intel-greater-than-4GB-buffer-required")
  set(SYCL_SPIRV_EXT "")

  # Rebuild sycl_flags (compile) and sycl_link_flags (link) from the variables
  # above. A macro so it runs in the including scope and can be re-invoked.
  #
  # -foffload-fp32-prec-* keeps fp32 division and sqrt IEEE correctly rounded,
  # matching PyTorch; both the compile and the link step need them.
  macro(xpu_compose_sycl_flags)
    set(sycl_flags
      "-fPIC;-fsycl;-fhonor-nans;-fhonor-infinities;-fno-associative-math;-fno-approx-func;-foffload-fp32-prec-div;-foffload-fp32-prec-sqrt;-fno-sycl-instrument-device-code;--offload-compress;-fsycl-targets=${SYCL_OFFLOAD_TARGETS}")

    set(sycl_link_flags
      "-Wl,-z,noexecstack;-fsycl;--offload-compress;-foffload-fp32-prec-div;-foffload-fp32-prec-sqrt;-fsycl-targets=${SYCL_OFFLOAD_TARGETS}")

    # Backend options reach one target each: spir64_gen takes -device, the
    # intel_gpu_* aliases imply theirs. SHELL: stops CMake from deduplicating
    # the identical -options and silently dropping all but the first target.
    string(REPLACE "," ";" _sycl_aot_targets "${SYCL_OFFLOAD_TARGETS}")
    foreach(_tgt IN LISTS _sycl_aot_targets)
      if(_tgt STREQUAL "spir64_gen")
        string(APPEND sycl_link_flags
          ";SHELL:-Xsycl-target-backend=spir64_gen \"-device ${SYCL_AOT_DEVICES} -options '${SYCL_AOT_BACKEND_OPTIONS}'\"")
      elseif(_tgt MATCHES "^intel_gpu_")
        string(APPEND sycl_link_flags
          ";SHELL:-Xsycl-target-backend=${_tgt} \"-options '${SYCL_AOT_BACKEND_OPTIONS}'\"")
      endif()
    endforeach()

    # SYCL_SPIRV_EXT must be a COMPLETE list (translator replaces, not merges).
    # A custom -spirv-ext only reaches an image whose triple matches the exact
    # fsycl-targets alias, so emit one -Xspirv-translator=<alias> per target.
    if(SYCL_SPIRV_EXT)
      string(REPLACE "," ";" _sycl_ext_targets "${SYCL_OFFLOAD_TARGETS}")
      foreach(_tgt IN LISTS _sycl_ext_targets)
        string(APPEND sycl_link_flags
          ";SHELL:-Xspirv-translator=${_tgt} -spirv-ext=${SYCL_SPIRV_EXT}")
      endforeach()
    endif()
  endmacro()

  xpu_compose_sycl_flags()
  set(GPU_FLAGS "${sycl_flags}")


  add_compile_definitions(XPU_KERNEL)
  add_compile_definitions(USE_XPU)
else()
  message(FATAL_ERROR "Unsupported GPU language: ${GPU_LANG}")
endif()

# Initialize SRC list for kernel and binding sources
set(SRC "")

include(${CMAKE_CURRENT_LIST_DIR}/cmake/build-variants.cmake)

# Generate build variant name.
{% if stable_abi %}
set(_STABLE_ABI_ARG "")
if(_STABLE_ABI_VERSION)
  set(_STABLE_ABI_ARG TORCH_STABLE_ABI "${_STABLE_ABI_VERSION}")
endif()
{% endif %}
if(GPU_LANG STREQUAL "CUDA")
  generate_build_name(BUILD_VARIANT_NAME "${TORCH_VERSION}" "cuda" "${CUDA_VERSION}" ${_STABLE_ABI_ARG})
elseif(GPU_LANG STREQUAL "HIP")
  run_python(ROCM_VERSION "import torch.version; print(torch.version.hip.split('.')[0] + '.' + torch.version.hip.split('.')[1])" "Failed to get ROCm version")
  generate_build_name(BUILD_VARIANT_NAME "${TORCH_VERSION}" "rocm" "${ROCM_VERSION}" ${_STABLE_ABI_ARG})
elseif(GPU_LANG STREQUAL "SYCL")
  generate_build_name(BUILD_VARIANT_NAME "${TORCH_VERSION}" "xpu" "${DPCPP_VERSION}" ${_STABLE_ABI_ARG})
elseif(GPU_LANG STREQUAL "METAL")
  generate_build_name(BUILD_VARIANT_NAME "${TORCH_VERSION}" "metal" "" ${_STABLE_ABI_ARG})
elseif(GPU_LANG STREQUAL "CPU")
  generate_build_name(BUILD_VARIANT_NAME "${TORCH_VERSION}" "cpu" "" ${_STABLE_ABI_ARG})
else()
  message(FATAL_ERROR "Cannot generate build name for unknown GPU_LANG: ${GPU_LANG}")
endif()

configure_file(
  ${CMAKE_CURRENT_LIST_DIR}/cmake/_ops.py.in
  ${CMAKE_CURRENT_SOURCE_DIR}/torch-ext/{{python_name}}/_ops.py
  @ONLY
)
