#pragma once
// A deliberate layering error: io/ must not know training.
#include "cubelm/train/trainer.hpp"
