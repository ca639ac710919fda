// The one precompiled header of every torch-using target (see cmake/RpgTargets.cmake).
// <ATen/ATen.h> rather than <torch/torch.h>: measured on 2 cores, a TU using this PCH
// compiles in ~2 s, one using a <torch/torch.h> PCH in ~9 s. Files that need torch::nn or
// torch::optim include those headers themselves.
#pragma once

#include <ATen/ATen.h>
