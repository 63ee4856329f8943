// A complete, valid cell spec for tests that need one (the scheduler's demand, the agent's
// launch, the worker's run spec, the report): every member set, nothing read from disk.
#pragma once

#include <string>

#include "common/cell_spec.h"
#include "common/phases.h"

namespace gatehouse::testing {

/// A CPU cell of the llama family at commit "aaaa...a" with the default phases; callers
/// change the members their test is about.
inline CellSpec SampleSpec() {
  CellSpec s;
  s.repository = "/repos/adapter";
  s.commit = std::string(40, 'a');
  s.model_family = "llama";
  s.checkpoint = {"/data/llama-tiny/checkpoint", "sha256:" + std::string(64, '1')};
  s.reference = {"/data/llama-tiny/reference", "sha256:" + std::string(64, '2')};
  s.runtime.torch = "2.11.0";
  s.phases.assign(kDefaultPhases.begin(), kDefaultPhases.end());
  return s;
}

/// SampleSpec() in its canonical JSON form, as the store holds it.
inline std::string SampleSpecJson() { return CanonicalSpecJson(SampleSpec()); }

}  // namespace gatehouse::testing
