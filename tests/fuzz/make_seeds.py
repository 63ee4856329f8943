#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/*).

Valid safetensors files come from the `safetensors` package itself (the project venv); the
edge cases are hand-made headers. Rerunning rewrites the same files (the corpus is committed;
libFuzzer never writes into it, see run_fuzz.sh).
  .venv/bin/python tests/fuzz/make_seeds.py
"""
import json
import pathlib
import struct

import numpy as np
from safetensors.numpy import save

HERE = pathlib.Path(__file__).resolve().parent
ST = HERE / "corpus" / "safetensors_header"
CELL = HERE / "corpus" / "cell_spec"


def raw(header: str, data: bytes = b"", length: int | None = None) -> bytes:
    h = header.encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def hdr(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def safetensors_seeds():
    seeds = {
        # Made by the safetensors package.
        "valid_empty": save({}),
        "valid_one_f32": save({"w": np.arange(4, dtype=np.float32).reshape(2, 2)}),
        "valid_many_dtypes": save(
            {
                "a_bool": np.array([True, False]),
                "b_u8": np.arange(3, dtype=np.uint8),
                "c_i8": np.arange(3, dtype=np.int8),
                "d_i16": np.arange(2, dtype=np.int16),
                "e_f16": np.ones(2, dtype=np.float16),
                "f_i32": np.arange(2, dtype=np.int32),
                "g_f64": np.ones(1, dtype=np.float64),
                "h_i64": np.arange(2, dtype=np.int64),
                "i_u64": np.arange(1, dtype=np.uint64),
            },
            metadata={"format": "pt", "note": "seed"},
        ),
        "valid_scalar_and_empty": save(
            {"scalar": np.array(3.0, dtype=np.float32), "zero": np.zeros((0, 4), np.float32)}
        ),
    }
    # Hand-made headers, valid ones first.
    seeds["valid_bf16_f8"] = raw(
        hdr({"b": entry("BF16", [2], 0, 4), "f8": entry("F8_E4M3", [3], 4, 7),
             "e8": entry("F8_E8M0", [1], 7, 8)}),
        bytes(range(8)),
    )
    seeds["valid_offsets_not_in_name_order"] = raw(
        hdr({"a": entry("U8", [2], 2, 4), "z": entry("U8", [2], 0, 2)}), b"\x01\x02\x03\x04")
    seeds["valid_padded_header"] = raw(hdr({"x": entry("I32", [1], 0, 4)}) + "    ", b"\0" * 4)
    seeds["valid_two_empty_same_offset"] = raw(
        hdr({"a": entry("F32", [0], 0, 0), "b": entry("F32", [0], 0, 0)}))
    seeds["valid_unicode_names"] = raw(
        hdr({"\u00e9t\u00e9": entry("U8", [1], 0, 1), "__metadata__": {"\u4e2d": "\u6587"}}),
        b"\x07")
    seeds["bad_short_file"] = b"\x02\0\0"
    seeds["bad_length_zero"] = raw("", length=0)
    seeds["bad_length_past_end"] = raw("{}", length=1000)
    seeds["bad_length_huge"] = raw("{}", length=2**63 + 5)
    seeds["bad_not_brace"] = raw('["x"]')
    seeds["bad_not_json"] = raw('{"a": {"dtype": "F32", ')
    seeds["bad_hole"] = raw(hdr({"a": entry("U8", [1], 1, 2)}), b"\0\0")
    seeds["bad_overlap"] = raw(
        hdr({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}), b"\0\0\0")
    seeds["bad_tail_bytes"] = raw(hdr({"a": entry("U8", [1], 0, 1)}), b"\0\0")
    seeds["bad_past_buffer"] = raw(hdr({"a": entry("U8", [4], 0, 4)}), b"\0")
    seeds["bad_negative_dim"] = raw(hdr({"a": entry("U8", [-1], 0, 0)}))
    seeds["bad_huge_dims"] = raw(
        hdr({"a": entry("F64", [2**62, 2**62], 0, 0)}))
    seeds["bad_dim_float"] = raw('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\0")
    seeds["bad_offsets_reversed"] = raw(hdr({"a": entry("U8", [0], 5, 0)}))
    seeds["bad_offsets_negative"] = raw(hdr({"a": entry("U8", [1], -1, 0)}))
    seeds["bad_dtype_unknown"] = raw(hdr({"a": entry("Q7", [1], 0, 1)}), b"\0")
    seeds["bad_dtype_subbyte"] = raw(hdr({"a": entry("F4", [2], 0, 1)}), b"\0")
    seeds["bad_dtype_not_string"] = raw('{"a":{"dtype":[[["F32"]]],"shape":[],"data_offsets":[0,4]}}')
    seeds["bad_missing_shape"] = raw('{"a":{"dtype":"U8","data_offsets":[0,1]}}', b"\0")
    seeds["bad_entry_not_object"] = raw('{"a":[1,2,3]}')
    seeds["bad_duplicate_key"] = raw(
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    seeds["bad_duplicate_inner_key"] = raw(
        '{"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    seeds["bad_metadata_value"] = raw('{"__metadata__":{"k":1}}')
    seeds["bad_metadata_not_object"] = raw('{"__metadata__":"x"}')
    seeds["bad_invalid_utf8_name"] = struct.pack("<Q", 9) + b'{"\xff":1}'
    # 65 levels: over the nesting limit (100k levels overflowed the stack when the error
    # message dumped the value; tests/worker/safetensors_test.cc has that regression).
    seeds["bad_nested_too_deep"] = raw(
        '{"a":{"dtype":' + "[" * 63 + "]" * 63 + ',"shape":[],"data_offsets":[0,0]}}')
    return seeds


def body(**fields):
    base = {"repository": "https://example.com/org/adapter.git", "branch": "main",
            "model_family": "llama", "checkpoint": "/data/ckpt/checkpoint"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


def cell_seeds():
    commit = "0123456789ABCDEF0123456789abcdef01234567"
    return {
        "valid_minimal": body(),
        "valid_commit_only": body(branch=None, commit=commit, repository="/srv/git/adapter"),
        "valid_full": body(
            commit=commit, reference="/data/ckpt/reference/", precision="bf16", mode="cuda_graph",
            device="cuda", topology={"tp": 2, "dp": 2, "pp": 1, "ep": 2},
            training={"steps": 3, "lr": 1e-4, "seed": 7}, decode={"max_new_tokens": 16},
            env={"OMP_NUM_THREADS": "2", "CUDA_LAUNCH_BLOCKING": "1"},
            phases=["performance", "load", "construct", "config", "identity"], runtime={"torch": "2.11.0"}),
        "valid_paths_to_normalise": body(checkpoint="/data/./x/../ckpt//checkpoint/",
                                         repository="/srv//git/../git/adapter/"),
        "valid_lr_integer": body(training={"lr": 1}),
        "valid_runtime_cuda": body(device="cuda", runtime={"torch": "2.11.0", "cuda": "13.0"}),
        "valid_unicode_env": body(env={"GREETING": "h\u00e9llo \u4e16\u754c"}),
        "valid_root_checkpoint": body(checkpoint="/"),
        "bad_not_json": b'{"repository": ',
        "bad_not_object": b"[1, 2, 3]",
        "bad_empty": b"",
        "bad_unknown_field": body(colour="blue"),
        "bad_missing_checkpoint": body(checkpoint=None),
        "bad_no_branch_or_commit": body(branch=None),
        "bad_relative_repository": body(repository="adapter"),
        "bad_commit_short": body(commit="abc123"),
        "bad_family": body(model_family="gpt9"),
        "bad_relative_checkpoint": body(checkpoint="data/ckpt"),
        "bad_precision": body(precision="fp8"),
        "bad_topology_string": body(topology={"tp": "2"}),
        "bad_topology_float": body(topology={"tp": 2.0}),
        "bad_topology_over_cap": body(topology={"tp": 8, "dp": 8, "pp": 2}),
        "bad_topology_huge": body(topology={"tp": 2147483647, "dp": 2147483647,
                                            "pp": 2147483647}),
        "bad_topology_unsigned": body(topology={"tp": 18446744073709551615}),
        "bad_steps": body(training={"steps": 1}),
        "bad_lr_negative": body(training={"lr": -0.5}),
        "bad_seed_negative": body(training={"seed": -1}),
        "bad_env_name": body(env={"A=B": "x"}),
        "bad_env_value": body(env={"A": 1}),
        "bad_phases_empty": body(phases=[]),
        "bad_phases_unknown": body(phases=["load", "warp"]),
        "bad_phases_duplicate": body(phases=["load", "load"]),
        "bad_phases_prerequisite": body(phases=["identity", "config", "load"]),
        "bad_decode_zero": body(decode={"max_new_tokens": 0}),
        "bad_runtime_field": body(runtime={"rocm": "6.2"}),
        "bad_runtime_cuda": body(runtime={"cuda": "13"}),
        "bad_long_unicode_value": body(precision="\u00e9" * 60),
        "bad_invalid_utf8": b'{"repository": "\xff\xfe"}',
        # 65 levels: over the nesting limit (200k levels overflowed the stack when the error
        # message dumped the value; tests/controller/cell_identity_test.cc has that regression).
        "bad_nested_too_deep": body()[:-1] + b', "topology": ' + b"[" * 64
        + b"]" * 64 + b"}",
        "bad_steps_huge": body(training={"steps": 1000000000}),
        "bad_decode_huge": body(decode={"max_new_tokens": 100000000}),
        "bad_lr_huge": body(training={"lr": 10}),
        "bad_env_nul": body(env={"A": "x\u0000y"}),
        # Frozen specs (docs/protocols.md §2), as the agent and the worker read them.
        "frozen_full": frozen(),
        "frozen_pinned": frozen(runtime={"torch": "2.11.0", "device": "cuda", "cuda": "13.0",
                                         "gpu_model": "H200"}),
        "bad_frozen_missing_launch": frozen(launch=None),
        "bad_frozen_gpu_model_on_cpu": frozen(runtime={"torch": "2.11.0", "device": "cpu",
                                                       "gpu_model": "H200"}),
    }


def frozen(**members) -> bytes:
    """A frozen spec (every member), with `members` replaced (None removes one)."""
    spec = {
        "spec_version": 1, "repository": "/srv/git/adapter",
        "commit": "0123456789abcdef0123456789abcdef01234567", "model_family": "llama",
        "checkpoint": {"path": "/data/ckpt/checkpoint", "digest": "sha256:" + "c" * 64},
        "reference": {"path": "/data/ckpt/reference", "digest": "sha256:" + "e" * 64},
        "runtime": {"torch": "2.11.0", "device": "cpu"},
        "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
        "topology": {"tp": 1, "dp": 1, "pp": 1, "ep": 1}, "precision": "fp32", "mode": "eager",
        "decode": {"max_new_tokens": 32, "sampling": "greedy"},
        "training": {"steps": 2, "lr": 0.001, "seed": 1234}, "env": {},
        "phases": ["identity", "config", "load", "inference"],
    }
    for key, value in members.items():
        if value is None:
            spec.pop(key)
        else:
            spec[key] = value
    return json.dumps(spec).encode()


def write(directory: pathlib.Path, seeds: dict):
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (directory / name).write_bytes(data)


if __name__ == "__main__":
    write(ST, safetensors_seeds())
    write(CELL, cell_seeds())
