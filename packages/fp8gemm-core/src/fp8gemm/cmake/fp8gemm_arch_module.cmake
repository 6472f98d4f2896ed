# What every fp8gemm arch package's build shares, shipped with fp8gemm-core (fp8gemm.get_cmake_dir()):
#
#   fp8gemm_arch_module(PACKAGE <python package> TARGETS <sm_90a,...> ARCH_FLAGS <flags shown by fp8gemm info>
#                       COMPILER <compiler and version> SOURCES <binding .cpp ...>
#                       [CUDA_SOURCES <.cu ...>] [OBJECTS <prebuilt objects>] [INCLUDES ...] [LIBRARIES ...])
#
# builds the extension `_C` of <python package>: pybind11, no libtorch; CUDA_SOURCES compiled by nvcc into a
# static library with cudart linked statically (the module needs only the driver at run time); every symbol
# but PyInit__C hidden, so two builds of one package load into one process (tests/test_build_*.py); the
# core's include folder (FP8GEMM_INCLUDE) on every include path; build_info's macros (fp8gemm/build_info.hpp).
#   fp8gemm_enable_cuda(<package> <minimum nvcc version>)      before fp8gemm_arch_module in a CUDA package
#   fp8gemm_require_hip_compiler(<package> <compiler>)        before the HIP compile commands of a ROCm package
#
# stop the build at once, naming what to install, when the GPU compiler is missing or too old.
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
endfunction()
