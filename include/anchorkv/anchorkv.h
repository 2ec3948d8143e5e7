// Umbrella header for the anchorkv library.
#pragma once

#include "anchorkv/attention.h"
#include "anchorkv/baselines.h"
#include "anchorkv/cache.h"
#include "anchorkv/cachefile.h"
#include "anchorkv/config.h"
#include "anchorkv/stats.h"
#include "anchorkv/status.h"
#include "anchorkv/tensor.h"
