// CPU kernels that give the same bits wherever the operands lie in memory.
//
// MKL, torch's CPU BLAS, chooses code paths by the operands' alignment on some CPUs: on an
// AMD EPYC, 36 of 360 linear shapes (M 1..300, N 64..256, K 64..256) differ in the last bits
// between a 64-byte-aligned weight and the same weight at a 4-byte offset. A parameter the
// load gate adopts from the checkpoint's mapping lies where the safetensors file put it, and
// upstream's lies elsewhere, so the bit-exact bars (docs/bars.md) would fail on rounding alone.
// MKL's conditional numerical reproducibility (MKL_CBWR=AUTO,STRICT: the CPU's best code path,
// results independent of alignment) removes that; tools/refgen sets the same for upstream's
// run. MKL reads the variable at its first call, so it is set when this library loads, before
// any tensor math; a value already in the environment is kept.
#include <cstdlib>

namespace gatehouse::worker {
namespace {

[[maybe_unused]] const bool kMklReproducible = [] {
  return setenv("MKL_CBWR", "AUTO,STRICT", /*overwrite=*/0) == 0;
}();

}  // namespace
}  // namespace gatehouse::worker
