# What every fp8gemm arch package's build shares, shipped with fp8gemm-core (fp8gemm.get_cmake_dir()). An arch
# package's CMakeLists.txt finds this file, then makes one call, named by its platform; its project() name is the
# Python package:
#
#   fp8gemm_cuda_arch_module(CUDA_ARCH <90a, 120, ...> NVCC <minimum nvcc version>
#                            SOURCES <binding .cpp ...> CUDA_SOURCES <.cu ...>)
#     nvcc (refused, naming what to install, when missing or older), machine code for sm_<CUDA_ARCH> only.
#   fp8gemm_hip_arch_module(OFFLOAD_ARCH <gfx942:sramecc+:xnack-, ...> SOURCES <host .cpp ...>
#                           HIP_SOURCES <.hip ...> INCLUDES <folders>)
#     each .hip compiled by FP8GEMM_HIP_COMPILER (hipcc, or clang++ 19+ with FP8GEMM_HEADER_LIGHT=ON: no HIP
#     headers) into the host object linked into _C, and its bare device code object kept for ISA inspection
#     (isa/<unit>-<target>.elf) with the compiler's register/LDS/scratch report (isa/<unit>-resource-usage.txt).
#
# Both build the extension `_C` through
#
#   fp8gemm_arch_module(PACKAGE <python package> TARGETS <sm_90a,...> ARCH_FLAGS <flags shown by fp8gemm info>
#                       COMPILER <compiler and version> SOURCES <binding .cpp ...>
#                       [CUDA_SOURCES <.cu ...>] [OBJECTS <prebuilt objects>] [INCLUDES ...] [LIBRARIES ...])
#
# and, where the build environment has torch >= 2.10 (FP8GEMM_NATIVE_OPS=AUTO; ON requires it, OFF skips it), the
# native ops library `_native_ops` (fp8gemm_native_ops below).
#
# `_C`: pybind11, no libtorch; CUDA_SOURCES compiled by nvcc into a static library with cudart linked statically (the
# module needs only the driver at run time); every symbol but PyInit__C hidden, so two builds of one package load
# into one process (tests/test_build_*.py); the core's include folder (FP8GEMM_INCLUDE) on every include path;
# build_info's macros (fp8gemm/build_info.hpp).
include_guard(GLOBAL)

set(FP8GEMM_PYPI_NVCC "nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-cccl")

# A macro: enable_language must run in the CMakeLists' own scope.
macro(fp8gemm_enable_cuda package minimum)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR
      "${package} is compiled by nvcc >= ${minimum} (CUDA ${minimum} or newer), and none was found on PATH or in "
      "$CUDACXX. Install the CUDA toolkit (conda: cuda-nvcc, cuda-cudart-dev, cuda-cudart-static), or nvcc from "
      "PyPI: pip install ${FP8GEMM_PYPI_NVCC} (one release, e.g. 13.0.x), then put nvcc on PATH "
      "(docs/install.md, \"pip, from a checkout\").")
  endif()
  enable_language(CUDA)
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS ${minimum})
    message(FATAL_ERROR "${package} needs nvcc >= ${minimum}; ${CMAKE_CUDA_COMPILER} is ${CMAKE_CUDA_COMPILER_VERSION}.")
  endif()
endmacro()

function(fp8gemm_require_hip_compiler package compiler)
  find_program(_fp8gemm_hip_compiler NAMES ${compiler} NO_CACHE)
  if(NOT _fp8gemm_hip_compiler)
    message(FATAL_ERROR
      "${package} is compiled by ROCm 6.3's hipcc, or by LLVM's clang++ 19 or newer with "
      "FP8GEMM_HIP_COMPILER=clang++-19 FP8GEMM_HEADER_LIGHT=ON; '${compiler}' was not found on PATH. Install ROCm "
      "6.3 (conda: hipcc, hip-devel, rocm-device-libs) or clang-19 and libamdhip64 (docs/install.md).")
  endif()
endfunction()

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CUDA_STANDARD 17)
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG REQUIRED)
get_filename_component(FP8GEMM_INCLUDE "${CMAKE_CURRENT_LIST_DIR}/../include" ABSOLUTE)

function(fp8gemm_arch_module)
  cmake_parse_arguments(ARG "" "PACKAGE;TARGETS;ARCH_FLAGS;COMPILER" "SOURCES;CUDA_SOURCES;OBJECTS;INCLUDES;LIBRARIES" ${ARGN})
  foreach(required PACKAGE TARGETS ARCH_FLAGS COMPILER SOURCES)
    if(NOT ARG_${required})
      message(FATAL_ERROR "fp8gemm_arch_module: ${required} is required")
    endif()
  endforeach()
  pybind11_add_module(_C ${ARG_SOURCES} ${ARG_OBJECTS})
  if(ARG_CUDA_SOURCES)
    find_package(CUDAToolkit REQUIRED)
    # Kernels: a static library compiled by nvcc; the binding is plain C++ (pybind11 stays out of nvcc).
    add_library(${ARG_PACKAGE}_kernels STATIC ${ARG_CUDA_SOURCES})
    target_include_directories(${ARG_PACKAGE}_kernels PRIVATE ${FP8GEMM_INCLUDE} ${CUDAToolkit_INCLUDE_DIRS} ${ARG_INCLUDES})
    # Hidden symbols: default-visibility statics of inline and template functions are GNU_UNIQUE, shared with
    # any other build of the module loaded into the process.
    set_target_properties(${ARG_PACKAGE}_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Static
                          CUDA_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
    target_compile_options(${ARG_PACKAGE}_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 -lineinfo -Xptxas=-warn-spills>)
    target_link_libraries(_C PRIVATE ${ARG_PACKAGE}_kernels CUDA::cudart_static)
    target_include_directories(_C PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  target_link_libraries(_C PRIVATE ${ARG_LIBRARIES})
  target_include_directories(_C PRIVATE ${FP8GEMM_INCLUDE} ${ARG_INCLUDES})
  target_compile_definitions(_C PRIVATE FP8GEMM_TARGETS="${ARG_TARGETS}" FP8GEMM_ARCH_FLAGS="${ARG_ARCH_FLAGS}"
                                        FP8GEMM_COMPILER="${ARG_COMPILER}")
  # Nor anything else (cudart_static's symbols, typeinfo of std types): PyInit__C is the module's only export.
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/exports.map "{ global: PyInit__C; local: *; };\n")
  target_link_options(_C PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_BINARY_DIR}/exports.map")
  install(TARGETS _C LIBRARY DESTINATION ${ARG_PACKAGE})
  fp8gemm_native_ops(${ARG_PACKAGE})
endfunction()

set(FP8GEMM_NATIVE_OPS AUTO CACHE STRING "build the native ops library: AUTO (where torch >= 2.10 is importable), ON, OFF")
set(FP8GEMM_NATIVE_OPS_SOURCES "${CMAKE_CURRENT_LIST_DIR}/../csrc/native_ops.cpp"
                                "${CMAKE_CURRENT_LIST_DIR}/../csrc/native_moe.cpp"
                                "${CMAKE_CURRENT_LIST_DIR}/../csrc/native_training.cpp")

# `_native_ops`: fp8gemm/csrc/native_ops.cpp, the package's GEMM, quantizer and Linear layer as torch dispatcher ops in
# C++ under the namespace <package>, built against torch's stable ABI (TORCH_TARGET_VERSION 2.10: one build serves
# every later torch) and linked to torch's CPU libraries by name, which the process has loaded before it loads this one
# (the current-stream getter of its GPU library is looked up at load: a conda build has a CPU torch).
# Plain C++: the kernels stay in `_C`, whose entries the core hands over at load (fp8gemm/native.py).
function(fp8gemm_native_ops package)
  if(FP8GEMM_NATIVE_OPS STREQUAL "OFF")
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import os, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); assert v >= (2, 10), torch.__version__; d = os.path.dirname(torch.__file__); print(os.path.join(d, 'include') + ';' + os.path.join(d, 'lib'))"
    OUTPUT_VARIABLE torch_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_VARIABLE torch_error RESULT_VARIABLE torch_status)
  if(NOT torch_status EQUAL 0)
    if(FP8GEMM_NATIVE_OPS STREQUAL "ON")
      message(FATAL_ERROR "FP8GEMM_NATIVE_OPS=ON needs torch >= 2.10 in the build environment: ${torch_error}")
    endif()
    message(STATUS "fp8gemm: no torch >= 2.10 in the build environment: ${package} is built without _native_ops")
    return()
  endif()
  list(GET torch_dirs 0 torch_include)
  list(GET torch_dirs 1 torch_lib)
  set(torch_libraries)
  foreach(name torch_cpu c10)
    find_library(lib_${name} ${name} PATHS ${torch_lib} NO_DEFAULT_PATH NO_CACHE)
    if(lib_${name})
      list(APPEND torch_libraries ${lib_${name}})
    endif()
  endforeach()
  add_library(native_ops MODULE ${FP8GEMM_NATIVE_OPS_SOURCES})
  set_target_properties(native_ops PROPERTIES PREFIX "" OUTPUT_NAME _native_ops CXX_VISIBILITY_PRESET hidden
                        VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(native_ops PRIVATE ${FP8GEMM_INCLUDE} ${torch_include})
  target_compile_definitions(native_ops PRIVATE FP8GEMM_OPS_NAMESPACE=${package}
                                                TORCH_TARGET_VERSION=0x020a000000000000)
  target_link_libraries(native_ops PRIVATE ${torch_libraries} ${CMAKE_DL_LIBS})
  install(TARGETS native_ops LIBRARY DESTINATION ${package})
endfunction()

# A macro, as fp8gemm_enable_cuda is: enable_language must run in the CMakeLists' own scope.
macro(fp8gemm_cuda_arch_module)
  cmake_parse_arguments(_FP8GEMM_CUDA "" "CUDA_ARCH;NVCC" "SOURCES;CUDA_SOURCES" ${ARGN})
  set(CMAKE_CUDA_ARCHITECTURES "${_FP8GEMM_CUDA_CUDA_ARCH}-real")
  string(REPLACE "_" "-" _FP8GEMM_CUDA_DISTRIBUTION "${PROJECT_NAME}")
  fp8gemm_enable_cuda(${_FP8GEMM_CUDA_DISTRIBUTION} ${_FP8GEMM_CUDA_NVCC})
  fp8gemm_arch_module(
    PACKAGE ${PROJECT_NAME}
    TARGETS "sm_${_FP8GEMM_CUDA_CUDA_ARCH}"
    ARCH_FLAGS "-gencode arch=compute_${_FP8GEMM_CUDA_CUDA_ARCH},code=sm_${_FP8GEMM_CUDA_CUDA_ARCH}"
    COMPILER "nvcc ${CMAKE_CUDA_COMPILER_VERSION}"
    SOURCES ${_FP8GEMM_CUDA_SOURCES}
    CUDA_SOURCES ${_FP8GEMM_CUDA_CUDA_SOURCES})
endmacro()

# The device code is compiled by a HIP-capable clang: ROCm's hipcc (conda recipe, pixi rocm63) or Debian's clang++-19
# (CI, ISA checks). One explicit command serves both, without CMake's HIP language (which needs a full ROCm install).
function(fp8gemm_hip_arch_module)
  cmake_parse_arguments(ARG "" "OFFLOAD_ARCH" "SOURCES;HIP_SOURCES;INCLUDES" ${ARGN})
  set(FP8GEMM_HIP_COMPILER "hipcc" CACHE STRING "hipcc, or a clang++ with HIP support (e.g. clang++-19)")
  option(FP8GEMM_HEADER_LIGHT "compile the kernels without HIP headers (-nogpuinc -nogpulib)" OFF)
  string(REPLACE "_" "-" distribution "${PROJECT_NAME}")
  fp8gemm_require_hip_compiler(${distribution} ${FP8GEMM_HIP_COMPILER})
  find_path(HIP_INCLUDE_DIR hip/hip_runtime_api.h HINTS $ENV{ROCM_PATH}/include $ENV{CONDA_PREFIX}/include /opt/rocm/include)
  find_library(AMDHIP64 amdhip64 HINTS $ENV{ROCM_PATH}/lib $ENV{CONDA_PREFIX}/lib /opt/rocm/lib REQUIRED)
  string(REGEX REPLACE ":.*" "" target "${ARG_OFFLOAD_ARCH}")
  set(hip_flags -x hip -std=c++17 -O3 -fPIC --offload-arch=${ARG_OFFLOAD_ARCH})
  set(headers)
  foreach(dir ${ARG_INCLUDES})
    get_filename_component(dir "${dir}" ABSOLUTE)
    list(APPEND hip_flags -I${dir})
    file(GLOB dir_headers "${dir}/*.hpp")
    list(APPEND headers ${dir_headers})
  endforeach()
  list(APPEND hip_flags -I${FP8GEMM_INCLUDE})
  if(FP8GEMM_HEADER_LIGHT)
    list(APPEND hip_flags -nogpuinc -nogpulib)
  else()
    list(APPEND hip_flags -DFP8GEMM_HIP_HEADERS -I${HIP_INCLUDE_DIR})
  endif()
  set(device_objects)
  set(isa_files)
  foreach(source ${ARG_HIP_SOURCES})
    get_filename_component(unit "${source}" NAME_WE)
    get_filename_component(source "${source}" ABSOLUTE)
    set(obj ${CMAKE_CURRENT_BINARY_DIR}/${unit}.o)
    set(elf ${CMAKE_CURRENT_BINARY_DIR}/${unit}-${target}.elf)
    set(report ${CMAKE_CURRENT_BINARY_DIR}/${unit}-resource-usage.txt)
    add_custom_command(
      OUTPUT ${obj} ${elf} ${report}
      COMMAND ${FP8GEMM_HIP_COMPILER} ${hip_flags} -c ${source} -o ${obj}
      COMMAND ${FP8GEMM_HIP_COMPILER} ${hip_flags} --cuda-device-only --no-gpu-bundle-output
              -Rpass-analysis=kernel-resource-usage -c ${source} -o ${elf} 2> ${report}
      DEPENDS ${source} ${headers}
      COMMENT "HIP device code for ${ARG_OFFLOAD_ARCH}: ${unit}.hip")
    list(APPEND device_objects ${obj})
    list(APPEND isa_files ${elf} ${report})
  endforeach()
  fp8gemm_arch_module(
    PACKAGE ${PROJECT_NAME}
    TARGETS "${target}"
    ARCH_FLAGS "--offload-arch=${ARG_OFFLOAD_ARCH}"
    COMPILER "${FP8GEMM_HIP_COMPILER}"
    SOURCES ${ARG_SOURCES}
    OBJECTS ${device_objects}
    INCLUDES ${ARG_INCLUDES} ${HIP_INCLUDE_DIR}
    LIBRARIES ${AMDHIP64})
  target_compile_definitions(_C PRIVATE __HIP_PLATFORM_AMD__)
  install(FILES ${isa_files} DESTINATION ${PROJECT_NAME}/isa)
endfunction()
