// The Python lane: model families whose adapter is a Python torch module (docs/protocols.md §9,
// python/gatehouse_adapter), run under the same gates as the C++ families.
//
// libgatehouse_python_lane.so embeds CPython through the torch wheel's own libtorch_python and
// pybind11, so a Python module's tensors are the very at::Tensor objects the gates handle (no
// copies, one implementation of the gates). Each adapter's ModelSpec is registered as one more
// ModelFamily: config, construct, forward (plain and packed), the adapter's KV-cache decode
// when its SPEC gives one (init_cache / decode_forward) and the weight mapping call into
// python/gatehouse_adapter/lane.py with the GIL held; everything else is the gates' C++.
//
// The worker loads this library with dlopen only when a cell asks for the Python lane
// (plugin_loader.h LoadPythonLane), so a C++-lane worker never starts an interpreter.
#pragma once

/// Registers the Python-lane families named by `config_json`:
///   {"entries": ["package.module:SPEC", ...], "sys_path": ["dir", ...]}
/// sys_path entries go in front of the interpreter's path, in order (the adapter's installed
/// tree, then the worker's gatehouse_adapter package and the torch wheel's site-packages are
/// added by the library itself). Starts the interpreter on first use (no signal handlers: the
/// worker keeps its own) and leaves the GIL released between calls. Returns 0, or 1 with a
/// message in `error` (an entry that does not import, a spec that is not a ModelSpec, a family
/// name already registered).
extern "C" int gatehouse_python_lane_register(void* registry, const char* config_json,
                                              char* error, int error_size);

/// Takes the GIL for good (when the interpreter was started): the worker calls it on its main
/// thread just before exiting, so torch's thread-local Python objects on that thread
/// (DTensor's sharding-propagation cache) are released with the GIL held by the thread's
/// destructors, which glibc runs at exit before any atexit handler. Without it a worker whose
/// parallel gate ran DTensor ops aborted after run_end ("PyThreadState_Get: the function must
/// be called with the GIL held").
extern "C" void gatehouse_python_lane_before_exit();
