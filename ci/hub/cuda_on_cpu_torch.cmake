# Configure kernel-builder's CUDA project with a CPU-only torch (CI machines without a CUDA torch): the project's
# CMAKE_PROJECT_INCLUDE, with -DGPU_LANG=CUDA. It enables CUDA and finds the toolkit as a CUDA torch's Caffe2 config
# would (CUDA_FOUND, CUDA_VERSION, CUDA::cudart); the result links against the CPU libtorch, so it proves the sources
# compile and link, not that the library runs on a GPU (ci/gpu/hub_builder.sh builds with a CUDA torch for that).
set(CMAKE_CUDA_ARCHITECTURES OFF)  # as a CUDA torch leaves it: the arches come per source (set_gencode_flags_for_srcs)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CUDA_FOUND TRUE)
set(CUDA_VERSION "${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}")
set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -DFP8GEMM_HUB_CPU_TORCH")  # clear_gencode_flags() needs a non-empty value
