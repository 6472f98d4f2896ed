// The weight-gradient entry and its kernels (GemmType::kWgrad, wgrad_launch.cuh), with the package's ptxas options.
#include "wgrad_launch.cuh"
