// A model family Gatehouse itself does not have, as a team adapting Ministral would add it to
// their adapter repository (tests/e2e/reference_cell_test.cc commits it next to models/).
#pragma once

#include <memory>

#include "gatehouse/worker/model_family.h"

namespace acme::ministral {

/// The "ministral" family: HF model_type "ministral" (transformers' MinistralConfig).
std::unique_ptr<gatehouse::worker::ModelFamily> MakeMinistralFamily();

}  // namespace acme::ministral
