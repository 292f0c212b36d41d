// gmm: grouped matrix multiplications for Mixture-of-Experts on CPUs (umbrella header).
#pragma once

#include "gmm/core/calibration.hpp"
#include "gmm/core/dtype.hpp"
#include "gmm/core/error.hpp"
#include "gmm/core/fp8.hpp"
#include "gmm/core/options.hpp"
#include "gmm/core/quantize.hpp"
#include "gmm/core/view.hpp"
#include "gmm/ops.hpp"
#include "gmm/passes.hpp"
#include "gmm/plan.hpp"
#include "gmm/recipe.hpp"
#include "gmm/ref/reference.hpp"
#include "gmm/trace.hpp"
