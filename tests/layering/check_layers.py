#!/usr/bin/env python3
"""Fails when a source of a layer includes, directly or through the repository's own headers,
a header that its layer must not know (docs/architecture.md, "Layers").

    check_layers.py --root <repo> --layer <name> <dir> <source>... [--layer ...]

<name> picks the rule below; the sources (relative to <dir> or absolute) are what CMake compiles
for that layer's library, so a file added to the library is checked without an edit here.
Quoted includes are followed through the repository (relative to the root or to the including
file); angle includes are leaves. Run with --self-test first: it plants a forbidden include in a
temporary layer and expects this check to fail on it.
"""
import argparse
import os
import re
import sys
import tempfile

# Per layer: include prefixes it must not reach. Storage: SQLite and the store; git: libgit2
# and the mirror; transports: Beast/Asio, gRPC/protobuf and the transport headers; LibTorch.
STORAGE = ["sqlite3.h", "controller/store/"]
GIT = ["git2.h", "git2/", "controller/git_mirror.h"]
TRANSPORT = ["boost/beast", "boost/asio", "boost/url", "grpc", "grpcpp/", "google/protobuf/",
             "gatehouse/agent/v1/", "controller/http_server.h", "controller/http_types.h",
             "controller/rest_api.h", "controller/agent_service.h", "agent/agent_client.h"]
TORCH = ["torch/", "ATen/", "c10/"]
RULES = {
    # The controller's domain: identity, scheduling, attempt states, reports.
    "controller-domain": STORAGE + GIT + TRANSPORT + TORCH
    + ["controller/controller_core.h", "controller/auth.h", "agent/", "gatehouse/worker/"],
    # ControllerCore and tokens: domain + store, no transport, no git.
    "controller-core": GIT + TRANSPORT + TORCH + ["sqlite3.h", "agent/", "gatehouse/worker/"],
    # The agent's core: no gRPC (agent_client is its transport), no controller, no LibTorch.
    "agent-core": TRANSPORT + TORCH + ["controller/", "sqlite3.h"],
    # Model families know the worker SDK only.
    "models": STORAGE + GIT + TRANSPORT + ["agent/", "controller/"],
    # The gatehouse CLI: a REST client (Beast) and nothing of the services or the worker.
    "cli": STORAGE + GIT + TORCH + ["grpc", "grpcpp/", "google/protobuf/", "gatehouse/agent/v1/",
                                    "controller/", "agent/", "gatehouse/worker/"],
    # `gatehouse run`: the agent's core and the controller's domain, never their storage,
    # git mirror, transports or the worker's LibTorch.
    "local": STORAGE + GIT + TRANSPORT + TORCH + ["controller/controller_core.h",
                                                  "gatehouse/worker/"],
    # common/: shared by every process; knows none of them.
    "common": STORAGE + GIT + TRANSPORT + TORCH + ["agent/", "controller/", "gatehouse/worker/"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return INCLUDE.findall(f.read())


def resolve(root, including, name):
    for base in (os.path.dirname(including), root, os.path.join(root, "worker_lib", "include")):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(candidate) and candidate.startswith(root):
            return candidate
    return None


def violations(root, rule, sources):
    """(source, chain, include) for every forbidden include reachable from `sources`."""
    found = []
    for source in sources:
        seen = set()
        stack = [(source, [os.path.relpath(source, root)])]
        while stack:
            path, chain = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            for kind, name in includes(path):
                if any(name.startswith(p) for p in rule):
                    found.append((chain[0], " -> ".join(chain[1:] + [name]) or name, name))
                    continue
                if kind == '"':
                    nested = resolve(root, path, name)
                    if nested:
                        stack.append((nested, chain + [os.path.relpath(nested, root)]))
    return found


def check(root, layers):
    failed = 0
    for name, directory, files in layers:
        if name not in RULES:
            sys.exit(f"check_layers: unknown layer '{name}' (known: {', '.join(RULES)})")
        sources = [f if os.path.isabs(f) else os.path.join(directory, f) for f in files]
        sources = [os.path.normpath(s) for s in sources if re.search(r"\.(cc|h)$", s)]
        bad = violations(root, RULES[name], sources)
        for source, chain, include in bad:
            print(f"layer {name}: {source} reaches <{include}> ({chain})")
        print(f"layer {name}: {len(sources)} sources, {len(bad)} forbidden includes")
        failed += len(bad)
    return failed


def self_test():
    """A planted storage include in a domain source, direct and through a header, must fail."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "controller", "store"))
        def write(rel, text):
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("controller/store/store.h", "#include <sqlite3.h>\n")
        write("controller/innocent.h", '#include "controller/store/store.h"\n')
        write("controller/direct.cc", "#include <grpcpp/grpcpp.h>\n")
        write("controller/indirect.cc", '#include "controller/innocent.h"\n')
        write("controller/clean.cc", "#include <vector>\n#include \"controller/clean.h\"\n")
        write("controller/clean.h", "#include <string>\n")
        d = os.path.join(root, "controller")
        assert check(root, [("controller-domain", d, ["direct.cc"])]) == 1
        assert check(root, [("controller-domain", d, ["indirect.cc"])]) == 1
        assert check(root, [("controller-domain", d, ["clean.cc"])]) == 0
    print("self-test: planted includes caught")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--self-test", action="store_true")
    args, rest = parser.parse_known_args()
    if args.self_test:
        self_test()
    layers = []
    while rest:
        if rest[0] != "--layer" or len(rest) < 3:
            sys.exit("usage: check_layers.py --root R [--self-test] --layer NAME DIR SOURCE...")
        name, directory, rest = rest[1], rest[2], rest[3:]
        files = []
        while rest and rest[0] != "--layer":
            files.append(rest.pop(0))
        layers.append((name, directory, files))
    root = os.path.realpath(args.root)
    sys.exit(1 if check(root, layers) else 0)


if __name__ == "__main__":
    main()
