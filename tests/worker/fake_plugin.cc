// The fake family as a plugin shared library, for the plugin loader and worker CLI tests.
#include "fake_family.h"

namespace {

gatehouse::Status RegisterFake(gatehouse::worker::FamilyRegistry& registry) {
  return registry.Register(std::make_unique<gatehouse::worker::testing::FakeFamily>());
}

}  // namespace

GATEHOUSE_DEFINE_PLUGIN(RegisterFake)
