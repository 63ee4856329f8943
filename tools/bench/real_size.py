#!/usr/bin/env python3
"""Real-size benchmark: one validation cell at a real size (Qwen2.5-0.5B by default; --model
picks Llama-3.2-1B or a Llama-2-7B config) through the whole stack, on the CPU, beside
transformers on the same checkpoint in the same run.

Not a test: figures, printed as a table with the targets they are judged against
(tools/bench/README.md, "Real size").

What it does, in order:
  1. The checkpoint: the full Qwen2.5-0.5B config (tools/refgen/hub_configs/qwen2.5-0.5b.json:
     hidden 896, 24 layers, vocab 151936, tied) with random weights (seed 0), saved by
     transformers' save_pretrained in fp32 as one model.safetensors (about 1.98 GB), made by
     real_size_peer.py make-checkpoint and cached under --work-dir with a stamp (config +
     transformers version); --checkpoint DIR uses a ready one instead; --tiny scales the same
     config down (hidden 64, 2 layers, vocab 256) for a smoke run of a couple of minutes.
  2. The stack, as deploy/demo.sh starts it: a fresh SQLite DB and tokens
     (gatehouse-controller tokens create), the controller on 127.0.0.1 with free ports, one
     local agent (its work dir under --work-dir, kept between runs so its plugin build tree
     and ccache make later builds fast), and an adapter git repository holding a copy of
     models/. Both processes are stopped at the end, also on an error, Ctrl-C or SIGTERM.
  3. One validation cell for family qwen2 on the checkpoint, naming no reference (the
     controller creates the reference cell; the validation cell waits for it), phases
     identity, config, construct, load, inference, decode, packing, logprob_parity, training,
     save. The POST is timed:
     its first answer (submit latency) and, when the controller answers 202 {"state":
     "resolving"} while it digests the checkpoint (the same body is posted again after its
     Retry-After), the time until the cell id is known (digest time; equal to the latency
     for a 201/200 answer).
     Both cells are polled until the validation cell ends.
  4. transformers on the same checkpoint (real_size_peer.py, one process per measurement, so
     each has its own peak RSS): from_pretrained, the forwards of the reference cell's own
     probe prompts (read from its bundle) plus the cost of the gate's comparison, and the
     training gate's steps.
  5. The table: the controller's memory estimate per process (reference runner, worker rank:
     the cell API's memory_estimate, as GET answered right after the submit) against the
     measured peaks (the reference phase's peak_rss_bytes; the largest peak_rss_bytes of the
     validation phases) and their ratio; submit latency, digest time, reference time, build time, construct + load vs
     from_pretrained, the inference gate vs transformers' forwards, training vs transformers,
     peak RSS (load and the whole cell) vs transformers and as a multiple of the checkpoint's
     bytes, time to verdict; the targets and whether each is met; per phase the duration,
     RSS figures and CPU share (the worker's /proc/<pid>/stat sampled at each poll). --json
     FILE writes every figure, both cells' JSON and the peers' outputs.

Thread count: --threads N (default: the machine's CPU count) is given to every process
(OMP_NUM_THREADS and MKL_NUM_THREADS in the agent's environment, which the worker and the
reference runner inherit; torch.set_num_threads in the peers).

Models (--model): qwen2.5-0.5b (the default; family qwen2), llama-3.2-1b (family llama,
hub_configs/llama3.2-1b.json) and llama-2-7b (family llama, hub_configs/llama-2-7b.json).
--checkpoint-dtype float32|bfloat16 is how the checkpoint is saved (save_pretrained, or written
tensor by tensor in shards when it is larger than 6 GB: real_size_peer.py
make-sharded-checkpoint); --precision fp32|bf16 is the validation cell's precision (and the
dtype transformers' side runs in). --stop-if-refused ends the run (exit 3) when the controller
refuses the cell at submit (memory admission: a 400 naming the figures), printing its message;
--submit-only submits, reads the estimate and cancels the cells without running them.
--reuse-run keeps <work-dir>/run (the DB, artifacts) of the previous run, so a cell whose
reference cell passed there reuses that reference cell. --phases LIST submits those phases
only: another cell (a cell that passed is not run again: its inputs give the same verdict)
with the same reference cell.

Usage (from the repository root, with build/bin and build/sdk built):
  .venv/bin/python tools/bench/real_size.py                       # makes the checkpoint once
  .venv/bin/python tools/bench/real_size.py --checkpoint /tmp/q05/ckpt --json out.json
  .venv/bin/python tools/bench/real_size.py --tiny                # smoke run, minutes
Exit status: 0 when the run measured everything (targets met or not), 1 when the cell did not
pass or a step failed, 2 for usage errors, 3 when the controller refused the cell and
--stop-if-refused was given, 77 with --skip-missing when binaries are missing,
130 when interrupted (Ctrl-C, SIGTERM).
"""

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import phase_accounting  # tools/bench, beside this file (python puts the script's folder first)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HUB_CONFIGS = ROOT / "tools/refgen/hub_configs"
HUB_CONFIG = HUB_CONFIGS / "qwen2.5-0.5b.json"
# --tiny: the same config scaled down as tools/refgen/families/qwen2.py scales it.
TINY_OVERRIDES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      bos_token_id=1, eos_token_id=1)
# --model: a published config.json (tools/refgen/hub_configs/SOURCES.md) and the adapter family
# (models/gatehouse.recipe.json) that registers it; --tiny scales each down.
MODELS = {
    "qwen2.5-0.5b": {"config": HUB_CONFIG, "family": "qwen2", "label": "Qwen2.5-0.5B",
                     "tiny": TINY_OVERRIDES},
    "llama-3.2-1b": {"config": HUB_CONFIGS / "llama3.2-1b.json", "family": "llama",
                     "label": "Llama-3.2-1B", "tiny": dict(TINY_OVERRIDES, head_dim=16)},
    "llama-2-7b": {"config": HUB_CONFIGS / "llama-2-7b.json", "family": "llama",
                   "label": "Llama-2-7B", "tiny": dict(TINY_OVERRIDES, num_key_value_heads=4)},
}
CKPT_DTYPES = {"float32": 4, "bfloat16": 2}
# A checkpoint above this many bytes is written tensor by tensor (make-sharded-checkpoint):
# save_pretrained would hold the model (and, in bf16, its fp32 initialisation) at once.
STREAMED_ABOVE_BYTES = 6_000_000_000
REFUSED_RETURN_CODE = 3
CKPT_FORMAT = 1  # bump when the checkpoint recipe changes for the same config
PHASES = ["identity", "config", "construct", "load", "inference", "decode", "packing",
          "logprob_parity", "training", "save"]
TERMINAL = {"passed", "failed", "error", "blocked", "cancelled", "timed_out"}
BINARIES = ["gatehouse-controller", "gatehouse-agent", "gatehouse-worker"]
SKIP_RETURN_CODE = 77
AGENT_NAME = "bench-agent"
# Targets (the issue's): construct + load <= transformers' from_pretrained; inference gate <=
# 1.2 x transformers' forwards + the comparison's cost; peak RSS during load <= 1.2 x the
# checkpoint's bytes; the whole cell's peak RSS <= 4.5 x the checkpoint's bytes (fp32, AdamW).
INFERENCE_FACTOR = 1.2
LOAD_RSS_FACTOR = 1.2
CELL_RSS_FACTOR = 4.5


class BenchError(Exception):
    """A step of the benchmark failed: printed, exit 1."""


class Refused(BenchError):
    """The controller refused the submit (a 4xx answer; memory admission answers 400)."""

    def __init__(self, status, answer, answers):
        self.status, self.answer, self.answers = status, answer, answers
        message = answer.get("message") or answer.get("error") or json.dumps(answer)
        super().__init__(f"submit refused: {status} {message}")


def log(msg):
    print(f"[real_size] {msg}", file=sys.stderr, flush=True)


# --- small helpers --------------------------------------------------------------------------

def parse_utc(text):
    """The controller's UTC ISO-8601 time (2025-01-02T03:04:05.678Z) -> Unix seconds."""
    if not text:
        return None
    dt = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.replace(tzinfo=datetime.timezone.utc).timestamp()


def fmt_s(seconds):
    return "n/a" if seconds is None else f"{seconds:.2f} s"


def fmt_bytes(n):
    if n is None:
        return "n/a"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def fmt_x(ratio):
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def ratio(a, b):
    return a / b if a is not None and b else None


def checkpoint_dtype_of(directory):
    cfg = json.loads((Path(directory) / "config.json").read_text())
    return cfg.get("torch_dtype") or cfg.get("dtype") or "float32 (no dtype named)"


def dir_bytes(directory, pattern="*.safetensors"):
    return sum(p.stat().st_size for p in Path(directory).glob(pattern) if p.is_file())


def torch_facts():
    """(torch version without +local, LibTorch's CMake prefix), without importing torch."""
    version = importlib.metadata.version("torch").split("+", 1)[0]
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise BenchError("torch is not installed in this Python (run with .venv/bin/python)")
    prefix = Path(list(spec.submodule_search_locations)[0]) / "share" / "cmake"
    return version, str(prefix)


def wait_for_binaries(build_dir, wait_s):
    """The binaries and the SDK, waiting up to wait_s for a rebuild in progress. Returns the
    missing paths (empty when all are there)."""
    needed = [build_dir / "bin" / b for b in BINARIES] + [build_dir / "sdk" / "GatehouseWorkerConfig.cmake"]
    deadline = time.monotonic() + wait_s
    said = None
    while True:
        missing = [p for p in needed if not p.exists()]
        if not missing or time.monotonic() >= deadline:
            return missing
        if missing != said:
            log(f"waiting up to {wait_s} s for {', '.join(map(str, missing))} (being rebuilt?)")
            said = missing
        time.sleep(5)


# --- the checkpoint -------------------------------------------------------------------------

def checkpoint_config(tiny, model="qwen2.5-0.5b"):
    cfg = json.loads(MODELS[model]["config"].read_text())
    if tiny:
        cfg.update(MODELS[model]["tiny"])
    return cfg


def parameter_count(cfg):
    """The parameters of a dense decoder config (llama / qwen2 shapes; tied head counted once)."""
    h, inter, layers, vocab = (cfg["hidden_size"], cfg["intermediate_size"],
                               cfg["num_hidden_layers"], cfg["vocab_size"])
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or h // heads
    bias = (heads + 2 * kv) * head_dim if cfg.get("model_type") == "qwen2" else 0
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2 + bias
    per_layer = attn + 3 * h * inter + 2 * h
    return vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + layers * per_layer + h


def ensure_checkpoint(work_dir, tiny, python, env, model="qwen2.5-0.5b", dtype="float32"):
    """The random checkpoint under work_dir, made once per (config, dtype, transformers
    version): save_pretrained, or written tensor by tensor in shards above
    STREAMED_ABOVE_BYTES."""
    cfg = checkpoint_config(tiny, model)
    name = model + ("-tiny" if tiny else "") + ("" if dtype == "float32" else "-" + dtype)
    base = work_dir / "checkpoints" / name
    out = base / "checkpoint"
    stamp_file = base / "stamp.json"
    streamed = parameter_count(cfg) * CKPT_DTYPES[dtype] > STREAMED_ABOVE_BYTES
    stamp_fields = {"format": CKPT_FORMAT, "config": cfg, "init_seed": 0,
                    "transformers": importlib.metadata.version("transformers")}
    if dtype != "float32":
        stamp_fields["dtype"] = dtype
    if streamed:
        stamp_fields["writer"] = "make-sharded-checkpoint"
    stamp = json.dumps(stamp_fields, sort_keys=True)
    if out.is_dir() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        log(f"checkpoint: reusing {out}")
        return out
    how = "written tensor by tensor in shards" if streamed else "save_pretrained"
    log(f"checkpoint: making {out} (random weights, seed 0, {dtype}, {how})")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps(cfg, indent=2))
    tmp = base / "checkpoint.partial"
    peer = run_peer(python, env, ["make-sharded-checkpoint" if streamed else "make-checkpoint",
                                  "--config", str(base / "config.json"), "--out", str(tmp),
                                  "--init-seed", "0", "--dtype", dtype])
    log(f"checkpoint: {peer['parameters']:,} parameters, saved in {peer['seconds']:.1f} s")
    tmp.rename(out)
    stamp_file.write_text(stamp)
    return out


# --- REST -----------------------------------------------------------------------------------

class Api:
    """The controller's REST API with a bearer token (docs/protocols.md §1)."""

    def __init__(self, base, token):
        self.base, self.token = base.rstrip("/"), token

    def request(self, method, path, body=None, timeout=600):
        """(status, headers, bytes); HTTP errors are answers too."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers or {}), e.read()

    def get_json(self, path):
        status, _, raw = self.request("GET", path, timeout=60)
        if status != 200:
            raise BenchError(f"GET {path}: {status} {raw[:500]!r}")
        return json.loads(raw)

    def download(self, path, dest):
        req = urllib.request.Request(self.base + path)
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=600) as resp, open(dest, "wb") as f:
            shutil.copyfileobj(resp, f, 1 << 20)


def submit(api, body, timeout_s):
    """POSTs the body; when the controller answers 202 {"state": "resolving"} (it digests the
    checkpoint in the background), posts it again until the cell is there. Returns (cell,
    first answer's latency s, time until the id is known s, every answer)."""
    answers = []
    t0 = time.time()
    first_latency = None
    while True:
        t_post = time.time()
        status, headers, raw = api.request("POST", "/api/v1/cells", body)
        t_answer = time.time()
        if first_latency is None:
            first_latency = t_answer - t0
        try:
            obj = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            obj = {"raw": raw[:500].decode("utf-8", "replace")}
        answers.append({"status": status, "latency_s": t_answer - t_post,
                        "at_s": t_answer - t0, "state": obj.get("state"),
                        "created": obj.get("created"), "id": obj.get("id"),
                        "bytes_hashed": obj.get("bytes_hashed"), "bytes_total": obj.get("bytes_total")})
        progress = ""
        if obj.get("bytes_total"):
            progress = f", {obj.get('bytes_hashed', 0) / obj['bytes_total']:.0%} hashed"
        log(f"POST /api/v1/cells -> {status} after {t_answer - t_post:.2f} s"
            + (f" (state {obj['state']}{progress})" if obj.get("state") else ""))
        if status in (200, 201) and obj.get("id"):
            return obj, first_latency, t_answer - t0, answers
        if status == 202 and obj.get("id") and obj.get("state") not in (None, "resolving"):
            return obj, first_latency, t_answer - t0, answers
        if status != 202:
            if 400 <= status < 500:
                raise Refused(status, obj, answers)
            raise BenchError(f"submit refused: {status} {obj}")
        if t_answer - t0 > timeout_s:
            raise BenchError(f"submit still resolving after {timeout_s} s: {obj}")
        delay = headers.get("Retry-After") or obj.get("retry_after_s")
        if obj.get("retry_after_ms") is not None:
            delay = float(obj["retry_after_ms"]) / 1000.0
        time.sleep(min(max(float(delay or 0.5), 0.05), 10.0))


# --- the stack ------------------------------------------------------------------------------

class Stack:
    """Controller + one agent + the adapter repository, as deploy/demo.sh sets them up, under
    work_dir; stopped by close() (also after a failed start)."""

    def __init__(self, args, work_dir, build_dir, threads):
        self.args, self.work_dir, self.build_dir, self.threads = args, work_dir, build_dir, threads
        self.run_dir = work_dir / "run"
        self.agent_dir = work_dir / "agent"
        self.repo = work_dir / "adapter"
        self.logs = self.run_dir / "logs"
        self.procs = {}
        self.api = None
        self.http_port = self.grpc_port = None

    # -- setup
    def prepare(self):
        self.reused = bool(getattr(self.args, "reuse_run", False)) and (self.run_dir / "gatehouse.db").is_file()
        if self.reused:
            # The previous run's DB, tokens, mirrors and artifacts stay: a cell whose reference
            # cell passed there finds it. Its logs are kept beside this run's.
            stamp = time.strftime("%Y%m%dT%H%M%S")
            if self.logs.is_dir():
                self.logs.rename(self.run_dir / f"logs-before-{stamp}")
            self.logs.mkdir(parents=True)
            log(f"reusing {self.run_dir} (the previous run's DB and artifacts)")
        else:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.logs.mkdir(parents=True)
        # The agent's build tree and checkouts stay (later builds are incremental); the
        # previous run's attempts (reference bundles, saved checkpoints) and cache go.
        for sub in ("attempts", "artifacts"):
            shutil.rmtree(self.agent_dir / sub, ignore_errors=True)
        if self.args.fresh_build:
            shutil.rmtree(self.agent_dir / "build", ignore_errors=True)
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        self.make_adapter_repo()
        if self.reused:
            self.ci_token = (self.run_dir / "bench-ci.token").read_text().strip().splitlines()[0]
        else:
            self.make_tokens()

    def make_adapter_repo(self):
        """models/ committed to a local git repository (deploy/demo.sh, step 2); a rerun with
        the same models/ keeps the same commit."""
        repo = self.repo
        repo.mkdir(parents=True, exist_ok=True)
        if not (repo / ".git").exists():
            subprocess.run(["git", "-C", str(repo), "init", "-q", "-b", "main"], check=True)
        for entry in repo.iterdir():
            if entry.name == ".git":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        if self.args.adapter_rev:
            # models/ as committed at that revision (not the working tree's edits).
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", self.args.adapter_rev, "models"],
                                     check=True, capture_output=True).stdout
            tmp = self.work_dir / "adapter-export"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
            shutil.copytree(tmp / "models", repo, dirs_exist_ok=True, symlinks=True)
            shutil.rmtree(tmp)
        else:
            shutil.copytree(ROOT / "models", repo, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=gatehouse-bench",
                        "-c", "user.email=bench@gatehouse.invalid", "commit", "-q", "-m",
                        f"adapter {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        log(f"adapter repository {repo} at {head[:12]}")
        self.commit = head

    def controller_cmd(self):
        return [str(self.build_dir / "bin" / "gatehouse-controller"), "--db", str(self.run_dir / "gatehouse.db")]

    def make_tokens(self):
        def create(name, extra):
            p = subprocess.run(self.controller_cmd() + ["tokens", "create", "--name", name] + extra,
                               capture_output=True, text=True)
            if p.returncode != 0 or not p.stdout.strip():
                raise BenchError(f"tokens create {name} failed ({p.returncode}): {p.stderr.strip()}")
            path = self.run_dir / f"{name}.token"
            path.write_text(p.stdout)
            path.chmod(0o600)
            return p.stdout.strip().splitlines()[0]
        self.ci_token = create("bench-ci", ["--scopes", "read,submit"])
        create(AGENT_NAME, ["--kind", "agent"])

    def start(self, torch_version, torch_prefix, python):
        out = open(self.logs / "controller.out", "w")
        err = open(self.logs / "controller.log", "w")
        self.procs["controller"] = subprocess.Popen(
            self.controller_cmd() + [
                "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                "--mirror-dir", str(self.run_dir / "mirrors"),
                "--artifact-dir", str(self.run_dir / "artifacts"),
                "--web-dir", str(ROOT / "web"), "--torch-pin", torch_version],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.http_port, self.grpc_port = self.listening_ports()
        self.api = Api(f"http://127.0.0.1:{self.http_port}", self.ci_token)
        log(f"controller pid {self.procs['controller'].pid}: http {self.http_port}, grpc {self.grpc_port}")
        env = dict(os.environ)
        env.update(self.thread_env())
        # The performance phase (not requested here) would measure transformers with this Python.
        env["GATEHOUSE_PEER_PYTHON"] = python
        self.procs["agent"] = subprocess.Popen(
            [str(self.build_dir / "bin" / "gatehouse-agent"),
             "--controller", f"127.0.0.1:{self.grpc_port}", "--name", AGENT_NAME,
             "--work-dir", str(self.agent_dir), "--sdk-dir", str(self.build_dir / "sdk"),
             "--cmake-prefix-path", torch_prefix,
             "--worker", str(self.build_dir / "bin" / "gatehouse-worker"),
             "--reference-python", python, "--torch-version", torch_version,
             "--token-file", str(self.run_dir / f"{AGENT_NAME}.token")],
            stdout=open(self.logs / "agent.out", "w"), stderr=open(self.logs / "agent.log", "w"),
            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log(f"agent pid {self.procs['agent'].pid}, work dir {self.agent_dir}")
        self.wait_for_agent()

    def thread_env(self):
        n = str(self.threads)
        return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}

    def listening_ports(self, timeout_s=60):
        """The ports the controller printed ("gatehouse-controller: http listening on h:p")."""
        deadline = time.monotonic() + timeout_s
        path = self.logs / "controller.out"
        while time.monotonic() < deadline:
            self.check_alive()
            text = path.read_text() if path.exists() else ""
            http = re.search(r"http listening on [^:\s]+:(\d+)", text)
            grpc = re.search(r"grpc listening on [^:\s]+:(\d+)", text)
            if http and grpc:
                return int(http.group(1)), int(grpc.group(1))
            time.sleep(0.1)
        raise BenchError(f"the controller printed no listening ports in {timeout_s} s "
                         f"(see {self.logs}/controller.log)")

    def wait_for_agent(self, timeout_s=180):
        """Until the agent has registered (its capability probes run first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            agents = self.api.get_json("/api/v1/agents").get("agents", [])
            for a in agents:
                if a.get("name") == AGENT_NAME and a.get("state") == "connected":
                    caps = a.get("capabilities") or {}
                    log(f"agent registered: {json.dumps(caps)[:300]}")
                    self.agent_capabilities = caps
                    return
            time.sleep(0.5)
        raise BenchError(f"the agent did not register in {timeout_s} s (see {self.logs}/agent.log)")

    def check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise BenchError(f"{name} exited with code {p.returncode} (see {self.logs}/{name}.log)")

    # -- teardown
    def close(self):
        """Stops the agent (it stops its worker), then the controller; SIGKILL after a grace.
        Then any process left with its working directory in the agent's attempts."""
        for name in ("agent", "controller"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log(f"{name} did not stop in 20 s: SIGKILL")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            log(f"{name} stopped ({p.returncode})")
        attempts = (self.agent_dir / "attempts").resolve()
        for pid in leftover_pids(attempts):
            log(f"killing leftover process {pid} (working directory under {attempts})")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def leftover_pids(directory):
    """Processes whose working directory is `directory` or below (the agent's cleanup rule)."""
    found = []
    prefix = str(directory)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == prefix or cwd.startswith(prefix + "/"):
            found.append(int(entry.name))
    return found


def runner_cpu_s(attempts_dir):
    """CPU seconds (user + system, all threads) of the worker or reference runner running
    under the agent's attempts directory, or None when none runs."""
    prefix = str(attempts_dir) + "/"
    for pid in leftover_pids(attempts_dir):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not any(b"gatehouse-worker" in a or b"reference_cell.py" in a for a in cmdline[:2]):
                continue
            if not any(a.decode(errors="replace").startswith(prefix) for a in cmdline):
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return None


def phase_cpu_shares(samples, threads, min_wall_s=3.0):
    """{cell: {phase: cpu share}} from the poll loop's samples of the runner's CPU time: the
    CPU time between the first and last sample seen in a phase over that wall time x threads
    (phases shorter than min_wall_s between samples are left out)."""
    spans = {}
    for smp in samples:
        key = (smp["cell"], smp["phase"])
        first, _ = spans.get(key, (smp, smp))
        spans[key] = (first, smp)
    out = {}
    for (cell, phase), (first, last) in spans.items():
        wall = last["t"] - first["t"]
        if wall >= min_wall_s:
            out.setdefault(cell, {})[phase] = (last["cpu_s"] - first["cpu_s"]) / (wall * threads)
    return out


# --- the cell -------------------------------------------------------------------------------

def memory_estimates(api, cell_id, ref_id):
    """{"validation": memory_estimate, "reference": memory_estimate} as GET answers now (the
    controller computes it at each GET: once an attempt has ended, its measured peak changes
    later answers, so this is read right after the submit)."""
    out = {}
    for kind, cid in (("validation", cell_id), ("reference", ref_id)):
        if cid:
            out[kind] = stack_get(api, cid).get("memory_estimate")
    return out


def stack_get(api, cell_id):
    return api.get_json(f"/api/v1/cells/{cell_id}")


def estimate_of(estimate, role):
    """(host bytes per process, count, basis) of `role` in a memory_estimate, or Nones."""
    for p in (estimate or {}).get("processes") or []:
        if p.get("role") == role:
            return p.get("host_bytes"), p.get("count"), p.get("basis")
    return None, None, None


def run_cell(stack, checkpoint, timeout_s, poll_s, family="qwen2", precision="fp32",
             submit_only=False, phases=None):
    """Submits the validation cell (phases: PHASES unless given), waits for both cells; returns
    what was measured. With submit_only: reads the memory estimates and cancels both cells
    instead of waiting."""
    body = {"repository": str(stack.repo), "branch": "main", "model_family": family,
            "checkpoint": str(checkpoint), "phases": phases or PHASES}
    if precision != "fp32":
        body["precision"] = precision
    t_submit = time.time()
    cell, latency, id_after, answers = submit(stack.api, body, timeout_s=600)
    cell_id = cell["id"]
    ref = (cell.get("spec") or {}).get("reference") or {}
    ref_id = ref.get("cell") if isinstance(ref, dict) else None
    log(f"validation cell {cell_id[:12]} ({'created' if cell.get('created') else 'existing'}), "
        f"reference cell {ref_id[:12] if ref_id else '(none)'}")
    if not cell.get("created", True):
        log("warning: the cell already existed: nothing new runs (is the DB fresh?)")
    estimates = memory_estimates(stack.api, cell_id, ref_id)
    for kind, est in estimates.items():
        log(f"memory estimate, {kind} cell: {(est or {}).get('summary', 'none')}")
    if submit_only:
        docs = {}
        for kind, cid in (("validation", cell_id), ("reference", ref_id)):
            if not cid:
                continue
            status, _, raw = stack.api.request("POST", f"/api/v1/cells/{cid}/cancel",
                                               {"reason": "real_size.py --submit-only"})
            log(f"cancel {kind} cell {cid[:12]}: {status}")
            docs[kind] = stack_get(stack.api, cid)
        return {"cell_id": cell_id, "reference_cell_id": ref_id, "submit_body": body,
                "t_submit": t_submit, "submit_latency_s": latency, "id_known_s": id_after,
                "submit_answers": answers, "memory_estimates_at_submit": estimates,
                "validation": docs.get("validation"), "reference": docs.get("reference"),
                "submit_only": True}
    timeline = []
    cpu_samples = []  # the runner's CPU time at each poll, for the phases' CPU share
    attempts_dir = stack.agent_dir.resolve() / "attempts"
    last = {}
    deadline = time.monotonic() + timeout_s
    while True:
        stack.check_alive()
        now = time.time()
        watched = [("validation", cell_id)] + ([("reference", ref_id)] if ref_id else [])
        docs = {}
        for kind, cid in watched:
            doc = stack.api.get_json(f"/api/v1/cells/{cid}")
            docs[kind] = doc
            running = next((p["phase"] for p in doc.get("phases", []) if p.get("status") == "RUNNING"), None)
            state = (doc.get("status"), running)
            if last.get(kind) != state:
                last[kind] = state
                timeline.append({"at_s": now - t_submit, "cell": kind, "status": state[0], "phase": state[1]})
                log(f"{now - t_submit:7.1f} s  {kind} cell: {state[0]}" + (f", phase {running}" if running else ""))
            if running:
                cpu = runner_cpu_s(attempts_dir)
                if cpu is not None:
                    cpu_samples.append({"cell": kind, "phase": running, "t": time.time(), "cpu_s": cpu})
        if docs["validation"].get("status") in TERMINAL:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"no verdict after {timeout_s} s (cells keep running until stopped)")
        time.sleep(poll_s)
    return {"cell_id": cell_id, "reference_cell_id": ref_id, "submit_body": body,
            "t_submit": t_submit, "submit_latency_s": latency, "id_known_s": id_after,
            "submit_answers": answers, "timeline": timeline, "cpu_samples": cpu_samples,
            "memory_estimates_at_submit": estimates,
            "validation": docs["validation"], "reference": docs.get("reference")}


def phase_map(doc):
    return {p["phase"]: p for p in (doc or {}).get("phases", [])}


def figure(phase, name):
    for f in (phase or {}).get("figures", []):
        if f.get("name") == name:
            return f.get("value")
    return None


def rss_figures(phase):
    """Every numeric figure whose name contains "rss" (e.g. peak_rss_bytes)."""
    return {f["name"]: f["value"] for f in (phase or {}).get("figures", [])
            if "rss" in f.get("name", "") and isinstance(f.get("value"), (int, float))}


def max_rss(phases, names):
    values = [v for n in names for v in rss_figures(phases.get(n)).values()]
    return max(values) if values else None


def attempt_times(doc):
    """(attempt, created, started, ended) of the latest attempt, Unix seconds (started: its
    first phase)."""
    attempts = (doc or {}).get("attempts") or []
    if not attempts:
        return None, None, None, None
    a = attempts[-1]
    return a, parse_utc(a.get("created_at")), parse_utc(a.get("started_at")), parse_utc(a.get("ended_at"))


AGENT_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] \[[^\]]*\] \[\d+\] "
                            r"attempt (\d+): (start|checked out)")


def agent_log_times(path, attempt_id):
    """From the agent's log (local time): when the attempt started and when its checkout was
    done (the build starts right after)."""
    out = {}
    if not path.exists():
        return out
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for line in path.read_text(errors="replace").splitlines():
        m = AGENT_LOG_LINE.match(ansi.sub("", line))
        if m and int(m.group(2)) == attempt_id:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
            out.setdefault(m.group(3), t)
    return out


def build_facts(stack, cell):
    """The plugin build of the validation attempt: from its checkout (agent log) to its first
    phase (the attempt's started_at: the worker has started and loaded the plugin)."""
    attempt, _, started, ended = attempt_times(cell["validation"])
    facts = {"build_s": None, "fetch_and_checkout_s": None, "ninja_no_work": None}
    if attempt is None:
        return facts
    times = agent_log_times(stack.logs / "agent.log", attempt["id"])
    if "checked out" in times and started:
        facts["build_s"] = started - times["checked out"]
    elif "checked out" in times and ended:
        facts["build_s"] = ended - times["checked out"]  # no phase started: the build failed
        facts["build_failed"] = True
    if "start" in times and "checked out" in times:
        facts["fetch_and_checkout_s"] = times["checked out"] - times["start"]
    status, _, raw = stack.api.request("GET", f"/api/v1/cells/{cell['cell_id']}/log?stream=build")
    if status == 200:
        (stack.logs / "build.log").write_bytes(raw)
        text = raw.decode("utf-8", "replace")
        facts["ninja_no_work"] = "no work to do" in text
        facts["compiled_objects"] = len(re.findall(r"Building CXX object", text))
        facts["linked"] = "Linking CXX shared library" in text
    return facts


def download_bundle(stack, cell, dest):
    """The reference cell's bundle (reference.json, reference.safetensors) from the artifact API."""
    ref = cell.get("reference")
    if not ref or ref.get("status") != "passed":
        return None
    dest.mkdir(parents=True, exist_ok=True)
    got = 0
    for art in ref.get("artifacts", []):
        name = art.get("name", "")
        if name.startswith("reference/"):
            stack.api.download(f"/api/v1/artifacts/{art['digest']}", dest / name.split("/", 1)[1])
            got += 1
    return dest if got >= 2 else None


# --- the transformers peer ------------------------------------------------------------------

def run_peer(python, env, argv, timeout_s=7200):
    cmd = [python, str(HERE / "real_size_peer.py")] + argv
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-5000:])
        raise BenchError(f"peer failed ({p.returncode}): {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_peers(python, env, checkpoint, bundle, lengths, training, threads, attn, dtype="float32",
              max_new_tokens=None, phases_run=()):
    """The transformers side, one process per measurement. decode, packing and logprob (the
    gates' same work, phase_accounting.py) need the bundle and run for the phases the cell ran."""
    common = ["--checkpoint", str(checkpoint), "--threads", str(threads), "--attn", attn,
              "--dtype", dtype]
    prompts = ["--bundle", str(bundle)] if bundle else ["--lengths", ",".join(map(str, lengths))]
    modes = [("load", []), ("forward", prompts),
             ("train", prompts + ["--steps", str(training["steps"]), "--lr", repr(training["lr"]),
                                  "--seed", str(training["seed"])])]
    if bundle:
        decoding = prompts + ["--max-new-tokens", str(max_new_tokens)] if max_new_tokens else None
        for phase, mode, extra in (("decode", "decode", decoding), ("packing", "packing", prompts),
                                   ("logprob_parity", "logprob",
                                    decoding and decoding + ["--seed", str(training["seed"])])):
            if phase in phases_run and extra is not None:
                modes.append((mode, extra))
    out = {}
    for mode, extra in modes:
        log(f"transformers: {mode} ({attn}, {dtype}, {threads} threads)")
        out[mode] = run_peer(python, env, [mode] + common + extra)
    return out


# --- the report -----------------------------------------------------------------------------

def summarize_status(cell):
    """{phase: status} of the validation cell."""
    vp = phase_map(cell["validation"])
    return {n: (vp.get(n) or {}).get("status") for n in PHASES}


def summarize(cell, build, peers, ckpt_bytes, threads):
    """Every figure of the table, and the targets (None where a figure is missing)."""
    v_doc, r_doc = cell["validation"], cell.get("reference")
    vp, rp = phase_map(v_doc), phase_map(r_doc)

    def dur(phases, name):
        d = (phases.get(name) or {}).get("duration_ms")
        return d / 1000.0 if d is not None else None

    _, _, r_started, r_ended = attempt_times(r_doc)
    _, _, v_started, v_ended = attempt_times(v_doc)
    s = {"status": v_doc.get("status"), "reference_status": (r_doc or {}).get("status"),
         "submit_latency_s": cell["submit_latency_s"], "digest_s": cell["id_known_s"],
         "submit_answers": cell["submit_answers"],
         "reference_attempt_s": (r_ended - r_started) if r_started and r_ended else None,
         "reference_until_passed_s": (r_ended - cell["t_submit"]) if r_ended else None,
         "reference_phases_s": {n: dur(rp, n) for n in rp},
         "reference_peak_rss_bytes": figure(rp.get("reference"), "peak_rss_bytes"),
         # The reference runner's stages (forwards, training traces, envelope): stage_<name>_ms
         # and the process's cumulative peak as each ended, stage_<name>_peak_rss_bytes.
         "reference_stages": {f["name"][len("stage_"):]: f.get("value")
                              for f in (rp.get("reference") or {}).get("figures", [])
                              if f.get("name", "").startswith("stage_")},
         "build_s": build.get("build_s"), "fetch_and_checkout_s": build.get("fetch_and_checkout_s"),
         "phases_s": {n: dur(vp, n) for n in PHASES},
         "phases_status": summarize_status(cell),
         "phases_rss": {n: rss_figures(vp.get(n)) for n in PHASES},
         "time_to_verdict_s": (v_ended - cell["t_submit"]) if v_ended else None,
         "validation_attempt_s": (v_ended - v_started) if v_started and v_ended else None,
         "checkpoint_bytes": ckpt_bytes}
    c, l = s["phases_s"].get("construct"), s["phases_s"].get("load")
    s["construct_load_s"] = c + l if c is not None and l is not None else None
    s["bytes_adopted"] = figure(vp.get("load"), "bytes_adopted")
    for name in ("forward_ms", "comparison_ms"):
        v = figure(vp.get("inference"), name)
        s["inference_" + name[:-3] + "_s"] = v / 1000.0 if isinstance(v, (int, float)) else None
    check_ms = figure(vp.get("load"), "finite_check_ms")
    s["finite_check_s"] = check_ms / 1000.0 if isinstance(check_ms, (int, float)) else None
    s["train_step_ms"] = figure(vp.get("training"), "step_ms")
    s["losses"] = [figure(vp.get("training"), f"loss_step_{k}") for k in range(1, 1001)
                   if figure(vp.get("training"), f"loss_step_{k}") is not None]
    s["cpu_share"] = phase_cpu_shares(cell.get("cpu_samples") or [], threads)
    s["peak_rss_load_bytes"] = max_rss(vp, ["construct", "load"])
    s["peak_rss_cell_bytes"] = max_rss(vp, PHASES)
    # The controller's estimate per process (as GET answered right after the submit) against
    # the measured peaks: the reference phase's peak_rss_bytes, the worker's largest
    # peak_rss_bytes over the validation phases.
    est = cell.get("memory_estimates_at_submit") or {}
    ref_est, _, ref_basis = estimate_of(est.get("reference"), "reference runner")
    worker_est, worker_count, worker_basis = estimate_of(est.get("validation"), "worker rank")
    worker_peaks = [figure(vp.get(n), "peak_rss_bytes") for n in PHASES]
    worker_peaks = [v for v in worker_peaks if isinstance(v, (int, float))]
    s["memory"] = {
        "reference_runner": {"estimate_bytes": ref_est, "basis": ref_basis,
                             "peak_rss_bytes": s["reference_peak_rss_bytes"],
                             "ratio": ratio(s["reference_peak_rss_bytes"], ref_est)},
        "worker_rank": {"estimate_bytes": worker_est, "count": worker_count, "basis": worker_basis,
                        "peak_rss_bytes": max(worker_peaks) if worker_peaks else None,
                        "peak_phase": max(((figure(vp.get(n), "peak_rss_bytes") or 0, n) for n in PHASES),
                                          default=(None, None))[1] if worker_peaks else None,
                        "ratio": ratio(max(worker_peaks) if worker_peaks else None, worker_est)},
        "estimate_summary": {k: (v or {}).get("summary") for k, v in est.items()},
    }
    s["reference_reused"] = bool(r_ended and r_ended < cell["t_submit"])
    if peers:
        s["hf_from_pretrained_s"] = peers["load"]["from_pretrained_s"]
        s["hf_import_s"] = peers["load"]["import_s"]
        s["hf_touch_s"] = peers["load"].get("touch_s")
        s["hf_peak_rss_after_touch_bytes"] = peers["load"].get("peak_rss_after_touch_bytes")
        s["hf_forward_s"] = peers["forward"]["forward_cold_s"]
        s["hf_forward_warm_s"] = peers["forward"]["forward_warm_s"]
        s["hf_forward_cpu_share"] = peers["forward"].get("forward_cold_cpu_share")
        s["hf_train_cpu_share"] = peers["train"].get("train_cpu_share")
        s["hf_comparison_s"] = peers["forward"]["comparison_cost_s"]
        s["hf_bundle_read_s"] = peers["forward"]["bundle_read_s"]
        s["hf_compare_s"] = peers["forward"]["compare_s"]
        s["hf_train_s"] = peers["train"]["train_s"]
        s["hf_train_step_ms"] = 1000.0 * peers["train"]["step_mean_s"]
        s["hf_losses"] = peers["train"]["losses"]
        s["hf_peak_rss_load_bytes"] = peers["load"]["peak_rss_bytes"]
        s["hf_peak_rss_forward_bytes"] = peers["forward"]["peak_rss_after_forwards_bytes"]
        s["hf_peak_rss_train_bytes"] = peers["train"]["peak_rss_bytes"]
        s["hf_peak_rss_bytes"] = max(s["hf_peak_rss_load_bytes"], s["hf_peak_rss_forward_bytes"],
                                     s["hf_peak_rss_train_bytes"])
        s["hf_rss_baseline_bytes"] = peers["load"]["peak_rss_before_load_bytes"]
    # Each phase against transformers' same work, its parts side by side (phase_accounting.py).
    s["accounting"] = {}
    for phase in ("decode", "packing", "logprob_parity", "training"):
        mode = phase_accounting.PARTS[phase][0]
        acc = phase_accounting.account(phase, vp.get(phase), (peers or {}).get(mode))
        if acc is not None:
            s["accounting"][phase] = acc
    inf = s["phases_s"].get("inference")
    budget = (INFERENCE_FACTOR * s["hf_forward_s"] + s["hf_comparison_s"]) if peers else None
    s["inference_budget_s"] = budget

    def target(name, value, limit, text):
        met = None if value is None or limit is None else value <= limit
        return {"name": name, "value": value, "limit": limit, "rule": text, "met": met}

    s["targets"] = [
        target("construct + load <= from_pretrained", s["construct_load_s"],
               s.get("hf_from_pretrained_s"), "construct + load time <= transformers' from_pretrained time"),
        target("inference gate <= 1.2x forwards + comparison", inf, budget,
               f"inference gate <= {INFERENCE_FACTOR}x transformers' forwards + the comparison's cost"),
        target("peak RSS during load <= 1.2x checkpoint", s["peak_rss_load_bytes"],
               LOAD_RSS_FACTOR * ckpt_bytes, f"peak RSS during load <= {LOAD_RSS_FACTOR}x the checkpoint's bytes"),
        target("whole cell's peak RSS <= 4.5x checkpoint", s["peak_rss_cell_bytes"],
               CELL_RSS_FACTOR * ckpt_bytes, f"the whole cell's peak RSS <= {CELL_RSS_FACTOR}x the checkpoint's bytes"),
    ]
    return s


def print_table(s, meta):
    """The table (measure, both sides, ratio, target, verdict, note), then the phases."""
    g = s.get
    ck = s["checkpoint_bytes"]
    ph = s["phases_s"]
    rows = []

    def row(what, ours, theirs="", rat="", target="", verdict="", note=""):
        rows.append((what, ours, theirs, rat, target, verdict, note))

    def verdict(i):
        met = s["targets"][i]["met"]
        return "n/a" if met is None else ("met" if met else "NOT met")

    def ms(v):
        return "n/a" if v is None else (f"{v:.0f} ms" if v < 10000 else fmt_s(v / 1000.0))

    def fmt_share(v):
        return "n/a" if v is None else f"{v:.2f}"

    def share(cell, phase):
        return fmt_share((s.get("cpu_share") or {}).get(cell, {}).get(phase))

    def phase_s(name):
        status = s["phases_status"].get(name)
        return status.lower() if status in ("SKIPPED", None) else fmt_s(ph.get(name))

    row("submit latency (first answer)", fmt_s(g("submit_latency_s")))
    row("digest time (until the cell id)", fmt_s(g("digest_s")),
        note=f"{len(g('submit_answers') or [])} POST(s)")
    ref_phases = ", ".join(f"{k} {fmt_s(v)}" for k, v in s["reference_phases_s"].items() if v is not None)
    row("reference time (attempt)", fmt_s(g("reference_attempt_s")), note=ref_phases)
    row("reference runner peak RSS", fmt_bytes(g("reference_peak_rss_bytes")),
        rat=fmt_x(ratio(g("reference_peak_rss_bytes"), ck)) + " ckpt",
        note="the reference cell passed in an earlier run (--reuse-run): its figures are that run's"
        if g("reference_reused") else "")
    mem = g("memory") or {}
    for key, what in (("reference_runner", "reference runner"), ("worker_rank", "worker rank")):
        m = mem.get(key) or {}
        where = f", largest in {m['peak_phase']}" if m.get("peak_phase") else ""
        row(f"{what}: peak vs estimate", fmt_bytes(m.get("peak_rss_bytes")), "",
            fmt_x(m.get("ratio")) + " est",
            note=f"controller's estimate {fmt_bytes(m.get('estimate_bytes'))} ({m.get('basis') or 'n/a'}){where}")
    build_note = ""
    if meta.get("build_failed"):
        build_note = "build FAILED (see the build log)"
    elif g("build_s") is not None and meta.get("ninja_no_work") is not None:
        build_note = ("plugin up to date" if meta["ninja_no_work"]
                      else f"{meta.get('compiled_objects', 0)} objects compiled"
                      + (", relinked" if meta.get("linked") else ""))
    if g("fetch_and_checkout_s") is not None:
        build_note += f"; before it: bundle fetch + checkout {fmt_s(g('fetch_and_checkout_s'))}"
    row("build time (plugin)", fmt_s(g("build_s")), note=build_note)
    row("construct + load vs from_pretrained", fmt_s(g("construct_load_s")), fmt_s(g("hf_from_pretrained_s")),
        fmt_x(ratio(g("construct_load_s"), g("hf_from_pretrained_s"))), "<= 1.00x", verdict(0),
        f"construct {fmt_s(ph.get('construct'))}, load {fmt_s(ph.get('load'))}, of it the "
        f"finiteness read {fmt_s(g('finite_check_s'))}; {fmt_bytes(g('bytes_adopted'))} adopted "
        f"from the mapped file; transformers maps the file and reads no weight")
    # Like for like: the load gate reads every weight once (its finiteness check, one sum per
    # tensor), which from_pretrained leaves to the first forward; the peer's p.sum() per
    # parameter is that same read.
    read_all = (g("hf_from_pretrained_s") + g("hf_touch_s")
                if g("hf_from_pretrained_s") is not None and g("hf_touch_s") is not None else None)
    row("  ... vs from_pretrained + one read", fmt_s(g("construct_load_s")), fmt_s(read_all),
        fmt_x(ratio(g("construct_load_s"), read_all)),
        note="both read every weight once: our finiteness check, transformers' p.sum() per parameter")
    row("inference gate vs forwards", phase_s("inference"), fmt_s(g("hf_forward_s")),
        fmt_x(ratio(ph.get("inference"), g("hf_forward_s"))),
        f"<= {fmt_s(g('inference_budget_s'))}", verdict(1),
        f"budget 1.2 x forwards + comparison {fmt_s(g('hf_comparison_s'))}; of the gate: forwards "
        f"{fmt_s(g('inference_forward_s'))}, comparison {fmt_s(g('inference_comparison_s'))}; "
        f"cpu share {share('validation', 'inference')} vs {fmt_share(g('hf_forward_cpu_share'))}")
    row("decode gate", phase_s("decode"))
    row("training gate vs transformers' steps", phase_s("training"), fmt_s(g("hf_train_s")),
        fmt_x(ratio(ph.get("training"), g("hf_train_s"))),
        note=f"mean step {ms(g('train_step_ms'))} vs {ms(g('hf_train_step_ms'))} "
             f"({fmt_x(ratio(g('train_step_ms'), g('hf_train_step_ms')))}); "
             f"cpu share {share('validation', 'training')} vs {fmt_share(g('hf_train_cpu_share'))}")
    row("save gate", phase_s("save"))
    row("peak RSS during load", fmt_bytes(g("peak_rss_load_bytes")), fmt_bytes(g("hf_peak_rss_load_bytes")),
        fmt_x(ratio(g("peak_rss_load_bytes"), ck)) + " ckpt", f"<= {fmt_x(LOAD_RSS_FACTOR)} ckpt", verdict(2),
        f"transformers {fmt_x(ratio(g('hf_peak_rss_load_bytes'), ck))} ckpt, "
        f"{fmt_bytes(g('hf_peak_rss_after_touch_bytes'))} "
        f"({fmt_x(ratio(g('hf_peak_rss_after_touch_bytes'), ck))}) once every weight is read")
    row("peak RSS whole cell", fmt_bytes(g("peak_rss_cell_bytes")), fmt_bytes(g("hf_peak_rss_bytes")),
        fmt_x(ratio(g("peak_rss_cell_bytes"), ck)) + " ckpt", f"<= {fmt_x(CELL_RSS_FACTOR)} ckpt", verdict(3),
        f"transformers {fmt_x(ratio(g('hf_peak_rss_bytes'), ck))} ckpt (max of load, forwards, training)")
    ttv, build = g("time_to_verdict_s"), g("build_s")
    row("time to verdict (submit -> ended)", fmt_s(ttv),
        note=f"{fmt_s(ttv - build)} without the build" if ttv is not None and build is not None else "")

    head = ("measure", "gatehouse", "transformers", "ratio", "target", "", "note")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    print("\n".join([lines[0], "-" * len(max(lines, key=len))] + lines[1:]))
    print(f"\ncheckpoint: {fmt_bytes(ck)} ({ck} bytes); transformers' RSS before from_pretrained "
          f"(torch + transformers imported): {fmt_bytes(g('hf_rss_baseline_bytes'))}")

    print("\nvalidation phases (duration, status, RSS figures):")
    for name in PHASES:
        rss = s["phases_rss"].get(name) or {}
        rss_text = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rss.items()) or "rss n/a"
        cpu = share("validation", name)
        cpu_text = f", cpu share {cpu}" if cpu != "n/a" else ""
        print(f"  {name:<10} {fmt_s(ph.get(name)):>10}  {str(s['phases_status'].get(name)):<8} {rss_text}{cpu_text}")
    print(f"  reference cell: {ref_phases}; runner peak RSS {fmt_bytes(g('reference_peak_rss_bytes'))}, "
          f"cpu share of its reference phase {share('reference', 'reference')}")
    stages = g("reference_stages") or {}
    names = [k[:-len("_ms")] for k in stages if k.endswith("_ms")]
    if names:
        print("  reference stages: " + ", ".join(
            f"{n} {fmt_s(stages[n + '_ms'] / 1000.0)} (peak {fmt_bytes(stages.get(n + '_peak_rss_bytes'))})"
            for n in names if isinstance(stages.get(n + "_ms"), (int, float))))
    print("  (cpu share: CPU time over wall time x threads; about 1 when undisturbed, lower when "
          "other processes took the cores)")
    if s.get("losses") and s.get("hf_losses"):
        print(f"\ntraining losses: gatehouse {s['losses']}  transformers {s['hf_losses']}")
    print_accounting(s.get("accounting") or {})


def print_accounting(accounting):
    """Each accounted phase: ours against transformers' same work, part by part, and the why of
    a phase above phase_accounting.LIMIT."""
    if not accounting:
        return
    print(f"\nphases against transformers' same work (parts timed on both sides; a why above "
          f"{phase_accounting.LIMIT:.1f}x):")
    for name, a in accounting.items():
        r = f"{a['ratio']:.2f}x" if a["ratio"] is not None else "n/a"
        share = a.get("peer_cpu_share")
        print(f"  {name}: {fmt_s(a['ours_s'])} vs {fmt_s(a['theirs_s'])} ({r})"
              + (f", transformers' cpu share {share:.2f}" if isinstance(share, (int, float)) else ""))
        for p in a["parts"]:
            theirs = fmt_s(p["theirs_s"]) if p["theirs_s"] is not None else ("n/a" if p["both"] else "-")
            print(f"    {p['label']:<58} {fmt_s(p['ours_s']):>10} {theirs:>10}")
        print(f"    {'other (untimed)':<58} {fmt_s(a['other_s']):>10}")
        if a["why"]:
            print(f"    why: {a['why']}")


# --- main -----------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(ROOT / "build"), help="build tree (bin/, sdk/)")
    ap.add_argument("--work-dir", default=str(ROOT / "var" / "bench-real"),
                    help="checkpoint cache, agent work dir (kept), this run's DB and logs")
    ap.add_argument("--checkpoint", help="use this HF checkpoint directory instead of making one")
    ap.add_argument("--tiny", action="store_true", help="the model's config scaled down (hidden 64, 2 layers, vocab 256): a smoke run")
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b",
                    help="the published config the checkpoint is made from, and its adapter family (default qwen2.5-0.5b)")
    ap.add_argument("--checkpoint-dtype", choices=sorted(CKPT_DTYPES), default="float32",
                    help="the dtype the made checkpoint is saved in (default float32)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="the validation cell's precision; transformers' side runs in the same dtype (default fp32)")
    ap.add_argument("--stop-if-refused", action="store_true",
                    help=f"when the controller refuses the submit (e.g. memory admission's 400), print its answer and exit {REFUSED_RETURN_CODE}")
    ap.add_argument("--submit-only", action="store_true",
                    help="submit, read the memory estimates, cancel the cells; nothing runs")
    ap.add_argument("--phases", metavar="LIST",
                    help="comma-separated validation phases (default: all of them; run in their "
                         "usual order); another list is another cell, with the same reference cell")
    ap.add_argument("--reuse-run", action="store_true",
                    help="keep <work-dir>/run (DB, artifacts) of the previous run: a passed reference cell there is reused")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of every process (OMP_NUM_THREADS, torch.set_num_threads); default: the CPU count")
    ap.add_argument("--peer-attn", choices=["sdpa", "eager"], default="sdpa",
                    help="transformers' attention for its side (sdpa: its default)")
    ap.add_argument("--timeout-s", type=int, default=3 * 3600, help="give up waiting for the verdict")
    ap.add_argument("--poll-s", type=float, default=1.0, help="cell poll interval")
    ap.add_argument("--fresh-build", action="store_true",
                    help="drop the agent's plugin build tree first (ccache still applies)")
    ap.add_argument("--adapter-rev", metavar="REV",
                    help="take models/ as committed at this git revision (default: the working tree, as deploy/demo.sh)")
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers side")
    ap.add_argument("--keep-attempts", action="store_true",
                    help="keep the agent's attempt directories (bundle copies, saved checkpoint) after a pass")
    ap.add_argument("--skip-missing", action="store_true",
                    help=f"exit {SKIP_RETURN_CODE} (skip) when the binaries are missing, after --wait-binaries-s")
    ap.add_argument("--wait-binaries-s", type=int, default=120,
                    help="how long to wait for binaries being rebuilt")
    ap.add_argument("--json", help="write every measured figure here")
    args = ap.parse_args(argv)
    if args.checkpoint and args.tiny:
        ap.error("--checkpoint and --tiny exclude each other")
    phases = None
    if args.phases:
        phases = [x.strip() for x in args.phases.split(",") if x.strip()]
        unknown = [x for x in phases if x not in PHASES]
        if unknown or not phases:
            ap.error(f"--phases {args.phases!r}: unknown {unknown}; known: {','.join(PHASES)}")
        phases = [x for x in PHASES if x in phases]  # the runner's order, each once

    build_dir = Path(args.build_dir).resolve()
    work_dir = Path(args.work_dir).resolve()
    missing = wait_for_binaries(build_dir, args.wait_binaries_s)
    if missing:
        msg = "missing: " + ", ".join(map(str, missing)) + " (build them with deploy/setup.sh)"
        if args.skip_missing:
            print(f"SKIP: {msg}")
            return SKIP_RETURN_CODE
        log(msg)
        return 2
    python = sys.executable
    torch_version, torch_prefix = torch_facts()
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)})
    work_dir.mkdir(parents=True, exist_ok=True)

    # SIGTERM stops like Ctrl-C: the finally below stops the controller and agent.
    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    load_before = os.getloadavg()
    stack = None
    result = {"args": vars(args), "threads": args.threads, "torch": torch_version,
              "transformers": importlib.metadata.version("transformers"),
              "cpu_count": os.cpu_count(), "loadavg_before": load_before}
    try:
        if args.checkpoint:
            checkpoint = Path(args.checkpoint).resolve()
            if not (checkpoint / "config.json").is_file():
                raise BenchError(f"--checkpoint {checkpoint}: no config.json")
        else:
            checkpoint = ensure_checkpoint(work_dir, args.tiny, python, env, args.model,
                                           args.checkpoint_dtype)
        ckpt_bytes = dir_bytes(checkpoint)
        log(f"checkpoint {checkpoint}: {fmt_bytes(ckpt_bytes)} of safetensors; {args.threads} threads")
        result.update({"checkpoint": str(checkpoint), "checkpoint_bytes": ckpt_bytes})

        stack = Stack(args, work_dir, build_dir, args.threads)
        stack.prepare()
        stack.start(torch_version, torch_prefix, python)
        family = MODELS[args.model]["family"]
        result.update({"model": args.model, "family": family, "precision": args.precision,
                       "checkpoint_config": json.loads((checkpoint / "config.json").read_text())})
        cell = run_cell(stack, checkpoint, args.timeout_s, args.poll_s, family, args.precision,
                        submit_only=args.submit_only, phases=phases)
        if args.submit_only:
            stack.close()
            result["cell"] = cell
            print(f"\nsubmitted and cancelled (--submit-only): validation cell {cell['cell_id'][:12]}, "
                  f"reference cell {(cell['reference_cell_id'] or '')[:12]}")
            for kind, est in (cell.get("memory_estimates_at_submit") or {}).items():
                print(f"  memory estimate, {kind} cell: {(est or {}).get('summary', 'none')}")
            return 0
        build = build_facts(stack, cell)
        bundle = download_bundle(stack, cell, stack.run_dir / "bundle")
        status, _, report = stack.api.request("GET", f"/api/v1/cells/{cell['cell_id']}/report")
        if status == 200:
            (stack.run_dir / "report.md").write_bytes(report)
        stack.close()
        result.update({"cell": cell, "build": build,
                       "bundle": str(bundle) if bundle else None,
                       "agent_capabilities": getattr(stack, "agent_capabilities", None)})

        peers = None
        if not args.no_peer:
            lengths = [figure(phase_map(cell.get("reference")).get("reference"), f"prompt_{i}_length")
                       for i in range(16)]
            lengths = [n for n in lengths if n] or [7, 33, 300]
            training = cell["validation"]["spec"].get("training") or {"steps": 2, "lr": 1e-3, "seed": 1234}
            decode = cell["validation"]["spec"].get("decode") or {}
            ran = {n for n, st in summarize_status(cell).items() if st not in (None, "SKIPPED")}
            peers = run_peers(python, env, checkpoint, bundle, lengths, training, args.threads,
                              args.peer_attn, "bfloat16" if args.precision == "bf16" else "float32",
                              max_new_tokens=decode.get("max_new_tokens"), phases_run=ran)
        result["peers"] = peers
        summary = summarize(cell, build, peers, ckpt_bytes, args.threads)
        result["summary"] = summary
        result["loadavg_after"] = os.getloadavg()

        label = MODELS[args.model]["label"]
        print(f"\nReal-size benchmark: {family} {label + ' (tiny)' if args.tiny else label}, checkpoint "
              f"{checkpoint_dtype_of(checkpoint)}, cell precision {args.precision} on the CPU, "
              f"{args.threads} threads on every side ({os.cpu_count()} CPUs; load average "
              f"{load_before[0]:.2f} before, {result['loadavg_after'][0]:.2f} after)")
        print(f"checkpoint {checkpoint} ({fmt_bytes(ckpt_bytes)}); validation cell {cell['cell_id'][:12]} "
              f"{summary['status']}, reference cell {(cell['reference_cell_id'] or '')[:12]} "
              f"{summary['reference_status']}; transformers side: {args.peer_attn} attention\n")
        print_table(summary, build)
        if not args.keep_attempts and summary["status"] == "passed":
            shutil.rmtree(stack.agent_dir / "attempts", ignore_errors=True)
        ok = summary["status"] == "passed"
        if not ok:
            v = cell["validation"]
            reason = ((v.get("attempts") or [{}])[-1]).get("reason", "")
            print(f"\nthe validation cell ended {summary['status']}: {reason} "
                  f"(logs: {stack.logs}, report: {stack.run_dir / 'report.md'})")
        return 0 if ok else 1
    except Refused as e:
        log(f"error: {e}")
        result["error"] = str(e)
        result["refused"] = {"status": e.status, "answer": e.answer, "answers": e.answers}
        if args.stop_if_refused:
            print(f"\nthe controller refused the cell: HTTP {e.status}\n  {e.answer.get('error', e.answer)}")
            return REFUSED_RETURN_CODE
        return 1
    except BenchError as e:
        log(f"error: {e}")
        result["error"] = str(e)
        return 1
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}): stopping")
        result["error"] = "interrupted"
        return 130
    finally:
        if stack is not None:
            stack.close()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
